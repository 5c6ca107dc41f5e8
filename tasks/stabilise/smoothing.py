"""Pose keypoints smoothed over time: a robust, score-weighted local polynomial over a window
of frames, each person followed across frames.

Why not the One Euro filter. One Euro is made for live input: causal, it can only trade jitter
against lag (its speed-adaptive cutoff keeps the lag small when the point moves fast), and as
a recursive filter each output depends on the whole past, so a shot split into chunks would
not give the same keypoints as the whole shot. Here the whole shot is on disk: each frame can
see its future as well as its past. A local quadratic fit in time around each frame (a
Savitzky-Golay filter with weights) has no lag at all, follows acceleration (a quadratic
through a swing's turn does not cut the corner as an average does), and depends only on the
frames within ``radius`` of it: the chunk margin is ``radius`` frames and the result is the
same, exactly.

Weights per sample: the keypoint's score (a low-score point barely counts), a Gaussian
temporal kernel, and a robustness term recomputed ``iterations`` times from the residual to
the last fit (exp(-r^2 / 2 s^2), ``s`` a share of the person's size): one frame's outlier
(a keypoint that jumped to the other hand) loses its weight and is pulled to the fit.

People. A frame's person order is not stable, so each adjacent pair of frames is matched (the
assignment minimising the median keypoint distance relative to the person's size, refused
beyond ``match_share``), and a person is followed outward from the frame through those
matches. A frame's output keeps its own person order, its scores, and its NaN (no person)
rows; keypoints NaN in the frame stay NaN. A hole in the frame numbers or a cut (``push(...,
cut=True)``) closes the chain, as for the dense passes (``tasks.stabilise.window``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from tasks.stabilise.weights import gaussian
from tasks.stabilise.window import Window

_RIDGE = 1e-6  # keeps every fit solvable (see _solve)


@dataclass(frozen=True)
class SmoothingSettings:
    """``radius``: frames each side; ``temporal_sigma``: the kernel's width in frames;
    ``degree``: of the local polynomial; ``robust_share``: the robustness scale as a share
    of the person's size (the diagonal of its keypoints' box), at least ``robust_px``;
    ``iterations``: reweighting rounds; ``match_share``: the largest median keypoint distance,
    as a share of the person's size, at which two frames' people are the same person."""

    radius: int = 4
    temporal_sigma: float = 2.5
    degree: int = 2
    robust_share: float = 0.02
    robust_px: float = 2.0
    iterations: int = 2
    match_share: float = 0.35

    def __post_init__(self) -> None:
        if self.radius < 1 or self.degree < 0 or self.temporal_sigma <= 0:
            raise ValueError("radius >= 1, degree >= 0 and temporal_sigma > 0 are required")


DEFAULT_SMOOTHING = SmoothingSettings()


@dataclass
class _Frame:
    frame: int
    people: np.ndarray  # (P, K, 3) float64
    next_match: np.ndarray | None = None  # (P,) index of each person in the next frame, -1
    previous_match: np.ndarray | None = None


class KeypointSmoother:
    """Streams a shot's pose arrays in (frames in increasing order), smoothed ones out."""

    def __init__(self, settings: SmoothingSettings = DEFAULT_SMOOTHING) -> None:
        self.settings = settings
        self._window: Window[_Frame] = Window(settings.radius)

    def push(
        self, frame: int, people: np.ndarray, cut: bool = False
    ) -> list[tuple[int, np.ndarray]]:
        """Add a frame's (P, K, 3) people (x, y in plate pixels, score; NaN rows: nobody);
        ``cut``: this frame starts another shot. Returns the (frame, smoothed (P, K, 3))
        whose window is now complete, in order."""
        people = np.asarray(people, dtype=np.float64)
        if people.ndim != 3 or people.shape[2] != 3:
            raise ValueError(f"frame {frame}: people must be (P, K, 3), got {people.shape}")
        self._window.check_order(frame)
        out: list[tuple[int, np.ndarray]] = []
        entry = _Frame(frame, people)
        previous = self._window.last
        if previous is not None and (cut or frame != previous.frame + 1):
            out += self.flush()
        elif previous is not None:
            forward = match_people(previous.people, people, self.settings.match_share)
            previous.next_match = forward
            backward = np.full(len(people), -1)
            for i, j in enumerate(forward):
                if j >= 0:
                    backward[j] = i
            entry.previous_match = backward
        self._window.frames.append(entry)
        out += self._ready(closing=False)
        self._window.release(closing=False)
        return out

    def flush(self) -> list[tuple[int, np.ndarray]]:
        """The frames not returned yet."""
        out = self._ready(closing=True)
        self._window.release(closing=True)
        return out

    def _ready(self, closing: bool) -> list[tuple[int, np.ndarray]]:
        frames = self._window.frames
        return [(frames[i].frame, self._smooth(i)) for i in self._window.ready(closing)]

    def _smooth(self, index: int) -> np.ndarray:
        centre = self._window.frames[index]
        out = centre.people.copy()
        for person in range(len(centre.people)):
            if not np.isfinite(centre.people[person, :, :2]).any():
                continue
            track = self._track(index, person)
            times = np.array([d for d, _ in track], dtype=np.float64)
            samples = np.stack([p for _, p in track])  # (n, K, 3)
            fitted = fit_keypoints(times, samples, self.settings)
            keep = np.isfinite(centre.people[person, :, :2]).all(axis=1)
            out[person, keep, :2] = fitted[keep]
        return out

    def _track(self, index: int, person: int) -> list[tuple[int, np.ndarray]]:
        """(frame offset, the person's (K, 3)) in the window, followed through the matches."""
        window = self._window.frames
        track = [(0, window[index].people[person])]
        for step, attribute in ((1, "next_match"), (-1, "previous_match")):
            at, who = index, person
            for distance in range(1, self.settings.radius + 1):
                matches = getattr(window[at], attribute)
                there = at + step
                if matches is None or there < 0 or there >= len(window):
                    break
                who = int(matches[who])
                if who < 0:
                    break
                at = there
                track.append((step * distance, window[at].people[who]))
        return track


def fit_keypoints(
    times: np.ndarray, samples: np.ndarray, settings: SmoothingSettings
) -> np.ndarray:
    """(K, 2) positions at time 0 from samples (n, K, 3) at ``times`` (n,): the robust,
    weighted local polynomial (see the module)."""
    xy = samples[..., :2]
    finite = np.isfinite(xy).all(axis=2)
    score = np.where(finite, np.nan_to_num(samples[..., 2], nan=0.0).clip(0.0, 1.0), 0.0)
    xy = np.where(finite[..., None], xy, 0.0)
    kernel = gaussian(times, settings.temporal_sigma)
    base = score * kernel[:, None]  # (n, K)
    degree = min(settings.degree, len(np.unique(times)) - 1)
    design = times[:, None] ** np.arange(degree + 1)[None, :]  # (n, D)
    centre = xy[times == 0][0]
    seen = centre[finite[times == 0][0]]
    box = seen.max(axis=0) - seen.min(axis=0) if len(seen) else np.zeros(2)
    scale = max(settings.robust_px, settings.robust_share * float(np.hypot(*box)))
    if len(times) == 1:
        return centre.copy()
    weights = base
    fit = _solve(design, xy, weights, centre)
    for _ in range(settings.iterations):
        predicted = np.einsum("nd,kdc->nkc", design, fit)
        residual = np.linalg.norm(xy - predicted, axis=2)
        weights = base * gaussian(residual, scale)
        fit = _solve(design, xy, weights, centre)
    return fit[:, 0, :]


def _solve(
    design: np.ndarray, xy: np.ndarray, weights: np.ndarray, prior: np.ndarray
) -> np.ndarray:
    """(K, D, 2) weighted least-squares coefficients per keypoint, with a vanishing prior
    (weight ``_RIDGE``) that the value is ``prior`` (K, 2) and the higher terms 0: it keeps
    a keypoint no frame gives weight to (all scores 0) where it was."""
    dims = design.shape[1]
    normal = np.einsum("nk,nd,ne->kde", weights, design, design)
    normal += _RIDGE * np.eye(dims)[None]
    rhs = np.einsum("nk,nd,nkc->kdc", weights, design, xy)
    rhs[:, 0, :] += _RIDGE * prior
    return np.linalg.solve(normal, rhs)


def match_people(a: np.ndarray, b: np.ndarray, share: float) -> np.ndarray:
    """For each person of ``a`` (P, K, 3), the index of the same person in ``b`` or -1: the
    assignment minimising the median distance of their common keypoints relative to the
    person's size, pairs beyond ``share`` refused."""
    result = np.full(len(a), -1)
    cost = np.full((len(a), len(b)), np.inf)
    for i, first in enumerate(a):
        size = _size(first)
        if size is None:
            continue
        for j, second in enumerate(b):
            common = np.isfinite(first[:, :2]).all(1) & np.isfinite(second[:, :2]).all(1)
            if common.any():
                gap = np.linalg.norm(first[common, :2] - second[common, :2], axis=1)
                cost[i, j] = float(np.median(gap)) / size
    allowed = np.isfinite(cost) & (cost <= share)
    if not allowed.any():
        return result
    rows, cols = linear_sum_assignment(np.where(allowed, cost, 1e6))
    for i, j in zip(rows, cols, strict=True):
        if allowed[i, j]:
            result[i] = j
    return result


def _size(person: np.ndarray) -> float | None:
    points = person[np.isfinite(person[:, :2]).all(1), :2]
    if len(points) == 0:
        return None
    box = points.max(axis=0) - points.min(axis=0)
    return max(float(np.hypot(*box)), 1.0)
