"""Blending tiles back on the model's device: identity is bit-exact, seams feather,
probabilities stay normalised, and the result equals the numpy blender it replaced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.standins import ConstantModel, IdentityModel, RandomModel
from tasks.blending import Band, FrameBlender, covered_bands, feather_weights
from tasks.tiling import FramePlan, Region, extract_tiles, plan_frame
from tests import numpy_reference

CHANNELS = {"normal": 3, "albedo": 3, "pointmap": 3, "seg": 29, "matte": 1}


def _blend_through(image: torch.Tensor, plan: FramePlan, model, output: str, batch: int = 4):
    """plan -> extract (a batch at a time) -> predict -> blend, as the worker does."""
    model_pass = "normal" if plan.pass_name == "backbone4k" else plan.pass_name
    blender = FrameBlender.for_plan(plan, CHANNELS[output])
    for first in range(0, len(plan.tiles), batch):
        indices = list(range(first, min(first + batch, len(plan.tiles))))
        tiles = extract_tiles(image, plan, indices)
        values = model.predict_batch(tiles, model_pass)[output]
        for index, tile_values in zip(indices, values, strict=True):
            blender.add(plan.tiles[index], tile_values)
    return blender.result()


def _bits(values: torch.Tensor | np.ndarray) -> np.ndarray:
    array = values.numpy() if isinstance(values, torch.Tensor) else values
    return np.ascontiguousarray(array).view(np.uint32)


def _test_image(height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Random pixels (3, H, W) with the finite values float arithmetic likes to get wrong
    sprinkled in: signed zeros, denormals, the largest floats."""
    rng = np.random.default_rng(seed)
    image = rng.random((3, height, width), dtype=np.float32)
    awkward = np.array(
        [-0.0, 0.0, 1e-42, -1e-42, 3.4e38, -3.4e38, 1 / 3, 0.1, 7.0], dtype=np.float32
    )
    mask = rng.random((3, height, width)) < 0.05
    image[mask] = rng.choice(awkward, size=int(mask.sum()))
    return torch.from_numpy(image)


SIZES = [(1031, 777), (37, 23), (2049, 1537), (1, 1), (16, 16), (1280, 2120), (1100, 4000)]
# Segmentation carries 29 channels: the wide sizes add run time but no new geometry.
CASES = [(size, name) for name in ("normal", "albedo", "matte", "pointmap") for size in SIZES]
CASES += [(size, "seg") for size in SIZES[:5]]


@pytest.mark.parametrize(("size", "pass_name"), CASES)
@pytest.mark.slow
def test_identity_model_round_trip_is_bit_exact(size, pass_name):
    image = _test_image(*size)
    plan = plan_frame(*size, pass_name)
    model = IdentityModel()
    blended = _blend_through(image, plan, model, pass_name)
    expected = model.predict_batch(image[None], pass_name)[pass_name][0]
    assert blended.shape == expected.shape
    assert np.array_equal(_bits(blended), _bits(expected))
    if pass_name != "seg":
        source = image if pass_name != "matte" else image[:1]
        assert np.array_equal(_bits(blended), _bits(source))


@pytest.mark.parametrize("overlap", [0, 1, 37, 300, 700])
def test_identity_is_bit_exact_for_any_overlap(overlap):
    image = _test_image(1100, 1300, seed=overlap)
    plan = plan_frame(1100, 1300, "albedo", overlap=overlap)
    blended = _blend_through(image, plan, IdentityModel(), "albedo")
    assert np.array_equal(_bits(blended), _bits(image))


def test_identity_round_trip_of_an_8k_frame_is_bit_exact():
    # One 3-channel float32 frame (about 400 MB) and one accumulator; tiles go a few at a time.
    height, width = 4320, 7680
    image = torch.rand((3, height, width), generator=torch.Generator().manual_seed(8))
    plan = plan_frame(height, width, "normal")
    blended = _blend_through(image, plan, IdentityModel(), "normal", batch=6)
    assert torch.equal(blended, image)


@pytest.mark.parametrize("size", [(2160, 3840), (1031, 777), (1, 1), (64, 64)])
def test_backbone4k_padding_crops_back_exactly(size):
    image = _test_image(*size, seed=4)
    plan = plan_frame(*size, "backbone4k")
    assert all(side % 64 == 0 for side in plan.tile_shape)
    blended = _blend_through(image, plan, IdentityModel(), "normal")
    assert np.array_equal(_bits(blended), _bits(image))


def test_seg_probabilities_still_sum_to_one_after_blending_random_tiles():
    image = torch.zeros((3, 600, 500))
    plan = plan_frame(600, 500, "seg", tile_hw=(256, 192), overlap=64)
    assert len(plan.tiles) == 12
    blended = _blend_through(image, plan, RandomModel(seed=3), "seg")
    assert tuple(blended.shape) == (29, 600, 500)
    np.testing.assert_allclose(blended.sum(dim=0), 1.0, atol=2e-6)
    assert blended.min() >= 0.0 and blended.max() <= 1.0


def test_a_constant_model_blends_to_the_constant_exactly():
    image = torch.zeros((3, 2100, 1900))
    plan = plan_frame(2100, 1900, "albedo")
    blended = _blend_through(image, plan, ConstantModel(albedo=0.3), "albedo")
    assert (blended == np.float32(0.3)).all()


def test_seam_is_a_linear_crossfade_between_neighbouring_tiles():
    # Two tiles side by side: 0..768 and 640..1408, overlapping over 128 columns.
    plan = plan_frame(1024, 1408, "matte")
    left, right = plan.tiles
    blender = FrameBlender.for_plan(plan, 1)
    blender.add(left, torch.zeros((1, *left.shape)))
    blender.add(right, torch.ones((1, *right.shape)))
    row = blender.result()[0, 500]
    assert (row[:640] == 0).all() and (row[768:] == 1).all()
    seam = row[640:768].numpy()
    expected = (np.arange(128) + 0.5) / 128
    np.testing.assert_allclose(seam, expected, atol=1e-6)
    assert (np.diff(seam) > 0).all()


def test_blended_values_stay_within_the_tile_values():
    image = torch.zeros((3, 1200, 1000))
    plan = plan_frame(1200, 1000, "albedo")
    blended = _blend_through(image, plan, RandomModel(seed=5), "albedo")
    assert blended.min() >= 0.0 and blended.max() < 1.0


@pytest.mark.parametrize("size", [(1920, 1408), (2944, 3328)])
def test_weights_are_positive_and_sum_to_one_where_seams_do_not_cross(size):
    # Tile starts here are evenly spaced or shifted by less than half a tile, so no tile's
    # two ramps overlap: the feathered weights form a partition of unity over the frame.
    plan = plan_frame(*size, "normal")
    total = np.zeros(size, dtype=np.float64)
    for tile in plan.tiles:
        weights = feather_weights(tile)
        assert weights.shape == tile.shape
        assert weights.min() > 0 and weights.max() <= 1
        total[tile.box.slices] += weights
    np.testing.assert_allclose(total, 1.0, atol=1e-6)


def test_weights_are_strictly_positive_when_a_tile_overlaps_both_neighbours_heavily():
    plan = plan_frame(1930, 768, "normal")  # rows start at 0, 896 and 906
    assert [tile.box.y0 for tile in plan.tiles] == [0, 896, 906]
    for tile in plan.tiles:
        assert feather_weights(tile).min() > 0


def test_result_refuses_uncovered_pixels():
    plan = plan_frame(1500, 1000, "albedo")
    blender = FrameBlender.for_plan(plan, 3)
    blender.add(plan.tiles[0], torch.zeros((3, *plan.tile_shape)))
    assert blender.covered().any() and not blender.covered().all()
    with pytest.raises(ValueError, match="covered by no tile"):
        blender.result()


def test_add_refuses_values_of_the_wrong_shape():
    plan = plan_frame(100, 100, "normal")
    blender = FrameBlender.for_plan(plan, 3)
    with pytest.raises(ValueError, match="expected"):
        blender.add(plan.tiles[0], torch.zeros((29, 100, 100)))


def test_add_refuses_a_tile_from_a_larger_frame():
    blender = FrameBlender(100, 100, 3)
    other = plan_frame(2000, 2000, "normal")
    with pytest.raises(ValueError, match="outside"):
        blender.add(other.tiles[-1], torch.zeros((3, *other.tile_shape)))


def test_a_plan_without_tiles_cannot_be_blended():
    with pytest.raises(ValueError, match="no tiles"):
        FrameBlender.for_plan(plan_frame(100, 100, "pose"), 3)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize(("channels", "shuffle"), [(3, False), (3, True), (1, True), (29, True)])
def test_blending_equals_the_numpy_blender_it_replaced_in_any_tile_order(channels, shuffle):
    # Differing random tiles with awkward finite values, in plan order or shuffled (which
    # gives tiles whose earlier neighbours leave gaps): the device blender must equal the
    # host blender it replaced (tests/numpy_reference.py) bit for bit.
    rng = np.random.default_rng(11)
    height, width = (700, 900) if channels == 29 else (1300, 2100)
    plan = plan_frame(height, width, "albedo", tile_hw=(512, 384), overlap=96)
    values = [
        _test_image(*tile.shape, seed=int(rng.integers(1 << 30)))[:1]
        * torch.from_numpy(rng.random((channels, *tile.shape), dtype=np.float32))
        for tile in plan.tiles
    ]
    order = list(rng.permutation(len(plan.tiles))) if shuffle else list(range(len(plan.tiles)))
    blender = FrameBlender(height, width, channels)
    reference = numpy_reference.FrameBlender(height, width, None if channels == 1 else channels)
    for index in order:
        blender.add(plan.tiles[index], values[index])
        host = np.moveaxis(values[index].numpy(), 0, -1)
        reference.add(plan.tiles[index], host[..., 0] if channels == 1 else host)
    got = blender.result().numpy()
    expected = reference.result()
    expected = expected[None] if channels == 1 else np.moveaxis(expected, -1, 0)
    assert got.shape == (channels, height, width)
    assert np.array_equal(_bits(got), _bits(np.ascontiguousarray(expected)))


def test_a_tile_added_after_both_side_neighbours_keeps_its_own_values_in_the_gap():
    # Left and right tiles first, the middle one last: between the two strips it overlaps,
    # no earlier tile reached its pixels, so they are its values exactly, -0.0 included.
    plan = plan_frame(512, 1000, "matte", tile_hw=(512, 384), overlap=64)
    assert plan.cols == 3
    left, middle, right = plan.tiles
    blender = FrameBlender.for_plan(plan, 1)
    blender.add(left, torch.ones((1, *left.shape)))
    blender.add(right, torch.ones((1, *right.shape)))
    blender.add(middle, torch.full((1, *middle.shape), -0.0))
    result = blender.result()[0]
    gap = result[:, left.box.x1 : right.box.x0]
    assert gap.numel() and (gap == 0).all() and torch.signbit(gap).all()
    seams = torch.cat(
        [result[:, middle.box.x0 : left.box.x1], result[:, right.box.x0 : middle.box.x1]], dim=1
    )
    assert (seams > 0).all() and (seams < 1).all()


def test_non_finite_tile_values_leave_the_pixels_they_reach_non_finite():
    # The frame's outputs are refused when a pass holds NaN or Inf, so the blender must
    # never turn them finite: alone over a pixel they stay as they are, and where another
    # tile meets them the pixel is NaN or infinite.
    plan = plan_frame(512, 1000, "matte", tile_hw=(512, 384), overlap=64)
    left, middle, right = plan.tiles
    blender = FrameBlender.for_plan(plan, 1)
    blender.add(left, torch.full((1, *left.shape), float("inf")))
    blender.add(middle, torch.ones((1, *middle.shape)))
    poisoned = torch.ones((1, *right.shape))
    poisoned[0, 10, -1] = float("nan")
    blender.add(right, poisoned)
    result = blender.result()[0]
    assert torch.isinf(result[:, : middle.box.x0]).all()
    assert not torch.isfinite(result[:, middle.box.x0 : left.box.x1]).any()
    assert torch.isnan(result[10, -1]) and torch.isfinite(result[11, -1])


def test_covered_bands_are_the_top_and_left_strips_in_plan_order():
    plan = plan_frame(2160, 4096, "seg")
    box = plan.tiles[plan.cols + 1].box  # second row, second column
    earlier = [tile.box for tile in plan.tiles[: plan.cols + 1]]
    bands = covered_bands(box, earlier)
    overlap = plan.overlap
    assert bands == [
        Band(0, overlap, 0, box.width, False),
        Band(overlap, box.height, 0, overlap, False),
    ]
    assert covered_bands(plan.tiles[0].box, []) == [Band(0, 1024, 0, 0, False)]


def test_covered_bands_mark_a_band_reached_in_separate_runs_as_partial():
    box = Region(0, 0, 100, 300)
    bands = covered_bands(box, [Region(0, 0, 100, 50), Region(0, 250, 100, 400)])
    assert bands == [Band(0, 100, 0, 300, True)]
