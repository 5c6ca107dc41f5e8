"""Tile planning per pass: coverage, bounds, shapes, padding, and cutting tiles out."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from tasks.tiling import (
    PASS_NAMES,
    TILED_PASSES,
    Feather,
    Padding,
    Region,
    extract_tiles,
    plan_frame,
)

# Odd sizes, tiny frames, exact native size, HD/UHD, overscan (a 1920x1080 display window
# with 100 px each side) and 8K: (height, width).
FRAME_SIZES = [
    (1031, 777),
    (37, 23),
    (2049, 1537),
    (1, 1),
    (16, 16),
    (1024, 768),
    (1080, 1920),
    (1280, 2120),
    (2160, 3840),
    (4320, 7680),
    (1025, 5000),
]


def _coverage(plan) -> np.ndarray:
    count = np.zeros((plan.height, plan.width), dtype=np.int32)
    for tile in plan.tiles:
        count[tile.box.slices] += 1
    return count


@pytest.mark.parametrize("size", FRAME_SIZES)
@pytest.mark.parametrize("pass_name", TILED_PASSES)
def test_tiles_cover_every_pixel_and_stay_inside_the_frame(size, pass_name):
    height, width = size
    plan = plan_frame(height, width, pass_name)
    assert plan.layout == "tiles"
    for tile in plan.tiles:
        assert 0 <= tile.box.y0 < tile.box.y1 <= height
        assert 0 <= tile.box.x0 < tile.box.x1 <= width
        assert tile.shape == plan.tile_shape == (tile.box.height, tile.box.width)
        assert tile.valid == Region(0, 0, *tile.shape)
    assert (_coverage(plan) > 0).all()
    assert len(plan.tiles) == plan.rows * plan.cols


@pytest.mark.parametrize("size", FRAME_SIZES)
def test_tile_shape_is_native_or_the_frame_when_smaller(size):
    height, width = size
    plan = plan_frame(height, width, "normal")
    assert plan.tile_shape == (min(1024, height), min(768, width))


@pytest.mark.parametrize("size", [(1, 1), (16, 16), (37, 23), (1024, 768)])
def test_frames_no_larger_than_a_tile_get_one_tile_of_their_size(size):
    plan = plan_frame(*size, "seg")
    assert len(plan.tiles) == 1
    assert plan.tiles[0].box == Region(0, 0, *size)
    assert plan.tiles[0].feather == Feather(0, 0, 0, 0)


def test_steps_by_tile_minus_overlap_and_shifts_the_last_tile_inward():
    plan = plan_frame(2160, 3840, "normal", overlap=128)
    row_starts = sorted({tile.box.y0 for tile in plan.tiles})
    col_starts = sorted({tile.box.x0 for tile in plan.tiles})
    assert row_starts == [0, 896, 2160 - 1024]
    assert col_starts == [0, 640, 1280, 1920, 2560, 3840 - 768]
    last = plan.tiles[-1]
    assert (last.box.y1, last.box.x1) == (2160, 3840)


def test_feather_lengths_are_the_overlaps_with_neighbours():
    plan = plan_frame(1031, 777, "albedo", overlap=128)
    by_position = {(tile.row, tile.col): tile for tile in plan.tiles}
    # Rows start at 0 and 7, columns at 0 and 9: the shifted tile overlaps a lot.
    assert by_position[0, 0].feather == Feather(0, 1024 - 7, 0, 768 - 9)
    assert by_position[1, 1].feather == Feather(1024 - 7, 0, 768 - 9, 0)
    assert by_position[0, 1].box == Region(0, 9, 1024, 777)


@pytest.mark.parametrize("overlap", [0, 1, 128, 500])
def test_adjacent_tiles_overlap_at_least_the_requested_amount(overlap):
    plan = plan_frame(3001, 2999, "matte", overlap=overlap)
    rows = sorted({tile.box.y0 for tile in plan.tiles})
    cols = sorted({tile.box.x0 for tile in plan.tiles})
    for previous, start in itertools.pairwise(rows):
        assert previous + plan.tile_shape[0] - start >= overlap
    for previous, start in itertools.pairwise(cols):
        assert previous + plan.tile_shape[1] - start >= overlap
    assert (_coverage(plan) > 0).all()


def test_no_overlap_on_a_multiple_of_the_tile_abuts_tiles_exactly():
    plan = plan_frame(2048, 2304, "matte", overlap=0)
    assert len(plan.tiles) == 2 * 3
    assert (_coverage(plan) == 1).all()
    assert all(tile.feather == Feather(0, 0, 0, 0) for tile in plan.tiles)


def test_custom_tile_size():
    plan = plan_frame(300, 500, "normal", tile_hw=(128, 96), overlap=16)
    assert plan.tile_shape == (128, 96)
    assert (_coverage(plan) > 0).all()


def test_pointmap_is_one_whole_frame_tile():
    plan = plan_frame(2160, 3840, "pointmap")
    assert plan.layout == "whole_frame"
    assert len(plan.tiles) == 1
    assert plan.tiles[0].box == Region(0, 0, 2160, 3840)
    assert plan.tile_shape == (2160, 3840)


def test_pose_has_no_tiles_and_says_so():
    plan = plan_frame(1080, 1920, "pose")
    assert plan.layout == "none"
    assert plan.tiles == ()
    assert "person boxes" in plan.note
    image = torch.zeros((3, 1080, 1920))
    assert tuple(extract_tiles(image, plan).shape) == (0, 3, 0, 0)


@pytest.mark.parametrize(
    ("size", "padded"),
    [
        ((2160, 3840), (2176, 3840)),
        ((4096, 3072), (4096, 3072)),
        ((1, 1), (64, 64)),
        ((1031, 777), (1088, 832)),
        ((2286, 4096), (2304, 4096)),
    ],
)
def test_backbone4k_pads_to_multiples_of_64(size, padded):
    plan = plan_frame(*size, "backbone4k")
    assert plan.layout == "padded_frame"
    assert plan.tile_shape == padded
    assert padded[0] % 64 == 0 and padded[1] % 64 == 0
    assert plan.padding == Padding(0, padded[0] - size[0], 0, padded[1] - size[1])
    (tile,) = plan.tiles
    assert tile.valid == Region(0, 0, *size) and tile.box == Region(0, 0, *size)


def test_backbone4k_zero_padding_and_edge_padding():
    rng = np.random.default_rng(1)
    image = torch.from_numpy(rng.random((3, 70, 65), dtype=np.float32) + 0.5)
    zero_plan = plan_frame(70, 65, "backbone4k")
    (padded,) = extract_tiles(image, zero_plan)
    assert tuple(padded.shape) == (3, 128, 128)
    assert torch.equal(padded[:, :70, :65], image)
    assert not padded[:, 70:].any() and not padded[:, :, 65:].any()

    edge_plan = plan_frame(70, 65, "backbone4k", pad_mode="edge")
    (padded,) = extract_tiles(image, edge_plan)
    assert torch.equal(padded[:, :70, :65], image)
    assert torch.equal(padded[:, 100, 10], image[:, 69, 10])
    assert torch.equal(padded[:, 5, 100], image[:, 5, 64])
    assert torch.equal(padded[:, 127, 127], image[:, 69, 64])


def test_extract_tiles_cuts_each_box_and_batches_equal_shapes():
    rng = np.random.default_rng(2)
    image = torch.from_numpy(rng.random((3, 1100, 900), dtype=np.float32))
    plan = plan_frame(1100, 900, "normal")
    tiles = extract_tiles(image, plan)
    assert tuple(tiles.shape) == (len(plan.tiles), 3, 1024, 768)
    assert tiles.is_contiguous()
    for tile, cut in zip(plan.tiles, tiles, strict=True):
        assert torch.equal(cut, image[:, tile.box.y0 : tile.box.y1, tile.box.x0 : tile.box.x1])
    some = extract_tiles(image, plan, indices=[3, 1])
    assert torch.equal(some, tiles[[3, 1]])


def test_extract_tiles_of_a_single_channel_image():
    image = torch.arange(40 * 30, dtype=torch.float32).reshape(1, 40, 30)
    plan = plan_frame(40, 30, "matte", tile_hw=(16, 16), overlap=4)
    tiles = extract_tiles(image, plan)
    assert tuple(tiles.shape) == (len(plan.tiles), 1, 16, 16)
    assert torch.equal(tiles[-1], image[:, 24:40, 14:30])


def test_extract_tiles_rejects_an_image_of_another_size():
    plan = plan_frame(100, 100, "normal")
    with pytest.raises(ValueError, match="100x100"):
        extract_tiles(torch.zeros((3, 100, 99)), plan)


def test_equal_frames_give_equal_plans_and_batch_keys():
    first = plan_frame(1080, 1920, "normal")
    assert first == plan_frame(1080, 1920, "normal")
    assert first.batch_key == plan_frame(1080, 1920, "seg").batch_key
    assert first.batch_key != plan_frame(1080, 1920, "pointmap").batch_key


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pass_name": "bogus"}, "unknown pass"),
        ({"height": 0}, "empty frame"),
        ({"overlap": 768}, "overlap"),
        ({"overlap": -1}, "overlap"),
        ({"tile_hw": (0, 10)}, "tile size"),
        ({"pad_multiple": 0}, "pad_multiple"),
        ({"pad_mode": "reflect"}, "pad_mode"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    arguments = {"height": 100, "width": 100, "pass_name": "normal", **kwargs}
    with pytest.raises(ValueError, match=message):
        plan_frame(**arguments)


def test_every_pass_name_plans():
    for pass_name in PASS_NAMES:
        assert plan_frame(50, 60, pass_name).pass_name == pass_name
