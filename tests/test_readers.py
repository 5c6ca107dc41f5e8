"""Readers: EXR types, layers, parts, windows, aspect, attributes; DPX/TIFF/PNG/JPEG scaling."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import OpenEXR
import pytest

import storage.checksum as checksum
from storage.checksum import sha256_bytes, sha256_file
from storage.location import Location
from storage.plate_reader import decode_frame, read_plate_frame
from tests.plates import (
    REC709_CHROMATICITIES,
    code_ramp,
    exr_bytes,
    exr_header,
    ramp,
    rgb_channels,
    window,
    write_exr,
    write_image,
    write_multipart_exr,
)


@pytest.mark.parametrize(
    ("dtype", "source_type", "bits"),
    [(np.float16, "half", 16), (np.float32, "float", 32), (np.uint32, "uint32", 32)],
)
def test_exr_pixel_types_round_trip_exactly(
    tmp_path: Path, dtype: Any, source_type: str, bits: int
) -> None:
    if dtype is np.uint32:
        values = np.arange(6 * 8 * 3, dtype=np.uint32).reshape(6, 8, 3) * 4099 + 7
    else:
        values = (ramp(6, 8, 3, seed=3) * 1000 - 500).astype(dtype)  # negatives, > 1
    path = write_exr(tmp_path / "plate.1001.exr", channels=rgb_channels(values))
    frame = read_plate_frame(str(path), frame=1001)
    assert frame.pixels.dtype == np.float32
    np.testing.assert_array_equal(frame.pixels, values.astype(np.float32))
    assert frame.source_type == source_type
    assert frame.bit_depth == bits
    assert frame.channels == ("R", "G", "B")
    assert frame.frame == 1001
    assert frame.uri == str(path)


def test_exr_rgba_keeps_alpha_in_order(tmp_path: Path) -> None:
    values = ramp(4, 5, 4, seed=1).astype(np.float16)
    path = write_exr(tmp_path / "a.exr", channels=rgb_channels(values))
    frame = read_plate_frame(str(path))
    assert frame.channels == ("R", "G", "B", "A")
    np.testing.assert_array_equal(frame.pixels, values.astype(np.float32))


def test_exr_mixed_half_and_float_channels(tmp_path: Path) -> None:
    values = ramp(4, 5, 3, seed=2)
    chans = rgb_channels(values)
    chans["G"] = chans["G"].astype(np.float16)
    path = write_exr(tmp_path / "mixed.exr", channels=chans)
    frame = read_plate_frame(str(path))
    assert frame.source_type == "float+half"
    np.testing.assert_array_equal(frame.pixels[..., 1], chans["G"].astype(np.float32))
    np.testing.assert_array_equal(frame.pixels[..., 0], values[..., 0])


def test_multipart_exr_picks_parts_by_layer(tmp_path: Path) -> None:
    rgba, plate, beauty = ramp(seed=10), ramp(seed=11), ramp(seed=12)
    path = write_multipart_exr(
        tmp_path / "multi.exr",
        {
            "depth": {"Z": np.ones((6, 8), np.float32)},
            "rgba": rgb_channels(rgba),
            "plate": rgb_channels(plate, prefix="plate."),
            "beauty": rgb_channels(beauty),  # a part named like the layer, plain R,G,B
        },
    )
    np.testing.assert_array_equal(read_plate_frame(str(path)).pixels, rgba)
    picked = read_plate_frame(str(path), layer="plate")
    np.testing.assert_array_equal(picked.pixels, plate)
    assert picked.channels == ("plate.R", "plate.G", "plate.B")
    np.testing.assert_array_equal(read_plate_frame(str(path), layer="beauty").pixels, beauty)


def test_single_part_layer_by_channel_prefix(tmp_path: Path) -> None:
    base, plate = ramp(seed=20), ramp(seed=21)
    chans = {**rgb_channels(base), **rgb_channels(plate, prefix="plate.")}
    path = write_exr(tmp_path / "layers.exr", channels=chans)
    np.testing.assert_array_equal(read_plate_frame(str(path)).pixels, base)
    np.testing.assert_array_equal(read_plate_frame(str(path), layer="plate").pixels, plate)
    np.testing.assert_array_equal(read_plate_frame(str(path), layer="rgba").pixels, base)


@pytest.mark.parametrize(
    ("data_window", "display_window"),
    [
        ((-2, -1, 9, 6), (0, 0, 7, 5)),  # overscan around the frame
        ((2, 1, 5, 3), (0, 0, 7, 5)),  # a crop inside it
    ],
)
def test_data_and_display_windows_are_kept(
    tmp_path: Path, data_window: tuple[int, ...], display_window: tuple[int, ...]
) -> None:
    width = data_window[2] - data_window[0] + 1
    height = data_window[3] - data_window[1] + 1
    values = ramp(height, width, 3, seed=5)
    path = write_exr(
        tmp_path / "win.exr",
        values,
        dataWindow=window(*data_window),
        displayWindow=window(*display_window),
    )
    frame = read_plate_frame(str(path))
    assert frame.data_window == data_window
    assert frame.display_window == display_window
    assert (frame.height, frame.width) == (height, width)
    np.testing.assert_array_equal(frame.pixels, values)


def test_pixel_aspect_timecode_and_attributes_are_kept_and_writable(tmp_path: Path) -> None:
    timecode = OpenEXR.TimeCode()
    timecode.hours, timecode.minutes, timecode.seconds, timecode.frame = 1, 2, 3, 4
    path = write_exr(
        tmp_path / "meta.exr",
        ramp(),
        pixelAspectRatio=2.0,
        timeCode=timecode,
        owner="plates dept",
        chromaticities=REC709_CHROMATICITIES,
        framesPerSecond=(24, 1),
        capDate="2026:01:02 03:04:05",
    )
    frame = read_plate_frame(str(path))
    assert frame.pixel_aspect == 2.0
    tc = frame.attributes["timeCode"]
    assert (tc.hours, tc.minutes, tc.seconds, tc.frame) == (1, 2, 3, 4)
    assert frame.attributes["owner"] == "plates dept"
    assert frame.attributes["capDate"] == "2026:01:02 03:04:05"
    np.testing.assert_allclose(frame.attributes["chromaticities"], REC709_CHROMATICITIES, 1e-6)
    for structural in ("channels", "compression", "dataWindow", "displayWindow", "type"):
        assert structural not in frame.attributes

    # What the reader kept can be written straight back into an output header.
    out = tmp_path / "copy.exr"
    OpenEXR.File(exr_header(**frame.attributes), rgb_channels(frame.pixels)).write(str(out))
    again = read_plate_frame(str(out))
    assert again.attributes["timeCode"] == tc
    assert again.attributes["owner"] == "plates dept"
    np.testing.assert_array_equal(again.attributes["framesPerSecond"], [24, 1])


@pytest.mark.parametrize(
    ("name", "bits"),
    [
        ("plate.png", 8),
        ("plate.png", 16),
        ("plate.tif", 8),
        ("plate.tif", 16),
        ("plate.tif", 12),
        ("plate.dpx", 10),
        ("plate.dpx", 12),
        ("plate.dpx", 16),
    ],
)
def test_integer_images_scale_code_values_exactly(tmp_path: Path, name: str, bits: int) -> None:
    codes = code_ramp(4, 16, bits)
    path = write_image(tmp_path / name, codes, bits)
    frame = read_plate_frame(str(path), frame=7)
    expected = codes.astype(np.float32) / np.float32(2**bits - 1)
    np.testing.assert_array_equal(frame.pixels, expected)
    assert frame.pixels.min() == 0.0 and frame.pixels.max() == 1.0
    assert frame.bit_depth == bits
    assert frame.source_type == f"uint{bits}"
    assert frame.channels == ("R", "G", "B")
    assert frame.data_window == frame.display_window == (0, 0, 15, 3)


def test_ten_bit_dpx_reads_code_over_1023(tmp_path: Path) -> None:
    codes = np.array([[[0, 1, 512], [64, 940, 1023]]])
    path = write_image(tmp_path / "log.dpx", codes, 10, {"dpx:Transfer": "Logarithmic"})
    frame = read_plate_frame(str(path))
    np.testing.assert_array_equal(frame.pixels, codes.astype(np.float32) / np.float32(1023))
    assert frame.attributes["oiio:BitsPerSample"] == 10
    assert frame.attributes["dpx:Transfer"] == "Logarithmic"


def test_jpeg_reads_eight_bit_values(tmp_path: Path) -> None:
    codes = np.full((8, 8, 3), (200, 100, 50))  # flat colour survives JPEG almost exactly
    path = write_image(tmp_path / "ref.jpg", codes, 8)
    frame = read_plate_frame(str(path))
    assert frame.bit_depth == 8
    np.testing.assert_allclose(frame.pixels, codes / 255.0, atol=3 / 255)


def test_rgba_png_keeps_alpha(tmp_path: Path) -> None:
    codes = code_ramp(3, 5, 8, channels=4)
    frame = read_plate_frame(str(write_image(tmp_path / "a.png", codes, 8)))
    assert frame.channels == ("R", "G", "B", "A")
    np.testing.assert_array_equal(frame.pixels, codes.astype(np.float32) / np.float32(255))


def test_float_tiff_is_read_unscaled(tmp_path: Path) -> None:
    import OpenImageIO as oiio

    values = ramp(3, 4, 3, seed=9) * 4
    path = tmp_path / "float.tif"
    output = oiio.ImageOutput.create(str(path))
    output.open(str(path), oiio.ImageSpec(4, 3, 3, "float"))
    output.write_image(values)
    output.close()
    frame = read_plate_frame(str(path))
    np.testing.assert_array_equal(frame.pixels, values)
    assert frame.source_type == "float"


def test_read_from_s3_exr_png_and_dpx(
    tmp_path: Path, s3_bucket: tuple[str, dict[str, Any]]
) -> None:
    bucket, options = s3_bucket
    fs = fsspec.filesystem("s3", **options)
    values = ramp(seed=30).astype(np.float16)
    fs.pipe(f"{bucket}/p/plate.1001.exr", exr_bytes(values, pixelAspectRatio=2.0))
    codes = code_ramp(4, 6, 10)
    fs.put(str(write_image(tmp_path / "x.dpx", codes, 10)), f"{bucket}/p/plate.1001.dpx")
    codes8 = code_ramp(4, 6, 8)
    fs.put(str(write_image(tmp_path / "x.png", codes8, 8)), f"{bucket}/p/plate.1001.png")

    exr = read_plate_frame(Location(f"{bucket}/p/plate.1001.exr", options), frame=1001)
    np.testing.assert_array_equal(exr.pixels, values.astype(np.float32))
    assert exr.pixel_aspect == 2.0
    dpx = read_plate_frame(Location(f"{bucket}/p/plate.1001.dpx", options))
    np.testing.assert_array_equal(dpx.pixels, codes.astype(np.float32) / np.float32(1023))
    assert dpx.bit_depth == 10
    png = read_plate_frame(Location(f"{bucket}/p/plate.1001.png", options))
    np.testing.assert_array_equal(png.pixels, codes8.astype(np.float32) / np.float32(255))

    data = fs.cat_file(f"{bucket}/p/plate.1001.exr")
    assert (
        sha256_file(Location(f"{bucket}/p/plate.1001.exr", options))
        == hashlib.sha256(data).hexdigest()
    )


def test_decode_frame_from_bytes_matches_read_plate_frame(tmp_path: Path) -> None:
    path = write_exr(tmp_path / "b.exr", ramp(seed=4))
    data = path.read_bytes()
    from_bytes = decode_frame(data, str(path), frame=3)
    np.testing.assert_array_equal(from_bytes.pixels, read_plate_frame(str(path)).pixels)
    assert from_bytes.frame == 3
    png = write_image(tmp_path / "b.png", code_ramp(2, 3, 8), 8)
    decoded = decode_frame(png.read_bytes(), "s3://bucket/b.png")
    np.testing.assert_array_equal(decoded.pixels, read_plate_frame(str(png)).pixels)


def test_sha256_streams_in_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = np.random.default_rng(0).bytes(10_000)
    path = tmp_path / "blob.bin"
    path.write_bytes(payload)
    expected = hashlib.sha256(payload).hexdigest()
    assert sha256_bytes(payload) == expected
    monkeypatch.setattr(checksum, "BLOCK_SIZE", 1024)  # ten blocks
    assert sha256_file(str(path)) == expected
    assert sha256_file(f"file://{path}") == expected


def test_frame_rate_rational_is_kept(tmp_path) -> None:
    """OpenEXR 3.5 hands framesPerSecond back as a Fraction; it must reach the outputs."""
    from fractions import Fraction

    import numpy as np
    import OpenEXR

    from storage.plate_reader import read_plate_frame

    path = tmp_path / "plate.1001.exr"
    header = {
        "compression": OpenEXR.ZIP_COMPRESSION,
        "type": OpenEXR.scanlineimage,
        "framesPerSecond": Fraction(24000, 1001),
    }
    OpenEXR.File(header, {"RGB": np.full((4, 6, 3), 0.5, np.float32)}).write(str(path))
    assert read_plate_frame(str(path), 1001).attributes["framesPerSecond"] == Fraction(24000, 1001)
