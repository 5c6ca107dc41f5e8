"""Preview thumbnails, contact sheets and the MP4 review clip."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import imageio_ffmpeg
import numpy as np
import pytest
import s3fs
from PIL import Image

from schemas.passes import BY_NAME
from storage.errors import StorageError
from storage.location import Location
from storage.previews import (
    albedo_rgb,
    depth_rgb,
    matte_rgb,
    normal_rgb,
    pass_preview,
    pose_preview,
    seg_rgb,
    thumbnail_size,
    write_contact_sheet,
    write_image,
)
from storage.review_clip import ReviewClipWriter, clip_frame_count, write_review_clip

PALETTE = [[(i * 37) % 256, (i * 91) % 256, (i * 53) % 256] for i in range(29)]


def test_pass_colours() -> None:
    normal = np.array([[[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0]]], dtype=np.float32)
    assert normal_rgb(normal).tolist() == [[[128, 128, 255], [0, 128, 128]]]
    assert matte_rgb(np.array([[0.0, 1.0]])).tolist() == [[[0, 0, 0], [255, 255, 255]]]
    assert albedo_rgb(np.array([[[0.5, 0.0, 1.0]]])).tolist() == [[[188, 0, 255]]]
    labels = np.array([[0, 5], [28, 5]])
    assert seg_rgb(labels, PALETTE).tolist() == [
        [PALETTE[0], PALETTE[5]],
        [PALETTE[28], PALETTE[5]],
    ]
    with pytest.raises(ValueError, match="palette"):
        seg_rgb(labels, PALETTE[:10])
    with pytest.raises(ValueError, match="class labels"):  # labels come from the device
        seg_rgb(np.eye(29, dtype=np.float32)[labels], PALETTE)


def test_depth_ramp_near_warm_far_cool_invalid_black() -> None:
    depth = np.array([[1.0, 100.0, np.nan, -2.0]], dtype=np.float32)
    rgb = depth_rgb(depth, inverse_depth_range=(0.01, 1.0))
    near, far, missing, behind = rgb[0]
    assert near[0] > near[2] and far[2] > far[0]
    assert missing.tolist() == [0, 0, 0] and behind.tolist() == [0, 0, 0]
    pointmap = np.zeros((1, 4, 3), np.float32)
    pointmap[..., 2] = depth
    np.testing.assert_array_equal(depth_rgb(pointmap, (0.01, 1.0)), rgb)


def test_thumbnail_sizes() -> None:
    assert thumbnail_size(1920, 1080) == (512, 288)
    assert thumbnail_size(2048, 858, pixel_aspect=2.0) == (512, 107)  # anamorphic, de-squeezed
    assert thumbnail_size(37, 23) == (37, 23)  # never enlarged


@pytest.mark.parametrize("extension", ["png", "jpg"])
def test_written_previews_decode_at_the_right_size(tmp_path: Path, extension: str) -> None:
    rng = np.random.default_rng(0)
    passes = {
        "normal": rng.normal(size=(600, 900, 3)).astype(np.float32),
        "pointmap": rng.random((600, 900, 3)).astype(np.float32) + 1,
        "albedo": rng.random((600, 900, 3)).astype(np.float32),
        "matte": rng.random((600, 900)).astype(np.float32),
        "seg": rng.integers(0, 29, size=(600, 900)),
    }
    for name, data in passes.items():
        rgb = pass_preview(BY_NAME[name].preview, data, palette=PALETTE)
        uri = str(tmp_path / f"{name}.1001.{extension}")
        result = write_image(uri, rgb)
        image = Image.open(uri)
        assert image.format == ("PNG" if extension == "png" else "JPEG")
        assert image.size == (512, 341)
        assert result.size == Path(uri).stat().st_size
    seg = (
        np.asarray(Image.open(tmp_path / "seg.1001.png").convert("RGB"))
        if extension == "png"
        else None
    )
    if seg is not None:  # nearest-neighbour keeps exact palette colours
        assert {tuple(c) for c in seg.reshape(-1, 3)} <= {tuple(c) for c in PALETTE}


def test_pose_skeleton_is_drawn_over_the_plate() -> None:
    plate = np.zeros((100, 200, 3), dtype=np.float32)
    keypoints = np.zeros((308, 2), dtype=np.float32)
    keypoints[0], keypoints[1], keypoints[2] = (20, 50), (180, 50), (100, 90)
    scores = np.zeros(308, dtype=np.float32)
    scores[[0, 1]] = 0.9  # keypoint 2 is below the score threshold
    person = {"keypoints": keypoints, "scores": scores, "box": [0, 0, 200, 100]}
    red, green = (255, 0, 0), (0, 255, 0)
    image = pose_preview(plate, [person], [(0, 1), (1, 2)], [red, green])
    assert image.shape == (100, 200, 3)
    colours = {tuple(c) for c in image.reshape(-1, 3)}
    assert red in colours
    assert green not in colours
    assert image[50, 100].tolist() == list(red)
    # A thumbnail made on the device is drawn on as it is, keypoints scaled from the plate.
    small = pose_preview(
        np.zeros((25, 50, 3), np.float32), [person], [(0, 1)], [red], frame_size=(200, 100)
    )
    assert small.shape == (25, 50, 3)
    assert tuple(small[12, 25]) == red and tuple(small[2, 25]) == (0, 0, 0)


def test_contact_sheet_from_written_thumbnails(tmp_path: Path) -> None:
    items = []
    for frame in range(1001, 1011):
        uri = str(tmp_path / f"thumb.{frame}.png")
        write_image(uri, np.full((90, 160, 3), frame % 256, dtype=np.uint8))
        items.append((frame, uri))
    sheet_uri = str(tmp_path / "sheet.jpg")
    write_contact_sheet(sheet_uri, items, columns=4, cell_max_side=160)
    sheet = Image.open(sheet_uri)
    assert sheet.format == "JPEG"
    label = max(10, 90 // 10) + 6
    assert sheet.size == (4 * (160 + 4) + 4, 3 * (90 + label + 4) + 4)


def _grey_frames(count: int, width: int = 37, height: int = 23) -> list[tuple[int, np.ndarray]]:
    return [(1001 + i, np.full((height, width, 3), 0.5, np.float32)) for i in range(count)]


def test_review_clip_frame_count_size_and_burn_in(tmp_path: Path) -> None:
    path = tmp_path / "normal.mp4"
    frames = iter(_grey_frames(12, 101, 61))
    result = write_review_clip(str(path), frames, fps=23.976, label="N")
    assert result.size == path.stat().st_size
    assert clip_frame_count(path) == 12
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = reader.__next__()
    assert tuple(meta["size"]) == (100, 60)  # odd sizes rounded down to even for yuv420p
    assert meta["fps"] == pytest.approx(23.976, abs=0.01)
    first = np.frombuffer(next(reader), dtype=np.uint8).reshape(60, 100, 3)
    reader.close()
    # The burn-in's black box and white digits sit in the lower-left corner of a grey frame.
    corner = first[35:, :50].astype(int)
    assert corner.max() > 200 and corner.min() < 40
    assert abs(int(first[5, 90].mean()) - 128) < 20


def test_review_clip_to_s3(s3_bucket: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    root, options = s3_bucket
    uri = f"{root}/sh010/matte.mp4"
    writer = ReviewClipWriter(Location(uri, options), 64, 36, 25)
    with writer:
        for frame, image in _grey_frames(5, 64, 36):
            writer.add_frame((image * 255).astype(np.uint8), frame)
    assert writer.result is not None
    local = tmp_path / "copy.mp4"
    local.write_bytes(s3fs.S3FileSystem(**options).cat_file(uri))
    assert clip_frame_count(local) == 5


def test_failed_clip_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "broken.mp4"
    with pytest.raises(RuntimeError), ReviewClipWriter(str(path), 32, 32) as writer:
        writer.add_frame(np.zeros((32, 32, 3), np.uint8), 1)
        raise RuntimeError("model crashed")
    assert not path.exists()
    with pytest.raises(StorageError, match="at least one frame"):
        write_review_clip(str(path), iter([]))
    assert list(tmp_path.iterdir()) == []


def test_png_bytes_round_trip() -> None:
    from storage.previews import encode_image

    rgb = np.random.default_rng(3).integers(0, 256, size=(7, 5, 3), dtype=np.uint8)
    decoded = np.asarray(Image.open(io.BytesIO(encode_image(rgb, "png"))))
    np.testing.assert_array_equal(decoded, rgb)
