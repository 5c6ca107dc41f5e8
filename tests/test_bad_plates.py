"""Bad input: each one a clear error naming the file, the frame and the reason.

Where a bad frame sits in a sequence, the other frames must still come through iter_frames.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from storage.errors import FrameError, SequenceError
from storage.frame import Frame
from storage.location import Location
from storage.plate_reader import NONFINITE_ATTRIBUTE, read_plate_frame
from storage.sequences import discover_sequence, iter_frames
from tasks.colour import ColourConversion
from tests.plates import exr_bytes, frame_pixels, ramp, write_exr, write_image, write_sequence

FRAMES = [1001, 1002, 1003, 1004]
BAD = 1002


def _truncated(path: Path) -> None:
    data = exr_bytes(ramp(32, 32, 3))
    path.write_bytes(data[: len(data) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(2048))


def _magic_then_garbage(path: Path) -> None:
    path.write_bytes(b"\x76\x2f\x31\x01" + np.random.default_rng(1).bytes(2048))


def _text(path: Path) -> None:
    path.write_text("this is a text file, not an image\n" * 20)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _luminance_only(path: Path) -> None:
    write_exr(path, channels={"Y": np.ones((6, 8), np.float32)})


def _nan_and_inf(path: Path) -> None:
    pixels = frame_pixels(BAD)
    pixels[0, 0, 0] = np.nan
    pixels[1, 2, 1] = np.nan
    pixels[1, 2, 2] = np.inf  # same pixel as the NaN above: counted once
    pixels[3, 4, 2] = -np.inf
    write_exr(path, pixels)


def _wrong_size(path: Path) -> None:
    write_exr(path, frame_pixels(BAD, size=(6, 10)))


BAD_FRAMES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncated, r"truncated or corrupt OpenEXR: the header is readable"),
    "garbage": (_garbage, r"corrupt OpenEXR: the file does not start with the EXR magic"),
    "magic_then_garbage": (_magic_then_garbage, r"corrupt OpenEXR: the header cannot be parsed"),
    "not_an_image": (_text, r"corrupt OpenEXR: .*not an EXR"),
    "empty": (_empty, r"the file is empty \(0 bytes\)"),
    "luminance_only": (_luminance_only, r"missing channels: no R,G,B; the file has .*Y"),
    "nan_inf": (_nan_and_inf, r"3 pixels hold non-finite values \(2 NaN, 2 Inf"),
    "wrong_size": (_wrong_size, r"size 10x6 differs from 8x6 of the first good frame \(1001\)"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FRAMES))
def test_bad_frame_in_a_sequence_does_not_stop_the_others(tmp_path: Path, kind: str) -> None:
    make_bad, reason = BAD_FRAMES[kind]
    write_sequence(tmp_path, [f for f in FRAMES if f != BAD])
    bad_path = tmp_path / f"plate.{BAD}.exr"
    make_bad(bad_path)

    seq = discover_sequence(f"{tmp_path}/plate.####.exr")
    assert seq.frames == FRAMES
    results = list(iter_frames(seq))
    assert [r.frame for r in results] == FRAMES
    error = results[FRAMES.index(BAD)]
    assert isinstance(error, FrameError)
    assert error.uri == str(bad_path)
    assert error.frame == BAD
    assert str(bad_path) in str(error) and f"frame {BAD}" in str(error)
    assert re.search(reason, error.reason), error.reason
    for result in results:
        if result.frame != BAD:
            assert isinstance(result, Frame), result
            expected = frame_pixels(result.frame).astype(np.float16).astype(np.float32)
            np.testing.assert_array_equal(result.pixels, expected)


@pytest.mark.parametrize(
    "kind", ["truncated", "garbage", "magic_then_garbage", "luminance_only", "nan_inf", "empty"]
)
def test_read_frame_raises_frame_error_naming_file_and_frame(tmp_path: Path, kind: str) -> None:
    make_bad, reason = BAD_FRAMES[kind]
    path = tmp_path / "plate.1002.exr"
    make_bad(path)
    with pytest.raises(FrameError, match=reason) as caught:
        read_plate_frame(str(path), frame=1002)
    assert caught.value.uri == str(path)
    assert caught.value.frame == 1002


@pytest.mark.parametrize("kind", ["truncated", "magic_then_garbage"])
def test_a_damaged_exr_prints_nothing_of_its_own(
    tmp_path: Path, kind: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """OpenEXR's own warnings (on stdout and stderr, from native code) stay out of the
    terminal; what they say that helps is in the error."""
    make_bad, _reason = BAD_FRAMES[kind]
    path = tmp_path / "plate.1002.exr"
    make_bad(path)
    capfd.readouterr()
    with pytest.raises(FrameError):
        read_plate_frame(str(path), frame=1002)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_nonfinite_zero_policy_replaces_and_records(tmp_path: Path) -> None:
    path = tmp_path / "plate.1002.exr"
    _nan_and_inf(path)
    frame = read_plate_frame(str(path), frame=1002, nonfinite="zero")
    assert np.isfinite(frame.pixels).all()
    assert frame.pixels[0, 0, 0] == 0.0 and frame.pixels[3, 4, 2] == 0.0
    assert frame.pixels[1, 2, 0] == np.float32(BAD / 10000.0)  # the finite channel is kept
    assert frame.attributes[NONFINITE_ATTRIBUTE] == 3
    with pytest.raises(ValueError, match="nonfinite"):
        read_plate_frame(str(path), nonfinite="keep")  # type: ignore[arg-type]


def test_nonfinite_policy_applies_through_iter_frames(tmp_path: Path) -> None:
    write_sequence(tmp_path, [1001, 1003])
    _nan_and_inf(tmp_path / "plate.1002.exr")
    seq = discover_sequence(f"{tmp_path}/plate.####.exr")
    results = list(iter_frames(seq, nonfinite="zero"))
    assert all(isinstance(r, Frame) for r in results)
    assert results[1].attributes[NONFINITE_ATTRIBUTE] == 3


def test_missing_named_layer_lists_what_is_there(tmp_path: Path) -> None:
    path = write_exr(tmp_path / "plate.1001.exr", ramp())
    with pytest.raises(FrameError, match=r"no layer 'plate' \(plate\.R,G,B\).*B, G, R") as caught:
        read_plate_frame(str(path), frame=1001, layer="plate")
    assert caught.value.frame == 1001


def test_missing_layer_in_an_image_file(tmp_path: Path) -> None:
    codes = np.zeros((2, 2, 3), dtype=np.int64)
    path = write_image(tmp_path / "plate.1001.png", codes, 8)
    with pytest.raises(FrameError, match=r"no layer 'plate'.*R, G, B"):
        read_plate_frame(str(path), layer="plate")


def test_single_channel_image_is_missing_channels(tmp_path: Path) -> None:
    path = write_image(tmp_path / "grey.tif", np.zeros((2, 2, 1), dtype=np.int64), 8)
    with pytest.raises(FrameError, match=r"missing channels: no R,G,B; the file has Y"):
        read_plate_frame(str(path), frame=5)


@pytest.mark.parametrize("name", ["plate.1001.png", "plate.1001.dpx", "plate.1001.txt"])
def test_a_file_that_is_not_an_image(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    _text(path)
    with pytest.raises(FrameError, match=r"not a readable image") as caught:
        read_plate_frame(str(path), frame=1001)
    assert caught.value.uri == str(path)


def test_truncated_dpx(tmp_path: Path) -> None:
    codes = np.zeros((64, 64, 3), dtype=np.int64)
    path = write_image(tmp_path / "plate.1001.dpx", codes, 10)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FrameError, match=r"cannot read pixels \(truncated or corrupt\?\)"):
        read_plate_frame(str(path), frame=1001)


def test_missing_local_file(tmp_path: Path) -> None:
    with pytest.raises(FrameError, match="file not found"):
        read_plate_frame(str(tmp_path / "plate.1001.exr"), frame=1001)


def test_unknown_colour_space() -> None:
    with pytest.raises(ValueError, match=r"unknown colour space 'ACEScgg'.*ACEScg"):
        ColourConversion("ACEScgg")


@pytest.mark.parametrize("pattern", ["", "   "])
def test_empty_pattern(pattern: str) -> None:
    with pytest.raises(SequenceError, match="empty plate pattern"):
        discover_sequence(pattern)


def test_pattern_that_matches_nothing_names_pattern_and_directory(tmp_path: Path) -> None:
    write_sequence(tmp_path, [1001, 1002])
    pattern = f"{tmp_path}/bg.####.exr"
    with pytest.raises(SequenceError, match="matches no file") as caught:
        discover_sequence(pattern)
    assert pattern in str(caught.value) and str(tmp_path) in str(caught.value)
    with pytest.raises(SequenceError, match="matches no file"):
        discover_sequence(f"{tmp_path}/plate.#####.exr")  # wrong padding


def test_pattern_in_an_empty_or_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(SequenceError, match="the directory is empty"):
        discover_sequence(f"{tmp_path}/plate.####.exr")
    with pytest.raises(SequenceError, match=r"does not exist"):
        discover_sequence(f"{tmp_path}/nowhere/plate.####.exr")


def test_pattern_without_frame_syntax(tmp_path: Path) -> None:
    write_exr(tmp_path / "plate.exr", ramp())
    with pytest.raises(SequenceError, match="no frame number or padding"):
        discover_sequence(f"{tmp_path}/plate.exr")


def test_bad_frame_range(tmp_path: Path) -> None:
    write_sequence(tmp_path, [1001])
    with pytest.raises(SequenceError, match="cannot parse frame range"):
        discover_sequence(f"{tmp_path}/plate.####.exr", frame_range="1001-abc")


def test_s3_key_vanished_between_listing_and_reading(
    s3_bucket: tuple[str, dict[str, Any]],
) -> None:
    bucket, options = s3_bucket
    fs = fsspec.filesystem("s3", **options)
    for frame in FRAMES:
        fs.pipe(f"{bucket}/sh/plate.{frame}.exr", exr_bytes(frame_pixels(frame)))
    seq = discover_sequence(Location(f"{bucket}/sh/plate.####.exr", options))
    assert seq.frames == FRAMES
    fs.rm(f"{bucket}/sh/plate.{BAD}.exr")

    results = list(iter_frames(seq))
    error = results[FRAMES.index(BAD)]
    assert isinstance(error, FrameError)
    assert error.uri == f"{bucket}/sh/plate.{BAD}.exr" and error.frame == BAD
    assert "file not found (removed after the sequence was listed?)" in error.reason
    assert [type(r).__name__ for r in results].count("Frame") == len(FRAMES) - 1


def test_s3_bucket_that_cannot_be_read(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    _, options = s3_bucket
    uri = "s3://no-such-bucket-svfx/sh/plate.1001.exr"
    with pytest.raises(FrameError, match="file not found") as caught:
        read_plate_frame(Location(uri, options), frame=1001)
    assert caught.value.uri == uri
    with pytest.raises(SequenceError, match=r"s3://no-such-bucket-svfx/sh"):
        discover_sequence(Location("s3://no-such-bucket-svfx/sh/plate.####.exr", options))


def test_s3_corrupt_object_names_the_uri(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    bucket, options = s3_bucket
    fs = fsspec.filesystem("s3", **options)
    data = exr_bytes(ramp(32, 32, 3))
    fs.pipe(f"{bucket}/plate.1001.exr", data[: len(data) // 2])
    with pytest.raises(FrameError, match="truncated or corrupt OpenEXR") as caught:
        read_plate_frame(Location(f"{bucket}/plate.1001.exr", options), frame=1001)
    assert caught.value.uri == f"{bucket}/plate.1001.exr"


class _ForbiddenFs:
    """Stands in for a store that refuses access (moto does not enforce permissions)."""

    def cat_file(self, path: str) -> bytes:
        raise PermissionError(f"Access Denied: {path}")

    def invalidate_cache(self, path: str | None = None) -> None:
        pass

    def ls(self, path: str, detail: bool = True) -> list[Any]:
        raise PermissionError(f"Access Denied: {path}")


def test_access_denied_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(where: Location) -> tuple[Any, str]:
        return _ForbiddenFs(), where.uri.removeprefix("s3://")

    monkeypatch.setattr(Location, "fs_and_path", forbidden)
    with pytest.raises(FrameError, match=r"access denied \(Access Denied") as caught:
        read_plate_frame("s3://locked/sh/plate.1001.exr", frame=1001)
    assert caught.value.frame == 1001
    with pytest.raises(SequenceError, match=r"access denied listing 's3://locked/sh'"):
        discover_sequence("s3://locked/sh/plate.####.exr")
