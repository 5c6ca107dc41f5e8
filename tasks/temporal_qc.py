"""Temporal QC: a flicker score per frame for each dense pass of a shot.

Per-frame networks flicker: a frame's pass jumps while the plate barely moved. The score
tells that apart from honest motion by following the plate's motion, comparing the pass's
change along it with the plate's change along it, and comparing that ratio with what is
usual for the shot:

    D_x(a, b)  mean change of x between frame a and frame b followed to a's pixels along the
               plate's flow (``follow_motion``), over the pixels that are the person (matte
               >= 0.5 or a body-part label) in both and whose flow can be trusted; the whole
               frame's trusted pixels when the shot has neither pass or no person
    R(a, b)    (D_pass(a, b) + EPS) / (D_plate(a, b) + EPS)
    r(t)       min(R(t, t-1), R(t, t+1))   at the first and last frame the two nearest
               frames on the one side they have (t+1, t+2 / t-1, t-2)
    score(t)   r(t) / median over the shot's frames of r

Why follow the motion: a surface that moves keeps its normal (nearly: it turns a little a
frame), its albedo, its matte, its label and its relative depth, while the pixels it covers
change; compared where they are, a moving figure's normals change more than a network's
flicker does, and the flicker drowned (on the synthetic shot of bench/temporal_qc.py moving 4
pixels a frame, a 10 degree tilt of one frame's normals scored 1.2 compared in place, 9.2
followed). The flow is OpenCV's DIS between the plate proxies (``tasks.plate_flow``), with its
forward-backward confidence: a pixel hidden in the other frame is not compared. Labels are
taken from the nearest pixel, or from one of the eight around it where that holds the same
label (a flow a pixel off must not turn a label boundary's own motion into a change); the rest
is sampled bilinearly. A cut, or a pair where almost nothing can be followed, is compared
where the pixels are.

Why the ratio to the plate: a flash, a light change or a flow that failed change the plate
followed along the motion and the pass together and do not raise the score. Why the minimum
over both neighbours: a frame whose pass is wrong changed more than its plate towards both of
its neighbours, while each neighbour still agrees with its other neighbour, so the spike lands
on the bad frame alone (a plain first difference flags the frame after it too); the ratio is
taken per pair, so a neighbour that moved honestly does not hide or fake anything. Why the
median: it makes the score unit-free per pass (1 is what is usual for this shot) and robust to
the few bad frames it looks for. EPS is the noise floor (0.2% of the encoded plate's range; the
pass metrics share that scale), so a static plate does not turn noise into a score.

Change metrics, all near a 0-1 scale: normal, half the chord between unit vectors; pointmap,
the change of the point's distance from the camera relative to that distance (a surface
followed across the view keeps its distance, not its camera-space position); albedo and matte,
the mean absolute difference; seg, the share of pixels whose label changed; plate, the mean
absolute difference of the luma of the plate as the model saw it (its input encoding).

Everything is measured on proxies at most PROXY_SIDE pixels on the long side (block means;
labels by nearest sample), which keeps one frame's proxies under a megabyte: frames stream
through a window of three, so memory stays flat in the length of the shot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from schemas.passes import PASSES, PERSON_MASK_FROM
from storage.location import Location
from storage.plate_reader import read_plate_frame
from storage.zarr_store import SEG_FILL, close_store, open_shot_store
from tasks.colour import ColourConversion
from tasks.plate_flow import FlowSettings, can_flow, luma_flow_image, pair_motion

QC_PASSES = tuple(p.name for p in PASSES if p.qc is not None)
PROXY_SIDE = 256
EPS = 0.002
MIN_REGION = 0.005  # share of the proxy below which the person region is taken as absent
# flow between proxies, estimated at their own size (``FlowSettings.finest_side``: DIS's
# preset alone would stop at half of it, 128 pixels, where a moving figure's edges are a
# pixel or two off and the motion itself scores as flicker)
QC_FLOW = FlowSettings(max_side=PROXY_SIDE)
TRUSTED = 0.5  # round-trip confidence from which a pixel's motion is followed
BACKGROUND = 0  # seg class 0 is the background
LABEL_PASSES = frozenset(p.name for p in PASSES if p.qc == "labels")  # held as class indices
# How the scores are made, recorded beside each one (``outputs.flicker_method``): scores of two
# methods are not on one scale, so the shot page says when the versions it draws differ. A new
# name whenever the scoring changes. Scores recorded before methods were (NULL) compared each
# pass where the pixels are, not along the motion; "follows-motion" followed a flow estimated
# at half the proxies' size, "follows-motion-256" at their own 256 pixels
# (docs/design/optical-flow.md).
METHOD = "follows-motion-256"
_LUMA = np.array([0.2126, 0.7152, 0.0722], dtype=np.float32)


@dataclass(frozen=True)
class QcJob:
    """What the flicker scores of one shot need: the store, the finished frames in order and
    their plate files. Small and picklable (it travels to a worker)."""

    zarr: Location  # the shot's store
    frames: tuple[int, ...]
    plate_uris: tuple[str, ...]
    plate_colorspace: str
    passes: tuple[str, ...]
    plate: Location  # the plate (its pattern), with the options that reach its frames


@dataclass(frozen=True)
class Proxies:
    """One frame, small: the plate's luma, each pass, and where the person is."""

    frame: int
    plate: np.ndarray  # (h, w) float32
    passes: Mapping[str, np.ndarray]
    person: np.ndarray | None  # (h, w) bool, None when no pass says where people are


def qc_passes(passes: Sequence[str]) -> tuple[str, ...]:
    return tuple(p for p in QC_PASSES if p in passes)


def shot_flicker(job: QcJob) -> dict[str, dict[int, float]]:
    """Flicker score per pass and frame (see the module); empty below three frames."""
    passes = qc_passes(job.passes)
    if len(job.frames) < 3 or not passes:
        return {}
    return flicker(job.frames, _frame_proxies(job, passes), passes)


def flicker(
    frames: Sequence[int],
    proxies: Iterable[Proxies],
    passes: Sequence[str],
    normalised: bool = True,
) -> dict[str, dict[int, float]]:
    """Flicker score per pass and frame from each frame's proxies (``proxies_of``), given in
    the order of ``frames`` (at least three) and streamed through a window of three: the
    array-level form of ``shot_flicker``, for passes held in memory (``bench.temporal``).
    ``normalised=False``: r(t) itself, not divided by the shot's median (to compare two
    versions of a shot on one scale)."""
    changes = _Changes()
    window: list[Proxies] = []
    for item in proxies:
        window = [*window[-2:], item]
        if len(window) >= 2:
            changes.add(window[-2], window[-1], passes)
        if len(window) == 3 and window[0].frame == frames[0]:
            changes.add(window[0], window[2], passes)  # the first frame's second neighbour
    if len(frames) > 3:
        changes.add(window[0], window[2], passes)  # the last frame's second neighbour
    return {
        name: scores(frames, changes.of(name), changes.of("plate"), normalised) for name in passes
    }


def flagged_frames(
    flicker: Mapping[str, Mapping[int, float]], threshold: float
) -> dict[str, list[int]]:
    """The frames above the threshold, per pass (passes with none left out)."""
    flagged = {
        name: sorted(f for f, score in frames.items() if score > threshold)
        for name, frames in flicker.items()
    }
    return {name: frames for name, frames in flagged.items() if frames}


def scores(
    frames: Sequence[int],
    pass_change: Mapping[tuple[int, int], float],
    plate_change: Mapping[tuple[int, int], float],
    normalised: bool = True,
) -> dict[int, float]:
    """Scores from the changes between pairs of frames (keys: (earlier, later) frame);
    ``normalised=False``: r(t), not divided by its median."""
    ratios: dict[int, float] = {}
    for i, frame in enumerate(frames):
        pairs = [_pair(frame, frames[j]) for j in _neighbours(i, len(frames))]
        ratios[frame] = min((pass_change[p] + EPS) / (plate_change[p] + EPS) for p in pairs)
    usual = float(np.median(list(ratios.values()))) if normalised else 1.0
    return {frame: round(r / usual, 4) for frame, r in ratios.items()}


def _neighbours(i: int, n: int) -> tuple[int, int]:
    if i == 0:
        return 1, 2
    if i == n - 1:
        return n - 2, n - 3
    return i - 1, i + 1


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


class _Changes:
    """D_x(a, b) for each pair of frames measured, per pass and for the plate, b followed
    along the plate's motion to a's pixels."""

    def __init__(self) -> None:
        self.values: dict[str, dict[tuple[int, int], float]] = {}

    def add(self, a: Proxies, b: Proxies, passes: Sequence[str]) -> None:
        key = _pair(a.frame, b.frame)
        b, trusted = follow_motion(a, b)
        region = _region(a, b, trusted)
        self.values.setdefault("plate", {})[key] = _mean(np.abs(a.plate - b.plate), region)
        for name in passes:
            change = CHANGE[name](a.passes[name], b.passes[name])
            self.values.setdefault(name, {})[key] = _mean(change, region)

    def of(self, name: str) -> dict[tuple[int, int], float]:
        return self.values.get(name, {})


def follow_motion(a: Proxies, b: Proxies) -> tuple[Proxies, np.ndarray | None]:
    """``b`` warped onto ``a``'s pixels along the plate's flow from a to b, and the pixels of
    ``a`` whose flow can be trusted (round trip, seen in b). ``b`` as it is and None where the
    pair is a cut, almost nothing can be followed or the proxies are too small for flow: then
    pixels are compared where they are.

    Labels are sampled at the nearest pixel (``_labels_near``), everything else bilinearly;
    where a person is, at the nearest pixel."""
    image_a, image_b = luma_flow_image(a.plate, QC_FLOW), luma_flow_image(b.plate, QC_FLOW)
    if not can_flow(image_a):  # a plate a few pixels high
        return b, None
    motion = pair_motion(image_a, image_b, QC_FLOW)
    trusted = motion.confidence_a >= TRUSTED
    if motion.cut or trusted.mean() < MIN_REGION:
        return b, None
    h, w = a.plate.shape
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    at_x = np.clip(xs + motion.forward[..., 0], 0, w - 1)
    at_y = np.clip(ys + motion.forward[..., 1], 0, h - 1)
    near = np.rint(at_y).astype(np.intp), np.rint(at_x).astype(np.intp)
    passes = {
        name: _labels_near(values, near, a.passes[name])
        if name in LABEL_PASSES
        else _bilinear(values, at_x, at_y)
        for name, values in b.passes.items()
    }
    person = None if b.person is None else b.person[near]
    warped = Proxies(b.frame, _bilinear(b.plate, at_x, at_y), passes, person)
    return warped, trusted


def _labels_near(
    labels: np.ndarray, near: tuple[np.ndarray, np.ndarray], reference: np.ndarray
) -> np.ndarray:
    """``labels`` at the pixels ``near`` (rows, columns), or the reference's label where
    one of the eight pixels around holds it: a flow a pixel off must not count a label
    boundary's own motion as a change of label."""
    h, w = labels.shape[:2]
    picked = labels[near]
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            around = labels[np.clip(near[0] + dy, 0, h - 1), np.clip(near[1] + dx, 0, w - 1)]
            picked = np.where(around == reference, around, picked)
    return picked


def _bilinear(values: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``values`` (h, w, ...) sampled at (x, y), coordinates inside the frame."""
    x0 = np.minimum(x.astype(np.intp), values.shape[1] - 2).clip(0)
    y0 = np.minimum(y.astype(np.intp), values.shape[0] - 2).clip(0)
    fx, fy = x - x0, y - y0
    if values.ndim == 3:
        fx, fy = fx[..., None], fy[..., None]
    x1 = np.minimum(x0 + 1, values.shape[1] - 1)
    y1 = np.minimum(y0 + 1, values.shape[0] - 1)
    top = values[y0, x0] * (1 - fx) + values[y0, x1] * fx
    bottom = values[y1, x0] * (1 - fx) + values[y1, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)


def _region(a: Proxies, b: Proxies, trusted: np.ndarray | None) -> np.ndarray | None:
    """Pixels that are the person in both frames: the band the silhouette swept between them
    changes with motion alone, by a lot in every geometric pass, and would drown the change
    of the person's own pixels. Both frames' pixels when the overlap is too small. Of those,
    only the pixels whose motion could be followed (``trusted``: an occluded pixel is not the
    same surface in the two frames)."""
    everything = np.ones(a.plate.shape, dtype=bool) if trusted is None else trusted
    if a.person is None or b.person is None:
        return trusted
    for region in (a.person & b.person & everything, (a.person | b.person) & everything):
        if region.mean() >= MIN_REGION:
            return region
    return trusted


def _mean(values: np.ndarray, region: np.ndarray | None) -> float:
    picked = values if region is None else values[region]
    finite = picked[np.isfinite(picked)]
    return float(finite.mean()) if finite.size else 0.0


def _normal_change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 0.5 * np.linalg.norm(a - b, axis=-1)


def _point_change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The change of the point's distance from the camera, relative to it: a surface followed
    along the motion keeps its distance when it moves across the view or the camera pans
    (its camera-space position does not), and a network's flicker is mostly a change of
    depth or scale."""
    range_a, range_b = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    return np.abs(range_a - range_b) / np.maximum(0.5 * (range_a + range_b), 1e-6)


def _colour_change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b).mean(axis=-1)


def _scalar_change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b)


def _label_change(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a != b).astype(np.float32)


CHANGE_BY_METRIC = {
    "angle": _normal_change,
    "relative_distance": _point_change,
    "absolute": _scalar_change,
    "mean_absolute": _colour_change,
    "labels": _label_change,
}
CHANGE = {p.name: CHANGE_BY_METRIC[p.qc] for p in PASSES if p.qc is not None}


def _frame_proxies(job: QcJob, passes: Sequence[str]) -> Iterator[Proxies]:
    colour = ColourConversion(job.plate_colorspace)
    group = open_shot_store(job.zarr, "r")
    try:
        index = {int(f): i for i, f in enumerate(np.asarray(group["frame"][:])) if f >= 0}
        for frame, uri in zip(job.frames, job.plate_uris, strict=True):
            if frame not in index:
                raise ValueError(f"{job.zarr.uri}: frame {frame} is not in the store")
            arrays = {name: np.asarray(group[name][index[frame]]) for name in passes}
            plate = read_plate_frame(job.plate.at(uri), frame)
            encoded = colour.to_model_encoding(plate.pixels[..., :3])
            yield proxies_of(frame, encoded @ _LUMA, arrays)
    finally:
        close_store(group.store)


def proxies_of(frame: int, luma: np.ndarray, arrays: Mapping[str, np.ndarray]) -> Proxies:
    """One frame's proxies from its plate luma (H, W) and its passes as the Zarr store holds
    them (labels as class indices)."""
    shape = next(iter(arrays.values())).shape[:2] if arrays else luma.shape
    step = max(1, math.ceil(max(shape) / PROXY_SIDE))
    small = {
        name: _labels(a, step) if name in LABEL_PASSES else _block_mean(a, step)
        for name, a in arrays.items()
    }
    person = None
    for name in (n for n in PERSON_MASK_FROM[::-1] if n in small):  # alpha, then labels
        if name in LABEL_PASSES:
            found = (small[name] != BACKGROUND) & (small[name] != SEG_FILL)
        else:
            found = small[name] >= 0.5
        person = found if person is None else person | found
    plate = _block_mean(luma, max(1, math.ceil(max(luma.shape) / PROXY_SIDE)))
    if small:  # an anamorphic plate may be stored at another size: sample it onto the passes'
        shape = next(iter(small.values())).shape[:2]
        rows = np.arange(shape[0]) * plate.shape[0] // shape[0]
        cols = np.arange(shape[1]) * plate.shape[1] // shape[1]
        plate = plate[rows[:, None], cols[None, :]]
    return Proxies(frame=frame, plate=plate, passes=small, person=person)


def _block_mean(values: np.ndarray, step: int) -> np.ndarray:
    """Mean of each step x step block (edges cropped), as float32."""
    h, w = (values.shape[0] // step) * step, (values.shape[1] // step) * step
    cropped = np.asarray(values[:h, :w], dtype=np.float32)
    blocks = cropped.reshape(h // step, step, w // step, step, *values.shape[2:])
    return blocks.mean(axis=(1, 3))


def _labels(values: np.ndarray, step: int) -> np.ndarray:
    h, w = (values.shape[0] // step) * step, (values.shape[1] // step) * step
    return np.asarray(values[:h:step, :w:step])
