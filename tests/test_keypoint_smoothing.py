"""Pose keypoints smoothed over time: jitter falls while people are followed through a shuffled
person order, NaN people stay NaN, a chunk with a margin gives the frames of one run, nothing
is smoothed across a cut or a hole, an outlier is pulled back, one frame comes back as it was."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.stabilise.smoothing import KeypointSmoother, SmoothingSettings, match_people

FRAMES = 30
K = 12


def _truth(frames: int = FRAMES) -> np.ndarray:
    """(frames, 2 people, K, 3): two people walking and swinging, score 1."""
    t = np.arange(frames, dtype=np.float64)[:, None]
    k = np.arange(K, dtype=np.float64)[None, :]
    people = np.zeros((frames, 2, K, 3))
    for p, (start, speed) in enumerate(((100.0, 3.0), (400.0, -2.0))):
        people[:, p, :, 0] = start + speed * t + 8 * np.cos(k) + 6 * np.sin(0.3 * t + k)
        people[:, p, :, 1] = 200.0 + 15 * k + 4 * np.cos(0.25 * t + 2 * k)
    people[..., 2] = 1.0
    return people


def _model(truth: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: jittered keypoints with scores, a NaN padding row, the order shuffled, the
    second person missing for frames 10-12. Returns (observed, the truth in the same order)."""
    rng = np.random.default_rng(seed)
    frames = len(truth)
    observed = np.full((frames, 3, K, 3), np.nan)
    answer = np.full((frames, 3, K, 3), np.nan)
    for f in range(frames):
        rows = np.full((3, K, 3), np.nan)
        rows[:2] = truth[f]
        if 10 <= f <= 12:
            rows[1] = np.nan
        order = rng.permutation(3)
        answer[f] = rows[order]
        noisy = rows.copy()
        noisy[..., :2] += rng.normal(0.0, 2.0, noisy[..., :2].shape)
        noisy[..., 2] = rng.uniform(0.5, 1.0, noisy.shape[:2])
        noisy[np.isnan(rows[..., 0])] = np.nan
        observed[f] = noisy[order]
    return observed, answer


def _run(observed: np.ndarray, frames, smoother=None, cuts=()) -> dict[int, np.ndarray]:
    smoother = smoother or KeypointSmoother()
    out = {}
    for f in frames:
        out.update(smoother.push(1001 + f, observed[f], cut=f in cuts))
    out.update(smoother.flush())
    return out


def _error(result: dict[int, np.ndarray], answer: np.ndarray) -> float:
    gaps = [np.hypot(*(result[1001 + f][..., :2] - answer[f][..., :2]).T) for f in range(FRAMES)]
    return float(np.nanmean(np.stack(gaps)))


def test_jitter_falls_and_people_are_followed_through_a_shuffled_order():
    observed, answer = _model(_truth())
    result = _run(observed, range(FRAMES))
    assert sorted(result) == [1001 + f for f in range(FRAMES)]
    per_frame = float(np.nanmean(np.hypot(*(observed[..., :2] - answer[..., :2]).T)))
    assert _error(result, answer) <= 0.6 * per_frame
    for f in range(FRAMES):  # same order, scores and NaN rows as the frame's own
        assert np.array_equal(np.isnan(result[1001 + f]), np.isnan(observed[f]))
        assert np.array_equal(result[1001 + f][..., 2], observed[f][..., 2], equal_nan=True)


def test_a_chunk_with_a_margin_gives_the_frames_of_one_run():
    observed, _ = _model(_truth())
    radius = SmoothingSettings().radius
    whole = _run(observed, range(FRAMES))
    chunk = _run(observed, range(12 - radius, 18 + radius))
    for f in range(12, 18):
        assert np.array_equal(chunk[1001 + f], whole[1001 + f], equal_nan=True)


def test_nothing_is_smoothed_across_a_cut_or_a_hole():
    observed, _ = _model(_truth())
    observed[15:, :, :, 0] += 500.0  # another shot: everyone elsewhere
    cut = _run(observed, range(FRAMES), cuts={15})
    before = _run(observed, range(15))
    after = _run(observed, range(15, FRAMES))
    for f in range(FRAMES):
        alone = before if f < 15 else after
        assert np.array_equal(cut[1001 + f], alone[1001 + f], equal_nan=True)
    holed = _run(observed, [*range(0, 8), *range(10, 15)])
    assert 1009 not in holed and 1010 not in holed
    assert np.array_equal(holed[1008], _run(observed, range(0, 8))[1008], equal_nan=True)


def test_an_outlier_is_pulled_back_to_the_track():
    truth = _truth()
    observed = truth.copy()
    observed[14, 0, 3, :2] += (40.0, -30.0)  # the keypoint jumped for one frame
    result = _run(observed, range(FRAMES))
    assert np.hypot(*(result[1015][0, 3, :2] - truth[14, 0, 3, :2])) < 1.0
    # a clean track comes back close to itself (the quadratic follows the swing)
    assert np.abs(result[1005][..., :2] - truth[4][..., :2]).max() < 0.5


def test_one_frame_or_nobody_comes_back_as_it_was():
    observed, _ = _model(_truth(1))
    result = _run(observed, range(1))
    assert np.array_equal(result[1001], observed[0], equal_nan=True)
    empty = np.full((2, K, 3), np.nan)
    smoother = KeypointSmoother()
    out = [*smoother.push(1001, empty), *smoother.push(1002, empty), *smoother.flush()]
    assert [f for f, _ in out] == [1001, 1002]
    assert all(np.isnan(people).all() for _, people in out)


def test_people_far_apart_are_not_matched():
    a = _truth(1)[0]
    b = a.copy()
    b[0, :, 0] += 300.0  # the first person is far from anyone in the other frame
    assert list(match_people(a, b, 0.35)) == [-1, 1]
    assert list(match_people(a, a[::-1], 0.35)) == [1, 0]


def test_bad_calls_are_refused():
    smoother = KeypointSmoother()
    with pytest.raises(ValueError, match=r"\(P, K, 3\)"):
        smoother.push(1001, np.zeros((2, K)))
    smoother.push(1001, np.zeros((1, K, 3)))
    with pytest.raises(ValueError, match="pushed after"):
        smoother.push(1000, np.zeros((1, K, 3)))
