"""Sequence discovery (every pattern form, holes, ranges, S3) and per-frame streaming."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from storage.errors import FrameError, SequenceError
from storage.frame import Frame
from storage.location import Location
from storage.sequences import discover_sequence, iter_frames
from tests.plates import exr_bytes, frame_pixels, write_sequence

PRESENT = [1001, 1002, 1004, 1005]


@pytest.fixture
def plate_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "sh010" / "plate"
    write_sequence(directory, PRESENT)
    return directory


@pytest.mark.parametrize(
    "name",
    [
        "plate.####.exr",
        "plate.%04d.exr",
        "plate.@@@@.exr",
        "plate.#.exr",
        "plate.$F4.exr",
        "plate.*.exr",
        "",  # the directory itself, with a trailing '/'
    ],
)
def test_pattern_forms_find_frames_and_holes(plate_dir: Path, name: str) -> None:
    seq = discover_sequence(f"{plate_dir}/{name}")
    assert seq.frames == PRESENT
    assert seq.holes == [1003]
    assert seq.padding == 4
    assert seq.requested is None
    assert seq.directory == str(plate_dir)
    assert seq.uri_for(1001) == f"{plate_dir}/plate.1001.exr"
    assert Path(seq.uri_for(1005)).is_file()


def test_directory_without_trailing_slash(plate_dir: Path) -> None:
    seq = discover_sequence(str(plate_dir))
    assert seq.frames == PRESENT
    assert seq.uri_for(1002) == f"{plate_dir}/plate.1002.exr"


def test_file_uri_scheme_is_kept(plate_dir: Path) -> None:
    seq = discover_sequence(f"file://{plate_dir}/plate.####.exr")
    assert seq.frames == PRESENT
    assert seq.uri_for(1001) == f"file://{plate_dir}/plate.1001.exr"


def test_range_in_pattern_reports_missing_frames_as_holes(plate_dir: Path) -> None:
    seq = discover_sequence(f"{plate_dir}/plate.1001-1008#.exr")
    assert seq.frames == PRESENT
    assert seq.holes == [1003, 1006, 1007, 1008]
    assert seq.requested == list(range(1001, 1009))
    assert seq.all_frames == list(range(1001, 1009))


def test_range_argument_overrides_pattern_and_trims_frames(plate_dir: Path) -> None:
    seq = discover_sequence(f"{plate_dir}/plate.1001-1008#.exr", frame_range="1002-1004")
    assert seq.frames == [1002, 1004]
    assert seq.holes == [1003]
    seq = discover_sequence(f"{plate_dir}/plate.####.exr", frame_range=[1005, 1001, 1009])
    assert seq.frames == [1001, 1005]
    assert seq.holes == [1009]


def test_range_with_no_frame_present_is_an_error(plate_dir: Path) -> None:
    with pytest.raises(SequenceError, match=r"2001-2003.*1001-1002,1004-1005"):
        discover_sequence(f"{plate_dir}/plate.####.exr", frame_range="2001-2003")


def test_single_frame_pattern(plate_dir: Path) -> None:
    seq = discover_sequence(f"{plate_dir}/plate.1004.exr")
    assert seq.frames == [1004]
    assert seq.holes == []


def test_padding_is_strict_but_overflow_matches(tmp_path: Path) -> None:
    write_sequence(tmp_path, [9998, 9999, 10000])
    write_sequence(tmp_path, [7], padding=3)  # plate.007.exr: another padding
    write_sequence(tmp_path, [8], padding=5)  # plate.00008.exr: another padding
    seq = discover_sequence(f"{tmp_path}/plate.####.exr")
    assert seq.frames == [9998, 9999, 10000]
    assert seq.uri_for(10000).endswith("/plate.10000.exr")
    # 5-digit padding: plate.00008.exr, and plate.10000.exr fills all five digits.
    assert discover_sequence(f"{tmp_path}/plate.#####.exr").frames == [8, 10000]


def test_at_sign_is_one_digit_each(tmp_path: Path) -> None:
    write_sequence(tmp_path, [1, 2, 3, 9, 10, 11], padding=1)
    seq = discover_sequence(f"{tmp_path}/plate.@.exr")
    assert seq.frames == [1, 2, 3, 9, 10, 11]
    assert seq.holes == [4, 5, 6, 7, 8]
    assert seq.padding == 1
    assert seq.uri_for(5).endswith("/plate.5.exr")


def test_uri_for_a_missing_frame_uses_the_padding(plate_dir: Path) -> None:
    seq = discover_sequence(f"{plate_dir}/plate.%04d.exr")
    assert seq.uri_for(1003) == f"{plate_dir}/plate.1003.exr"
    assert seq.uri_for(7) == f"{plate_dir}/plate.0007.exr"


def test_other_files_in_the_directory_are_ignored(plate_dir: Path) -> None:
    (plate_dir / "plate.1003.exr.tmp").write_bytes(b"partial upload")
    (plate_dir / "notes.txt").write_text("plate notes")
    (plate_dir / "plate.1001.jpg").write_bytes(b"thumbnail")
    seq = discover_sequence(f"{plate_dir}/plate.####.exr")
    assert seq.frames == PRESENT


def test_directory_with_two_sequences_asks_for_one(plate_dir: Path) -> None:
    write_sequence(plate_dir, [1001, 1002], name="bg")
    with pytest.raises(SequenceError, match=r"several sequences.*bg\.\*\.exr.*plate\.\*\.exr"):
        discover_sequence(f"{plate_dir}/")


def test_the_directory_is_listed_once_and_no_file_is_probed(
    plate_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    class CountingFs:
        def __init__(self, fs: Any) -> None:
            self._fs = fs

        def __getattr__(self, name: str) -> Any:
            attr = getattr(self._fs, name)
            if callable(attr):

                def counted(*args: Any, **kwargs: Any) -> Any:
                    calls.append(name)
                    return attr(*args, **kwargs)

                return counted
            return attr

    real = Location.fs_and_path

    def spying(where: Location) -> tuple[Any, str]:
        fs, path = real(where)
        return CountingFs(fs), path

    monkeypatch.setattr(Location, "fs_and_path", spying)
    seq = discover_sequence(f"{plate_dir}/plate.1001-1005#.exr")
    assert seq.frames == PRESENT
    assert calls.count("ls") == 1
    assert not {"info", "exists", "isfile", "open", "cat_file"} & set(calls)


def test_iter_frames_streams_frames_and_reports_holes(plate_dir: Path) -> None:
    seq = discover_sequence(f"{plate_dir}/plate.####.exr")
    results = list(iter_frames(seq))
    assert [r.frame for r in results] == [1001, 1002, 1003, 1004, 1005]
    hole = results[2]
    assert isinstance(hole, FrameError)
    assert "missing" in hole.reason
    assert hole.uri.endswith("plate.1003.exr")
    for result in results[:2] + results[3:]:
        assert isinstance(result, Frame)
        expected = frame_pixels(result.frame).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(result.pixels, expected)


def test_iter_frames_reads_lazily_one_frame_at_a_time(plate_dir: Path) -> None:
    seq = discover_sequence(f"{plate_dir}/plate.####.exr")
    read: list[int] = []

    def read_fn(uri: str, frame: int) -> Frame:
        read.append(frame)
        return Frame(np.zeros((2, 2, 3), np.float32), uri, frame, (0, 0, 1, 1), (0, 0, 1, 1))

    stream = iter_frames(seq, frames=seq.frames, read_fn=read_fn)
    assert read == []
    first = next(stream)
    assert isinstance(first, Frame)
    assert read == [1001]
    next(stream)
    assert read == [1001, 1002]


def test_iter_frames_turns_any_reader_exception_into_a_frame_error(plate_dir: Path) -> None:
    seq = discover_sequence(f"{plate_dir}/plate.####.exr")

    def read_fn(uri: str, frame: int) -> Frame:
        if frame == 1002:
            raise RuntimeError("decoder exploded")
        return Frame(np.zeros((2, 2, 3), np.float32), uri, frame, (0, 0, 1, 1), (0, 0, 1, 1))

    results = list(iter_frames(seq, frames=seq.frames, read_fn=read_fn))
    assert [type(r).__name__ for r in results] == ["Frame", "FrameError", "Frame", "Frame"]
    assert "decoder exploded" in str(results[1])
    assert isinstance(results[1].__cause__, RuntimeError)


def test_s3_sequence_is_listed_and_read_back(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    bucket, options = s3_bucket
    fs = fsspec.filesystem("s3", **options)
    for frame in (1001, 1002, 1003, 1005):
        pixels = frame_pixels(frame).astype(np.float16)
        fs.pipe(f"{bucket}/show/sh010/plate/plate.{frame:04d}.exr", exr_bytes(pixels))
    fs.pipe(f"{bucket}/show/sh010/plate/readme.txt", b"not a frame")

    seq = discover_sequence(Location(f"{bucket}/show/sh010/plate/plate.####.exr", options))
    assert seq.frames == [1001, 1002, 1003, 1005]
    assert seq.holes == [1004]
    assert seq.uri_for(1002) == f"{bucket}/show/sh010/plate/plate.1002.exr"

    results = list(iter_frames(seq))
    assert [type(r).__name__ for r in results] == [
        "Frame",
        "Frame",
        "Frame",
        "FrameError",
        "Frame",
    ]
    for result in results:
        if isinstance(result, Frame):
            expected = frame_pixels(result.frame).astype(np.float16).astype(np.float32)
            np.testing.assert_array_equal(result.pixels, expected)
            assert result.uri.startswith("s3://")


def test_s3_directory_pattern(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    bucket, options = s3_bucket
    fs = fsspec.filesystem("s3", **options)
    for frame in (1, 2, 3):
        fs.pipe(f"{bucket}/plates/shot.{frame:05d}.exr", exr_bytes(frame_pixels(frame)))
    seq = discover_sequence(Location(f"{bucket}/plates/", options))
    assert seq.frames == [1, 2, 3]
    assert seq.padding == 5
    assert seq.uri_for(2) == f"{bucket}/plates/shot.00002.exr"
