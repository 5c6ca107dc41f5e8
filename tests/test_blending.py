"""Blending tiles back: identity is bit-exact, seams feather, probabilities stay normalised."""

from __future__ import annotations

import numpy as np
import pytest

from bench.standins import ConstantModel, IdentityModel, RandomModel
from tasks.blending import FrameBlender, feather_weights
from tasks.tiling import FramePlan, extract_tiles, plan_frame

CHANNELS = {"normal": 3, "albedo": 3, "pointmap": 3, "seg": 29, "matte": None}


def _blend_through(image: np.ndarray, plan: FramePlan, model, output: str, batch: int = 4):
    """plan -> extract (a batch at a time) -> predict -> blend, as the worker does."""
    model_pass = "normal" if plan.pass_name == "backbone4k" else plan.pass_name
    blender = FrameBlender.for_plan(plan, CHANNELS[output])
    for first in range(0, len(plan.tiles), batch):
        indices = list(range(first, min(first + batch, len(plan.tiles))))
        tiles = extract_tiles(image, plan, indices)
        values = model.predict(tiles, [model_pass])[output]
        for index, tile_values in zip(indices, values, strict=True):
            blender.add(plan.tiles[index], tile_values)
    return blender.result()


def _bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).view(np.uint32)


def _test_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Random pixels with the values float arithmetic likes to get wrong sprinkled in."""
    rng = np.random.default_rng(seed)
    image = rng.random((height, width, 3), dtype=np.float32)
    awkward = np.array(
        [-0.0, 0.0, 1e-42, -1e-42, 3.4e38, -3.4e38, np.inf, -np.inf, 1 / 3, 0.1, 7.0],
        dtype=np.float32,
    )
    mask = rng.random((height, width, 3)) < 0.05
    image[mask] = rng.choice(awkward, size=int(mask.sum()))
    return image


SIZES = [(1031, 777), (37, 23), (2049, 1537), (1, 1), (16, 16), (1280, 2120), (1100, 4000)]
# Segmentation carries 29 channels: the wide sizes add run time but no new geometry.
CASES = [(size, name) for name in ("normal", "albedo", "matte", "pointmap") for size in SIZES]
CASES += [(size, "seg") for size in SIZES[:5]]


@pytest.mark.parametrize(("size", "pass_name"), CASES)
def test_identity_model_round_trip_is_bit_exact(size, pass_name):
    image = _test_image(*size)
    plan = plan_frame(*size, pass_name)
    model = IdentityModel()
    blended = _blend_through(image, plan, model, pass_name)
    expected = model.predict(image[None], [pass_name])[pass_name][0]
    assert blended.shape == expected.shape
    assert np.array_equal(_bits(blended), _bits(expected))
    if pass_name != "seg":
        source = image if pass_name != "matte" else image[..., 0]
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
    image = np.random.default_rng(8).random((height, width, 3), dtype=np.float32)
    plan = plan_frame(height, width, "normal")
    blended = _blend_through(image, plan, IdentityModel(), "normal", batch=6)
    assert np.array_equal(_bits(blended), _bits(image))


@pytest.mark.parametrize("size", [(2160, 3840), (1031, 777), (1, 1), (64, 64)])
def test_backbone4k_padding_crops_back_exactly(size):
    image = _test_image(*size, seed=4)
    plan = plan_frame(*size, "backbone4k")
    assert all(side % 64 == 0 for side in plan.tile_shape)
    blended = _blend_through(image, plan, IdentityModel(), "normal")
    assert np.array_equal(_bits(blended), _bits(image))


def test_seg_probabilities_still_sum_to_one_after_blending_random_tiles():
    image = np.zeros((600, 500, 3), dtype=np.float32)
    plan = plan_frame(600, 500, "seg", tile_hw=(256, 192), overlap=64)
    assert len(plan.tiles) == 12
    blended = _blend_through(image, plan, RandomModel(seed=3), "seg")
    assert blended.shape == (600, 500, 29)
    np.testing.assert_allclose(blended.sum(axis=-1), 1.0, atol=2e-6)
    assert blended.min() >= 0.0 and blended.max() <= 1.0


def test_a_constant_model_blends_to_the_constant_exactly():
    image = np.zeros((2100, 1900, 3), dtype=np.float32)
    plan = plan_frame(2100, 1900, "albedo")
    blended = _blend_through(image, plan, ConstantModel(albedo=0.3), "albedo")
    assert (blended == np.float32(0.3)).all()


def test_seam_is_a_linear_crossfade_between_neighbouring_tiles():
    # Two tiles side by side: 0..768 and 640..1408, overlapping over 128 columns.
    plan = plan_frame(1024, 1408, "matte")
    left, right = plan.tiles
    blender = FrameBlender.for_plan(plan, None)
    blender.add(left, np.zeros(left.shape, dtype=np.float32))
    blender.add(right, np.ones(right.shape, dtype=np.float32))
    row = blender.result()[500]
    assert (row[:640] == 0).all() and (row[768:] == 1).all()
    seam = row[640:768]
    expected = (np.arange(128) + 0.5) / 128
    np.testing.assert_allclose(seam, expected, atol=1e-6)
    assert (np.diff(seam) > 0).all()


def test_blended_values_stay_within_the_tile_values():
    image = np.zeros((1200, 1000, 3), dtype=np.float32)
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
    blender.add(plan.tiles[0], np.zeros((*plan.tile_shape, 3), dtype=np.float32))
    assert blender.covered().any() and not blender.covered().all()
    with pytest.raises(ValueError, match="covered by no tile"):
        blender.result()


def test_add_refuses_values_of_the_wrong_shape():
    plan = plan_frame(100, 100, "normal")
    blender = FrameBlender.for_plan(plan, 3)
    with pytest.raises(ValueError, match="expected"):
        blender.add(plan.tiles[0], np.zeros((100, 100, 29), dtype=np.float32))


def test_add_refuses_a_tile_from_a_larger_frame():
    blender = FrameBlender(100, 100, 3)
    other = plan_frame(2000, 2000, "normal")
    with pytest.raises(ValueError, match="outside"):
        blender.add(other.tiles[-1], np.zeros((*other.tile_shape, 3), dtype=np.float32))


def test_a_plan_without_tiles_cannot_be_blended():
    with pytest.raises(ValueError, match="no tiles"):
        FrameBlender.for_plan(plan_frame(100, 100, "pose"), 3)


def _reference_blend(plan: FramePlan, values: list[np.ndarray], order: list[int]) -> np.ndarray:
    """The module docstring's running mean over whole tiles, written out plainly: a pixel's
    first tile is copied; later ones step m + (v - m) * t, and v is copied where v == m,
    except that m = +0.0 stays where v = -0.0 (the documented exception)."""
    mean = np.zeros((plan.height, plan.width, *values[0].shape[2:]), dtype=np.float32)
    weight_sum = np.zeros((plan.height, plan.width), dtype=np.float32)
    for index in order:
        tile = plan.tiles[index]
        new = values[index][tile.valid.slices]
        m, s = mean[tile.box.slices], weight_sum[tile.box.slices]
        first = s == 0
        s += feather_weights(tile)
        step = feather_weights(tile) / s
        if new.ndim == 3:
            step, first = step[..., None], first[..., None]
        with np.errstate(invalid="ignore", over="ignore"):
            blended = m + (new - m) * step
        keep_plus_zero = (m == 0) & ~np.signbit(m) & np.signbit(new) & (new == 0)
        np.copyto(blended, new, where=(new == m) & ~keep_plus_zero)
        np.copyto(blended, new, where=np.broadcast_to(first, new.shape))
        m[...] = blended
    return mean


@pytest.mark.parametrize(("channels", "shuffle"), [(3, False), (3, True), (None, True), (29, True)])
def test_blending_matches_the_reference_running_mean_in_any_tile_order(channels, shuffle):
    # Differing random tiles with awkward values, in plan order or shuffled (which gives
    # tiles whose earlier neighbours leave gaps): the result must equal the plain running
    # mean bit for bit (NaN where it is NaN).
    rng = np.random.default_rng(11)
    height, width = (700, 900) if channels == 29 else (1300, 2100)
    plan = plan_frame(height, width, "albedo", tile_hw=(512, 384), overlap=96)
    trailing = () if channels is None else (channels,)
    values = [
        _test_image(*tile.shape, seed=int(rng.integers(1 << 30)))[..., 0] for tile in plan.tiles
    ]
    values = [
        np.repeat(v[..., None], channels, axis=-1)
        * rng.random((*v.shape, channels), dtype=np.float32)
        if channels
        else v
        for v in values
    ]
    order = list(rng.permutation(len(plan.tiles))) if shuffle else list(range(len(plan.tiles)))
    blender = FrameBlender(height, width, channels)
    for index in order:
        blender.add(plan.tiles[index], values[index])
    got = blender.result()
    expected = _reference_blend(plan, values, order)
    assert got.shape == (height, width, *trailing)
    same = (_bits(got) == _bits(expected)) | (np.isnan(got) & np.isnan(expected))
    assert same.all()


def test_a_tile_added_after_both_side_neighbours_keeps_its_own_values_in_the_gap():
    # Left and right tiles first, the middle one last: between the two strips it overlaps,
    # no earlier tile reached its pixels, so they are its values exactly, -0.0 included.
    plan = plan_frame(512, 1000, "matte", tile_hw=(512, 384), overlap=64)
    assert plan.cols == 3
    left, middle, right = plan.tiles
    blender = FrameBlender.for_plan(plan, None)
    blender.add(left, np.ones(left.shape, dtype=np.float32))
    blender.add(right, np.ones(right.shape, dtype=np.float32))
    blender.add(middle, np.full(middle.shape, -0.0, dtype=np.float32))
    result = blender.result()
    gap = result[:, left.box.x1 : right.box.x0]
    assert gap.size and (gap == 0).all() and np.signbit(gap).all()
    seams = np.concatenate(
        [result[:, middle.box.x0 : left.box.x1], result[:, right.box.x0 : middle.box.x1]], axis=1
    )
    assert (seams > 0).all() and (seams < 1).all()
