"""Temporal stabilisation of dense passes: it reduces a per-frame network's error on a moving
synthetic shot without ghosting at boundaries, gives the same frames in chunks as in one run,
blends nothing across a cut or a hole, leaves a static shot and short shots as they are, and
pulls a bad frame or a label swap to its neighbours; all of it also when the fusion runs at a
reduced size (as a 4K plate's does) and is lifted back to the plate's."""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.temporal import quality, run_shot
from bench.temporal_scene import PASS_KINDS, Scene, model, render
from tasks.stabilise.lift import _RowUpsampler, lift_frame, plate_pixels
from tasks.stabilise.rules import (
    DISTANCE,
    chord,
    on_person,
    robust_mean,
    warp_relative_depth,
    warp_with_certainty,
)
from tasks.stabilise.settings import DEFAULT_FUSION, FusionSettings
from tasks.stabilise.stabiliser import TemporalStabiliser, sampling_grid

SMALL = Scene(192, 108, 20)
MOVING = Scene(320, 180, 20)
HW = (SMALL.height, SMALL.width)
# The plate's own size (192x108 is under max_side) and a 4x reduction, as a 4096x2160 plate
# is fused at 1024x540.
REDUCED = replace(DEFAULT_FUSION, max_side=48)
SIZES = pytest.mark.parametrize("settings", [DEFAULT_FUSION, REDUCED], ids=["plate", "reduced"])


@pytest.fixture(autouse=True)
def _one_thread():
    """Small frames: a second intra-op thread only waits (and spins) on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad():
        yield
    torch.set_num_threads(threads)


def _frame(scene: Scene, index: int) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
    truth = render(scene, index)
    passes, _ = model(scene, index, truth)
    return truth.plate, {name: torch.from_numpy(values) for name, values in passes.items()}


def _copies(passes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A frame's own tensors: a reduced fusion writes its result into the ones pushed."""
    return {name: values.clone() for name, values in passes.items()}


def _stream(scene: Scene, indices, settings=DEFAULT_FUSION) -> dict[int, dict[str, np.ndarray]]:
    stabiliser = TemporalStabiliser(PASS_KINDS, (scene.height, scene.width), "cpu", settings)
    out = {}
    for index in indices:
        plate, passes = _frame(scene, index)
        for result in stabiliser.push(scene.first_frame + index, plate, passes):
            out[result.frame] = {n: v.numpy() for n, v in result.passes.items()}
    for result in stabiliser.flush():
        out[result.frame] = {n: v.numpy() for n, v in result.passes.items()}
    return out


# What the moving test asserts, per pass: the error ratio on the person (stabilised / per
# frame). The goal is 0.6; this short, small shot (no bad matte frame in it) meets it
# for every pass but depth and matte, and these bounds hold what was measured with a little
# margin (bench.temporal has the full figures): the matte's per-frame error is edge jitter of
# half a pixel, which the plate's flow does not locate better than that at the silhouette.
# Measured 2026-11-27: normal 0.57, pointmap 0.52, depth 0.73, albedo 0.60, matte 0.89, seg
# 0.41, pose 0.49. Each bound fails on the code before one of that day's changes: samples
# without certainty (``warp_with_certainty``; pointmap 0.66, depth 0.84, matte 0.98) or flow
# estimated at half this plate's size (``FlowSettings.finest_side``; normal 0.62, pointmap 0.56,
# depth 0.79, albedo 0.65, matte 0.92, seg 0.50). Relative depth, later that day over the
# person as seg found it (as the platform's is), 0.62: 0.70 before its person and its depth
# were fused apart with a slope certainty (``_Band.fuse_relative_depth``).
MOVING_BOUNDS = {"normal": 0.6, "pointmap": 0.55, "depth": 0.65, "albedo": 0.63, "matte": 0.915,
                 "seg": 0.44, "pose": 0.52}  # fmt: skip


def test_a_moving_shot_loses_error_and_gains_none_at_boundaries():
    figures = quality(run_shot(MOVING))
    for name, row in figures.items():
        assert row["person_ratio"] <= MOVING_BOUNDS[name], name
        if "boundary_ratio" in row:
            assert row["boundary_ratio"] <= 1.1, name  # no ghosting
    assert figures["pointmap"]["flicker_worst_fall"] >= 2.0  # its bad frame, pulled back
    assert figures["seg"]["flicker_worst_fall"] >= 1.5  # a label swap, undone


@pytest.mark.parametrize("direct", [False, True], ids=["composed", "direct"])
@SIZES
def test_a_chunk_with_a_margin_gives_the_frames_of_one_run(direct, settings):
    settings = replace(settings, direct_flow=direct)
    radius = settings.radius
    whole = _stream(SMALL, range(12), settings)
    own = range(5, 8)
    chunk = _stream(SMALL, range(own.start - radius, own.stop + radius), settings)
    for index in own:
        frame = SMALL.first_frame + index
        for name in PASS_KINDS:
            assert np.array_equal(chunk[frame][name], whole[frame][name]), (frame, name)


@SIZES
def test_nothing_is_blended_across_a_cut(settings):
    scene = replace(SMALL, frames=12, cut_at=6)
    whole = _stream(scene, range(12), settings)
    alone = {**_stream(scene, range(6), settings), **_stream(scene, range(6, 12), settings)}
    assert whole.keys() == alone.keys()
    for frame, passes in whole.items():
        for name, values in passes.items():
            assert np.array_equal(values, alone[frame][name]), (frame, name)


def test_a_hole_breaks_the_chain_and_the_flow():
    stabiliser = TemporalStabiliser(PASS_KINDS, HW, "cpu")
    results = []
    for index in (*range(0, 5), *range(7, 12)):
        plate, passes = _frame(SMALL, index)
        results += stabiliser.push(SMALL.first_frame + index, plate, passes)
    results += stabiliser.flush()
    by_frame = {r.frame: r for r in results}
    first = SMALL.first_frame
    assert sorted(by_frame) == [first + i for i in (*range(0, 5), *range(7, 12))]
    assert by_frame[first + 4].forward is None and by_frame[first + 7].backward is None
    assert by_frame[first + 3].forward is not None and by_frame[first + 3].forward.shape == (*HW, 2)
    before = _stream(SMALL, range(0, 5))
    for name in PASS_KINDS:
        assert np.array_equal(by_frame[first + 4].passes[name].numpy(), before[first + 4][name])


@SIZES
def test_a_static_shot_comes_back_unchanged(settings):
    still = replace(SMALL, static=True)
    truth = render(still, 0)
    stabiliser = TemporalStabiliser(PASS_KINDS, HW, "cpu", settings)
    passes = {n: torch.from_numpy(v) for n, v in truth.passes.items()}
    results = []
    for index in range(6):
        results += stabiliser.push(1001 + index, truth.plate, _copies(passes))
    results += stabiliser.flush()
    assert len(results) == 6
    for result in results:
        for name, values in result.passes.items():
            assert values.dtype == torch.float32 and values.shape == passes[name].shape
            assert torch.allclose(values, passes[name], atol=1e-4), name


def test_a_shot_of_one_or_two_frames_comes_back_as_it_was():
    for count in (1, 2):
        stabiliser = TemporalStabiliser(PASS_KINDS, HW, "cpu")
        pushed = {}
        results = []
        for index in range(count):
            plate, passes = _frame(SMALL, index)
            pushed[1001 + index] = passes
            results += stabiliser.push(1001 + index, plate, passes)
        results += stabiliser.flush()
        assert [r.frame for r in results] == sorted(pushed)
        for result in results:
            for name, values in result.passes.items():
                assert torch.equal(values, pushed[result.frame][name])


@SIZES
def test_a_bad_frame_and_a_label_swap_are_pulled_to_their_neighbours(settings):
    still = replace(SMALL, static=True)
    truth = render(still, 0)
    good = {n: torch.from_numpy(v) for n, v in truth.passes.items()}
    bad = dict(good)
    tilted = good["normal"] + torch.tensor([0.0, 0.5, 0.0])[:, None, None]
    bad["normal"] = tilted / torch.linalg.vector_norm(tilted, dim=0, keepdim=True)
    bad["seg"] = good["seg"][[0, 1, 2, 4, 3, *range(5, good["seg"].shape[0])]]  # arms swapped
    stabiliser = TemporalStabiliser(PASS_KINDS, HW, "cpu", settings)
    results = []
    for index in range(7):
        results += stabiliser.push(1001 + index, truth.plate, _copies(bad if index == 3 else good))
    results += stabiliser.flush()
    fixed = results[3].passes
    assert (fixed["seg"].argmax(0).numpy() != truth.labels).mean() < 0.002
    cosine = (fixed["normal"] * good["normal"]).sum(0)
    assert cosine.min() > 0.99  # within 8 degrees everywhere (the bad frame was 27 off)
    for result in (results[2], results[4]):  # the neighbours are barely pulled by it
        cosine = (result.passes["normal"] * good["normal"]).sum(0).clamp(-1, 1)
        angle = torch.rad2deg(torch.arccos(cosine))
        assert angle.max() < 2.5 and angle.mean() < 0.5  # of the 27 degrees


@SIZES
def test_non_finite_values_do_not_spread(settings):
    still = replace(SMALL, static=True)
    truth = render(still, 0)
    good = {n: torch.from_numpy(v) for n, v in truth.passes.items()}
    everywhere = dict(good)
    everywhere["matte"] = good["matte"].clone()
    everywhere["matte"][:, 10:12, 10:12] = float("nan")
    holed = dict(everywhere)
    holed["albedo"] = good["albedo"].clone()
    holed["albedo"][:, 40:60, 80:120] = float("nan")
    stabiliser = TemporalStabiliser(PASS_KINDS, HW, "cpu", settings)
    results = []
    for index in range(5):
        results += stabiliser.push(
            1001 + index, truth.plate, _copies(holed if index == 2 else everywhere)
        )
    results += stabiliser.flush()
    for result in results:
        albedo = result.passes["albedo"]
        assert torch.isfinite(albedo).all()  # the hole is filled from the other frames
        assert torch.allclose(albedo, good["albedo"], atol=1e-4)
        matte = result.passes["matte"]
        assert torch.isnan(matte[:, 10:12, 10:12]).all()  # NaN in every frame stays NaN
        assert torch.isfinite(matte[:, 12:, 12:]).all()


@SIZES
def test_a_point_at_zero_depth_keeps_its_own_and_spreads_no_ray(settings):
    # a pixel with no point (0, 0, 0, as a model may leave one) has no ray (x/z is not finite):
    # the other frames fuse that pixel without it, and its own frame keeps it as it was. Each
    # frame's points are scaled apart (its rays the same), so fusing moves every point.
    still = replace(SMALL, static=True)
    truth = render(still, 0)
    frames = []
    for index in range(5):
        passes = {n: torch.from_numpy(v) for n, v in truth.passes.items()}
        passes["pointmap"] = passes["pointmap"] * (1.0 + 0.03 * (index - 2))
        frames.append(passes)
    patch = (slice(None), slice(50, 60), slice(90, 110))
    frames[2]["pointmap"][patch] = 0.0
    stabiliser = TemporalStabiliser(PASS_KINDS, HW, "cpu", settings)
    results = []
    for index, passes in enumerate(frames):
        results += stabiliser.push(1001 + index, truth.plate, _copies(passes))
    results += stabiliser.flush()
    assert [result.frame for result in results] == [1001, 1002, 1003, 1004, 1005]
    for index, result in enumerate(results):
        points = result.passes["pointmap"]
        assert torch.isfinite(points).all(), result.frame
        own = frames[index]["pointmap"]
        if index == 2:
            assert (points[patch] == 0.0).all()
            continue
        moved = (points[2] / own[2] - 1.0).abs()
        around = moved[40:70, 80:120].clone()
        around[10:20, 10:30] = float("nan")
        # the patch is fused like the pixels around it, not left as the frame's own
        assert moved[50:60, 90:110].min() > 0.5 * around.nanmedian(), result.frame


def test_bad_calls_are_refused():
    with pytest.raises(ValueError, match="no fusion rule"):
        TemporalStabiliser({"normal": "keypoints"}, HW, "cpu")
    with pytest.raises(ValueError, match="radius"):
        FusionSettings(radius=1)
    stabiliser = TemporalStabiliser(PASS_KINDS, HW, "cpu")
    plate, passes = _frame(SMALL, 0)
    stabiliser.push(1001, plate, passes)
    with pytest.raises(ValueError, match="pushed after"):
        stabiliser.push(1001, plate, passes)
    with pytest.raises(ValueError, match="matte"):
        stabiliser.push(1002, plate, {**passes, "matte": passes["matte"][:, :10]})


def test_the_reduced_fusion_near_edges_is_the_plate_size_fusion():
    """Where every pixel counts as near an edge, the reduced fusion fuses each at the plate's
    size: the same frames as fusing at the plate's size (but for ties in the medoid's choice,
    which the order of float sums can flip)."""
    everywhere = replace(REDUCED, edge=-1.0)
    exact = _stream(SMALL, range(8))
    lifted = _stream(SMALL, range(8), everywhere)
    differing = total = 0
    for frame, passes in exact.items():
        for name, values in passes.items():
            off = np.abs(values - lifted[frame][name]).max(axis=0) > 1e-4
            differing += int(off.sum())
            total += off.size
    assert differing <= total * 1e-4


def test_the_reduced_fusion_stabilises_a_moving_shot_like_the_plate_size_one():
    plate = run_shot(MOVING, indices=range(12))
    reduced = run_shot(MOVING, replace(DEFAULT_FUSION, max_side=160), indices=range(12))
    assert plate.plate_size_share == 1.0
    assert reduced.plate_size_share < 0.9  # a fifth of the pixels lifted from the fused 160x90
    exact, lifted = quality(plate), quality(reduced)
    for name, row in lifted.items():
        assert row["person_ratio"] <= exact[name]["person_ratio"] + 0.02, name
        if "boundary_ratio" in row:
            assert row["boundary_ratio"] <= exact[name]["boundary_ratio"] + 0.02, name


def _from_the_gathered_medoid(kind, samples, weights, scale):
    """One round of the robust mean the straightforward way: each pixel's medoid gathered from
    the samples (each pair's distance taken earlier sample first, as the fusion's medoid
    does), then every sample's distance to it and the reweighted mean."""
    distance, count = DISTANCE[kind], len(samples)
    costs = [torch.zeros_like(weights[0]) for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            d = distance(samples[i], samples[j])
            costs[i] += d * weights[j]
            costs[j] += d * weights[i]
    medoid, least = samples[0], costs[0]
    for j in range(1, count):
        better = (costs[j] < least) & (weights[j] > 0)
        medoid = torch.where(better, samples[j], medoid)
        least = torch.where(better, costs[j], least)
    robust = [w * torch.exp(-0.5 * (distance(x, medoid) / scale) ** 2) for x, w in
              zip(samples, weights, strict=True)]  # fmt: skip
    total = sum(robust) + 1e-6
    mean = (samples[0] * (robust[0] + 1e-6) + sum(x * w for x, w in zip(samples[1:], robust[1:],
            strict=True))) / total  # fmt: skip
    return mean


@pytest.mark.parametrize("kind", ["points", "labels", "unit_vectors"])
def test_the_robust_mean_starts_from_each_pixels_medoid_whichever_way_its_distance_runs(kind):
    # points' distance is relative to its second sample (|x - m| / |m|): samples of scales a
    # hundred apart make the medoid's distances differ either way round
    g = torch.Generator().manual_seed(3)
    scales = [1.0, 100.0, 0.5, 30.0, 2.0]
    samples = [torch.rand(3, 9, 11, generator=g) * scale for scale in scales]
    if kind == "labels":
        samples = [x / x.sum(dim=0) for x in samples]
    weights = [torch.rand(9, 11, generator=g) for _ in samples]
    weights[3][:4] = 0.0  # an untrusted sample is never the medoid
    fused = robust_mean(kind, samples, weights, scale=0.5, iterations=0)
    expected = _from_the_gathered_medoid(kind, samples, weights, 0.5)
    if kind == "unit_vectors":
        expected = expected / chord(expected, torch.zeros_like(expected))
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["points", "unit_vectors", "colour"])
def test_a_sample_whose_distances_overflow_leaves_its_pixel_a_number(kind):
    # the medoid selects with products of 0/1 masks, where an infinite distance would make
    # 0 x inf = NaN: its distances are held finite (a chord between values of 1e20 squares
    # past float32's range)
    g = torch.Generator().manual_seed(4)
    samples = [torch.rand(3, 5, 6, generator=g) + 1.0 for _ in range(5)]
    samples[3][:, 2, 3] = 1e20
    weights = [torch.rand(5, 6, generator=g) for _ in samples]
    weights[4][2, 3] = 0.0
    fused = robust_mean(kind, samples, weights, scale=0.5, iterations=2)
    assert torch.isfinite(fused).all()


def test_class_probabilities_are_fused_at_half_the_side_of_the_other_passes():
    kinds = {"normal": "unit_vectors", "seg": "labels", "matte": "alpha"}

    def groups(plate_hw):
        return TemporalStabiliser(kinds, plate_hw, "cpu").groups

    assert groups((2160, 4096)) == [((540, 1024), ("normal", "matte")), ((270, 512), ("seg",))]
    assert groups((432, 768)) == [((432, 768), ("normal", "matte")), ((288, 512), ("seg",))]
    assert groups((216, 384)) == [((216, 384), ("normal", "seg", "matte"))]  # all at its own
    one_size = replace(DEFAULT_FUSION, label_reduction=1)
    assert TemporalStabiliser(kinds, (2160, 4096), "cpu", one_size).groups == [
        ((540, 1024), ("normal", "seg", "matte"))
    ]
    with pytest.raises(ValueError, match="label_reduction"):
        replace(DEFAULT_FUSION, label_reduction=0)


def test_a_plate_between_the_two_sides_fuses_seg_reduced_and_the_rest_at_its_own_size():
    # 192x108 with the other passes at their own size and seg at 48x27: one frame comes out of
    # both kinds of fusion, seg lifted into the pushed tensor, the rest as new fused tensors
    mixed = replace(DEFAULT_FUSION, max_side=192, label_reduction=4)
    assert [hw for hw, _ in TemporalStabiliser(PASS_KINDS, HW, "cpu", mixed).groups] == [
        (108, 192),
        (27, 48),
    ]
    one_size = _stream(SMALL, range(8), replace(mixed, label_reduction=1))
    apart = _stream(SMALL, range(8), mixed)
    assert apart.keys() == one_size.keys()
    for frame, passes in apart.items():
        for name, values in passes.items():
            if name != "seg":  # the groups are fused apart: the others' values are the same
                np.testing.assert_array_equal(values, one_size[frame][name], err_msg=name)
        np.testing.assert_allclose(passes["seg"].sum(axis=0), 1.0, atol=1e-4)
        # seg fused at 48x27 and lifted is near seg fused at the plate's size, much nearer
        # than the frame's own (measured 0.001-0.002 against 0.010-0.014 total variation)
        per_frame = _frame(SMALL, frame - SMALL.first_frame)[1]["seg"].numpy()

        def apart_from_one_size(seg, frame=frame):
            return np.abs(seg - one_size[frame]["seg"]).sum(axis=0).mean() / 2

        assert 0 < apart_from_one_size(passes["seg"]) < 0.3 * apart_from_one_size(per_frame)


def test_the_row_upsampler_is_bilinear_interpolation():
    field = torch.rand(3, 7, 11)
    expected = F.interpolate(field[None], size=(30, 45), mode="bilinear", align_corners=False)[0]
    upsampler = _RowUpsampler(field, (30, 45))
    bands = torch.cat([upsampler.rows(slice(0, 13)), upsampler.rows(slice(13, 30))], dim=1)
    assert torch.allclose(bands, expected, atol=1e-6)
    some = torch.tensor([2, 0])
    assert torch.allclose(upsampler.rows(slice(5, 9), some), expected[[2, 0], 5:9], atol=1e-6)


def _taps(size: int, low: int) -> tuple[np.ndarray, np.ndarray]:
    """The two source positions bilinear interpolation (align_corners=False) reads for each of
    ``size`` positions upsampled from ``low``."""
    source = np.clip((np.arange(size) + 0.5) * low / size - 0.5, 0.0, None)
    first = np.minimum(np.floor(source).astype(int), low - 1)
    return first, np.minimum(first + 1, low - 1)


@pytest.mark.parametrize("low, plate", [((7, 11), (28, 44)), ((7, 11), (30, 47)),
                                        ((5, 3), (5, 3)), ((1, 4), (3, 17))])  # fmt: skip
def test_the_plate_pixels_fused_again_are_those_the_lift_reads_an_edge_pixel_for(low, plate):
    g = torch.Generator().manual_seed(5)
    edges = torch.rand(low, generator=g) < 0.15
    edges[0, 0] = True
    found = plate_pixels(edges, plate)
    assert torch.all(found[1:] > found[:-1])  # in order, once each
    # exactly the pixels one of whose taps, of the rows and of the columns, is an edge pixel
    rows, cols = _taps(plate[0], low[0]), _taps(plate[1], low[1])
    reads = np.zeros(plate, dtype=bool)
    for row_taps in rows:
        for col_taps in cols:
            reads |= edges.numpy()[np.ix_(row_taps, col_taps)]
    np.testing.assert_array_equal(found.numpy(), np.flatnonzero(reads))
    # and what the upsampling carries from the edge pixels reaches no other pixel
    field = torch.rand(1, *low, generator=g)
    moved = field + edges * (1.0 + torch.rand(1, *low, generator=g))

    def up(values):
        return F.interpolate(values[None], size=plate, mode="bilinear", align_corners=False)[0]

    bled = (up(field) != up(moved))[0].reshape(-1).nonzero().squeeze(1)
    assert set(bled.tolist()) <= set(found.tolist())


def test_lifted_probabilities_stay_probabilities_and_absent_classes_stay_as_they_were():
    probabilities = torch.zeros(5, 16, 16)
    probabilities[0] = 0.7
    probabilities[1] = 0.3
    probabilities[4, :, :8] = 1e-5  # nearly absent, and the fusion does not move it
    reduced = F.avg_pool2d(probabilities[None], 4)[0]
    fused = reduced.clone()
    fused[0] -= 0.5  # more than the class has in places: clamped at 0, then rescaled
    fused[1] += 0.5
    lifted = probabilities.clone()
    lift_frame({"seg": lifted}, {"seg": reduced}, {"seg": fused}, {"seg": "labels"})
    assert (lifted >= 0).all()
    assert torch.allclose(lifted.sum(0), probabilities.sum(0), atol=1e-6)
    assert torch.equal(lifted[4], probabilities[4])
    assert (lifted[1] > lifted[0]).all()


@pytest.mark.parametrize("max_side", [96, 24], ids=["plate", "reduced"])
def test_relative_depth_is_never_blended_with_the_background_it_stands_on(max_side):
    # a figure's relative depth (0.5) on -1 (not the person) moving 0.6 px a frame: a
    # neighbour sampled between two pixels at the silhouette must not bring values in between
    # (a depth of -0.25 is neither the person nor the background)
    rng = np.random.default_rng(1)
    texture = cv2.GaussianBlur(rng.random((64, 160), dtype=np.float32), (0, 0), 2.0)
    settings = replace(DEFAULT_FUSION, max_side=max_side)
    stabiliser = TemporalStabiliser({"depth": "relative_depth"}, (64, 96), "cpu", settings)
    out = []
    for index in range(8):
        x = 20 + 0.6 * index
        shift = np.float32([[1, 0, x - 20]])
        moved = cv2.warpAffine(texture, np.vstack([shift, [[0, 1, 0]]]), (96, 64))
        plate = np.repeat(0.2 + 0.6 * moved[..., None], 3, axis=-1)
        cols = np.arange(96)[None, :]
        rows = np.arange(64)[:, None]
        inside = (cols >= x) & (cols < x + 30) & (rows >= 16) & (rows < 48)
        depth = np.where(inside, 0.5 + 0.02 * rng.standard_normal((64, 96)), -1.0)
        tensors = {"depth": torch.from_numpy(depth.astype(np.float32))[None]}
        out += stabiliser.push(1001 + index, plate.astype(np.float32), tensors)
    out += stabiliser.flush()

    values = torch.cat([r.passes["depth"].flatten() for r in out])
    assert len(out) == 8
    between = (values > -0.95) & (values < 0.4)
    assert not between.any(), values[between][:10]


def test_a_sample_straddling_an_edge_of_its_frame_loses_its_weight_one_on_a_slope_keeps_it():
    # normals of a crease (facing left | facing right at column 8) beside a gentle slope
    # (rows 4..7), sampled 0.4 px to the right: on the slope the bilinear sample and the
    # nearest pixel agree; the sample whose taps straddle the crease lies between two surfaces
    # and is uncertain, the others are not
    normals = torch.zeros(3, 8, 16)
    normals[0, :4, :8], normals[0, :4, 8:] = -0.6, 0.6
    normals[2, :4] = -0.8
    tilt = torch.linspace(-0.2, 0.2, 16)
    normals[0, 4:], normals[2, 4:] = tilt, -(1 - tilt**2).sqrt()
    flow = torch.zeros(8, 16, 2)
    flow[..., 0] = 0.4
    sample, certainty = warp_with_certainty(normals, sampling_grid(flow), chord, 0.18)

    assert certainty[1, 7] < 0.05  # 0.6 of the left face, 0.4 of the right: a chord of 0.48
    assert (certainty[1, :7] == 1).all() and (certainty[1, 8:] == 1).all()
    assert (certainty[4:] > 0.99).all()  # the slope
    assert torch.allclose(sample[:, 4:, :15], 0.6 * normals[:, 4:, :15] + 0.4 * normals[:, 4:, 1:])


def test_relative_depth_is_interpolated_on_the_person_and_uncertain_at_its_silhouette():
    # a ramp on the person (columns 4..11) and -1 beside it, sampled 0.4 px to the right:
    # inside, 0.6 of a pixel plus 0.4 of the next (nearest sampling would be 0.04 off); a
    # sample whose taps straddle the silhouette takes the side most of it is on, with little
    # certainty (|2 x 0.6 - 1| = 0.2); off the person -1, certain
    ramp = torch.full((1, 3, 16), -1.0)
    ramp[0, :, 4:12] = torch.arange(8, dtype=torch.float32) * 0.01
    flow = torch.zeros(3, 16, 2)
    flow[..., 0] = 0.4
    depth, certainty, steadiness = warp_relative_depth(on_person(ramp), sampling_grid(flow))

    row, weight = depth[0, 1], certainty[1]
    assert torch.allclose(row[4:11], torch.arange(7) * 0.01 + 0.004, atol=1e-6)
    assert row[3] == -1 and weight[3] == pytest.approx(0.2, abs=1e-5)  # 0.6 of -1, 0.4 of 0.0
    assert row[11] == pytest.approx(0.07) and weight[11] == pytest.approx(
        0.2, abs=1e-5
    )  # 0.6 of 0.07
    assert (row[:3] == -1).all() and (row[12:] == -1).all()
    assert torch.allclose(weight[[0, 1, 2, 5, 8, 12, 15]], torch.ones(7))
    assert (steadiness[1] > 0.99).all()  # a gentle slope: 0.004 from the nearest pixel


def test_a_relative_depth_sample_on_a_steep_rim_is_uncertain_one_on_a_gentle_slope_is_not():
    # the person's rim, where its depth runs to the background's within a pixel or two (0.3 a
    # pixel, columns 7..11), beside a gentle slope (0.01 a pixel), sampled 0.4 px to the right:
    # on the rim a flow that far off moves the sample by 0.12 from the nearest pixel's depth
    depth = torch.full((1, 2, 16), -1.0)
    depth[0, :, :8] = torch.arange(8, dtype=torch.float32) * 0.01
    depth[0, :, 8:12] = 0.07 + torch.arange(1, 5, dtype=torch.float32) * 0.3
    flow = torch.zeros(2, 16, 2)
    flow[..., 0] = 0.4
    _, certainty, steadiness = warp_relative_depth(on_person(depth), sampling_grid(flow))

    assert (steadiness[:, :7] > 0.99).all()
    assert (steadiness[:, 7:11] < 0.15).all()  # 0.12 off: exp(-0.5 x (0.12 / 0.06)^2)
    assert (certainty[:, :11] == 1).all()  # every tap on the person: which side is sure


@pytest.mark.parametrize("max_side", [96, 24], ids=["plate", "reduced"])
def test_where_the_person_is_follows_the_frames_vote_and_its_depth_the_frames_on_it(max_side):
    # a still figure (depth 0.5 +- 0.02) whose per-frame mask, in one frame, misses a block of
    # it and takes in a block of the background: the fused frame has the figure's depth where
    # the other frames had it (not -1, not a blend with -1), and -1 where only it saw a person
    rng = np.random.default_rng(2)
    texture = cv2.GaussianBlur(rng.random((64, 96), dtype=np.float32), (0, 0), 2.0)
    plate = np.repeat(0.2 + 0.6 * texture[..., None], 3, axis=-1)
    settings = replace(DEFAULT_FUSION, max_side=max_side)
    stabiliser = TemporalStabiliser({"depth": "relative_depth"}, (64, 96), "cpu", settings)
    inside = np.zeros((64, 96), bool)
    inside[16:48, 20:60] = True
    out = []
    for index in range(7):
        depth = np.where(inside, 0.5 + 0.02 * rng.standard_normal((64, 96)), -1.0)
        if index == 3:
            depth[30:34, 38:42] = -1.0  # missed
            depth[4:8, 70:74] = 0.5  # taken in
        tensors = {"depth": torch.from_numpy(depth.astype(np.float32))[None]}
        out += stabiliser.push(1001 + index, plate, tensors)
    out += stabiliser.flush()

    fused = next(r for r in out if r.frame == 1004).passes["depth"][0]
    assert (fused[30:34, 38:42] - 0.5).abs().max() < 0.05
    assert (fused[4:8, 70:74] == -1).all()


def test_a_non_finite_relative_depth_gives_a_sample_without_weight_not_the_background():
    depth = torch.full((1, 4, 8), 0.5)
    depth[0, :, 3] = float("nan")
    warped, *_ = warp_relative_depth(on_person(depth), sampling_grid(torch.zeros(4, 8, 2)))
    assert torch.isnan(warped[0, :, 3]).all() and (warped[0, :, [0, 6]] == 0.5).all()


def test_a_plate_too_small_for_flow_comes_back_unchanged():
    # under 16 pixels a side optical flow cannot run (DIS crashed on some such sizes)
    stabiliser = TemporalStabiliser({"matte": "alpha"}, (12, 64), "cpu")
    rng = np.random.default_rng(0)
    pushed, out = [], []
    for index in range(5):
        matte = torch.from_numpy(rng.random((1, 12, 64), dtype=np.float32))
        pushed.append(matte.clone())
        plate = rng.random((12, 64, 3), dtype=np.float32)
        out += stabiliser.push(1001 + index, plate, {"matte": matte})
    out += stabiliser.flush()

    assert [r.frame for r in out] == list(range(1001, 1006))
    for result, matte in zip(out, pushed, strict=True):
        assert torch.equal(result.passes["matte"], matte) and result.forward is None
