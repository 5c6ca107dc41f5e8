"""Flow-guided temporal stabilisation of a shot's dense passes, in torch on the passes' device.

Each frame's pass is fused with its neighbours' passes warped to it by the plate's motion
(``tasks.plate_flow``), over a window of ``FusionSettings.radius`` frames each side. Frames
stream through: a frame comes out once its last neighbour is pushed, and memory holds that
window (``2 * radius + 1`` frames of passes, their flow-resolution motion), never the shot.

Why a radius of 2 (five frames). The errors a per-frame network makes are, frame to frame,
close to independent: averaging N frames divides them by about sqrt(N). Three frames give
0.58 at best, too close to the 0.6 goal once the warps' own error is added; five give 0.45
(0.46 with the temporal kernel's weights; ``bench.temporal`` measures 0.37-0.50 on a static
shot, where the flow is exact); seven 0.38, but each step adds a flow over a longer reach
(less exact, less often confident: the surface has turned meanwhile), 40% more warping and
memory, and a wider margin for chunks. Measured on the moving synthetic shot: radius 3 moves
the error ratios by at most 0.03 (normals 0.63 -> 0.61, albedo 0.51 -> 0.48, seg 0.39 ->
0.40): the rest is what motion changes in the passes themselves (a limb turns between frames).

Weights. Each sample's weight is the product of
- the flow's confidence: the forward-backward consistency of the centre frame's pixels towards
  that neighbour (0 where the pixel is hidden there or leaves the frame: no ghosting at
  occlusions);
- a temporal kernel, exp(-d^2 / 2 sigma^2) over the frame distance d: near frames are warped
  more exactly;
- a robustness term, exp(-r^2 / 2 s^2) of the sample's distance r to the current estimate,
  iterated (a reweighted mean, ``iterations`` times) from the plain weighted mean: a bad frame,
  the centre included, a swapped label, a sample warped across a motion boundary the flow
  smeared, sits far from what the others agree on and loses its weight; a bad centre is
  pulled towards its neighbours. ``s`` is per kind of values (``FusionSettings``), in the
  units of the distance below: the size of an honest frame-to-frame disagreement.

The rule per kind of values (``schemas.passes.Values``):

| kind           | distance r                              | mean                          |
|----------------|-----------------------------------------|-------------------------------|
| unit_vectors   | chord between unit vectors              | weighted, re-normalised       |
| points         | distance relative to the estimate's     | weighted, in the pass's units |
| relative_depth | absolute difference                     | weighted                      |
| colour         | root mean square over the channels      | weighted                      |
| alpha          | absolute difference                     | weighted                      |
| labels         | total variation between probabilities   | weighted (still sums to 1)    |

Flow to neighbours two or more frames away is the composition of the adjacent flows (their
confidences multiplied along the path), at flow resolution: one DIS pair per frame, and a
composition is a bilinear lookup. Measured on the synthetic shot (``bench.temporal
--flow-check``, 384x216): the truth's normals warped from two frames away are 1.60 degrees
off on the person where the composed flow is confident (88% of it), 1.26 with DIS between
the two frames (84% confident), which costs one more DIS pair per frame (7 times the
composition's time); the stabilised passes come out the same either way (error ratios within
0.02, ``--direct-flow``). ``FusionSettings.direct_flow`` chooses DIS.

Cost. The warps and the robust mean are some sixty torch operations per pass, neighbour and
pixel band; on this project's 2-core CPU (one thread) a 2048x1080 frame of six passes (40
channels, 29 of them seg) takes 4.2 core-s, of which DIS 0.25 and ``grid_sample`` some 40%:
about 17 core-s for 4096x2160, far above the 2 core-s goal. The work is made for the model's
GPU, where it is a few dozen kernels over the whole frame.

A hole in the frame numbers or a cut (``plate_flow.pair_motion``) closes the chain: nothing is
fused across it, and a run of frames shorter than ``min_frames`` comes back unchanged.

Chunks. A frame's result depends only on the frames within ``radius`` of it and the motion
between them, so a shot split into chunks, each pushed with ``radius`` frames of margin either
side (and only its own frames kept), gives the same frames as one pass over the shot.

On the CPU the work runs over bands of rows (``tasks.pixel_blocks``), so the warped samples
of a band stay in cache; on a GPU over the whole frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tasks.pixel_blocks import row_blocks
from tasks.plate_flow import (
    DEFAULT_FLOW,
    FlowSettings,
    confidence_to_plate,
    flow_image,
    pair_motion,
    to_plate,
)

KINDS = ("unit_vectors", "points", "relative_depth", "colour", "alpha", "labels")
_EPS = 1e-6  # the centre's weight that always remains: where every weight vanished, it stands
_TINY = 1e-12
# the robustness term's smallest exponent: exp(-30) is 1e-13, already nothing, and results
# below float32's normal range (exp(-87) and less) make the CPU take a slow path
_FLOOR = -30.0
# Bands of rows on the CPU: per band and neighbour a few dozen torch operations, so bands must
# be large enough to hide their overhead (see tasks.pixel_blocks); the samples of every pass of
# every frame of the window are held for one band.
_BAND_BYTES = 24 << 20


@dataclass(frozen=True)
class FusionSettings:
    """How passes are fused (see the module). ``radius``: frames each side; ``direct_flow``:
    flow to frames two or more away by DIS between them, not composed. ``temporal_sigma``:
    the temporal kernel's width in frames. ``iterations``: reweighting rounds of the robust
    mean. ``min_frames``: a run of frames between cuts/holes shorter than this is returned
    unchanged. The rest: the robustness scale ``s`` per kind of values, in the units of its
    distance (module table)."""

    radius: int = 2
    direct_flow: bool = False
    temporal_sigma: float = 2.0
    iterations: int = 2
    min_frames: int = 3
    unit_vectors: float = 0.18
    points: float = 0.03
    relative_depth: float = 0.06
    colour: float = 0.04
    alpha: float = 0.08
    labels: float = 0.3

    def __post_init__(self) -> None:
        # a chunk's margin is `radius` frames: it must also tell whether a run is too short
        if self.radius < max(1, self.min_frames - 1):
            raise ValueError(
                f"radius must be at least max(1, min_frames - 1) = "
                f"{max(1, self.min_frames - 1)}, got {self.radius}"
            )
        if self.iterations < 0 or self.temporal_sigma <= 0:
            raise ValueError("iterations must be >= 0 and temporal_sigma > 0")

    def scale(self, kind: str) -> float:
        return float(getattr(self, kind))

    def kernel(self, distance: int) -> float:
        return math.exp(-0.5 * (distance / self.temporal_sigma) ** 2)


DEFAULT_FUSION = FusionSettings()


@dataclass
class StabilisedFrame:
    """One frame out: its passes fused (same names, shapes, units, float32 as pushed) and the
    plate-pixel flow to its neighbours, (H, W, 2) x then y, y down; None across a cut or a
    hole and at the ends of what was pushed."""

    frame: int
    passes: dict[str, Tensor]
    forward: Tensor | None
    backward: Tensor | None


@dataclass
class _Frame:
    frame: int
    passes: dict[str, Tensor]
    nonfinite: frozenset[str]
    image: np.ndarray  # the flow image (small: at most FlowSettings.max_side)
    # flow resolution, on the device: to the next / previous frame and its confidence
    forward: Tensor | None = None
    forward_confidence: Tensor | None = None
    backward: Tensor | None = None
    backward_confidence: Tensor | None = None


@dataclass
class _Neighbour:
    frame: _Frame
    distance: int  # frames from the centre
    grid: Tensor  # (1, H, W, 2) normalised sampling positions in the neighbour
    weight: Tensor  # (H, W) confidence x temporal kernel


class TemporalStabiliser:
    """Streams a shot's frames in, stabilised frames out (see the module).

    ``kinds``: pass name -> kind of values (``KINDS``); ``plate_hw``: the passes' (H, W);
    ``device``: where the passes live and the work runs."""

    def __init__(
        self,
        kinds: Mapping[str, str],
        plate_hw: tuple[int, int],
        device: torch.device | str,
        settings: FusionSettings = DEFAULT_FUSION,
        flow: FlowSettings = DEFAULT_FLOW,
    ) -> None:
        unknown = {name: kind for name, kind in kinds.items() if kind not in KINDS}
        if unknown:
            raise ValueError(f"no fusion rule for {unknown}; kinds: {', '.join(KINDS)}")
        self.kinds = dict(kinds)
        self.plate_hw = (int(plate_hw[0]), int(plate_hw[1]))
        self.device = torch.device(device)
        self.settings = settings
        self.flow = flow
        self._window: list[_Frame] = []  # the current run of frames, oldest kept first
        self._pending = 0  # index in the window of the first frame not returned yet
        self._run_length = 0  # frames in the current run, trimmed ones included
        self._last_image: np.ndarray | None = None
        # whether the frame pushed last continues the run of the one before it (False after
        # a cut or a hole, and for the first): what a keypoint smoother beside it is told
        self.joined = False
        self._direct: dict[tuple[int, int], tuple[Tensor, Tensor, Tensor, Tensor] | None] = {}

    def push(
        self, frame: int, plate_rgb: np.ndarray, passes: Mapping[str, Tensor]
    ) -> list[StabilisedFrame]:
        """Add a frame (frames in increasing order): its plate (H, W, 3) in the model's
        encoding and its passes, (C, H, W) float32 on the device. Returns the frames whose
        window is now complete, in order."""
        self._check(frame, passes)
        image = flow_image(plate_rgb, self.flow)
        entry = _Frame(
            frame,
            {name: passes[name] for name in self.kinds},
            frozenset(n for n in self.kinds if not _all_finite(passes[n])),
            image,
        )
        out: list[StabilisedFrame] = []
        previous = self._window[-1] if self._window else None
        joined = False
        if previous is not None and frame == previous.frame + 1 and self._last_image is not None:
            motion = pair_motion(self._last_image, image, self.flow)
            if not motion.cut:
                previous.forward = self._tensor(motion.forward)
                previous.forward_confidence = self._tensor(motion.confidence_a)
                entry.backward = self._tensor(motion.backward)
                entry.backward_confidence = self._tensor(motion.confidence_b)
                joined = True
        if previous is not None and not joined:
            out += self._close_run()
        self.joined = joined
        self._window.append(entry)
        self._run_length += 1
        self._last_image = image
        out += self._ready(closing=False)
        self._trim()
        return out

    def flush(self) -> list[StabilisedFrame]:
        """The frames not returned yet, at the end of what was pushed."""
        out = self._close_run()
        self._last_image = None
        return out

    def _check(self, frame: int, passes: Mapping[str, Tensor]) -> None:
        if self._window and frame <= self._window[-1].frame:
            raise ValueError(f"frame {frame} pushed after frame {self._window[-1].frame}")
        missing = set(self.kinds) - set(passes)
        if missing:
            raise ValueError(f"frame {frame}: passes {sorted(missing)} missing")
        for name, kind in self.kinds.items():
            values = passes[name]
            single = kind in ("alpha", "relative_depth")
            if (
                values.ndim != 3
                or tuple(values.shape[1:]) != self.plate_hw
                or (single and values.shape[0] != 1)
            ):
                raise ValueError(
                    f"frame {frame}: pass {name} is {tuple(values.shape)}, expected "
                    f"({'1' if single else 'C'}, {self.plate_hw[0]}, {self.plate_hw[1]})"
                )

    def _tensor(self, array: np.ndarray) -> Tensor:
        return torch.as_tensor(array, dtype=torch.float32, device=self.device)

    def _close_run(self) -> list[StabilisedFrame]:
        out = self._ready(closing=True)
        self._window = []
        self._pending = 0
        self._run_length = 0
        self._direct = {}
        return out

    def _ready(self, closing: bool) -> list[StabilisedFrame]:
        out = []
        while self._pending < len(self._window):
            centre = self._window[self._pending]
            if not closing and self._window[-1].frame < centre.frame + self.settings.radius:
                break
            if self._run_length < self.settings.min_frames:
                out.append(self._unchanged(centre))
            else:
                out.append(self._fuse(self._pending))
            self._pending += 1
        return out

    def _trim(self) -> None:
        drop = max(0, self._pending - self.settings.radius)
        if drop:
            del self._window[:drop]
            self._pending -= drop

    def _plate_flows(self, entry: _Frame) -> tuple[Tensor | None, Tensor | None]:
        def plate(flow: Tensor | None) -> Tensor | None:
            return None if flow is None else to_plate(flow, self.plate_hw, self.device)

        return plate(entry.forward), plate(entry.backward)

    def _unchanged(self, entry: _Frame) -> StabilisedFrame:
        forward, backward = self._plate_flows(entry)
        return StabilisedFrame(entry.frame, dict(entry.passes), forward, backward)

    def _fuse(self, index: int) -> StabilisedFrame:
        centre = self._window[index]
        neighbours = self._neighbours(index)
        fused = fuse_frame(centre.passes, centre.nonfinite, neighbours, self.kinds, self.settings)
        forward, backward = self._plate_flows(centre)
        return StabilisedFrame(centre.frame, fused, forward, backward)

    def _neighbours(self, index: int) -> list[_Neighbour]:
        """The window's other frames, warped towards the centre: the flow from the centre to
        each (adjacent flows composed, or direct), its confidence times the temporal kernel."""
        out = []
        for step, attribute in ((1, "forward"), (-1, "backward")):
            flow: Tensor | None = None
            confidence: Tensor | None = None
            for distance in range(1, self.settings.radius + 1):
                at = index + step * (distance - 1)
                there = index + step * distance
                if there < 0 or there >= len(self._window):
                    break
                link = getattr(self._window[at], attribute)
                link_confidence = getattr(self._window[at], attribute + "_confidence")
                if link is None or link_confidence is None:
                    break
                if flow is None or confidence is None:
                    flow, confidence = link, link_confidence
                elif self.settings.direct_flow:
                    direct = self._direct_motion(self._window[index], self._window[there])
                    if direct is None:
                        break
                    flow, confidence = direct
                else:
                    flow, confidence = compose(flow, confidence, link, link_confidence)
                weight = confidence_to_plate(confidence, self.plate_hw, self.device)
                out.append(
                    _Neighbour(
                        self._window[there],
                        distance,
                        sampling_grid(to_plate(flow, self.plate_hw, self.device)),
                        weight * self.settings.kernel(distance),
                    )
                )
        return out

    def _direct_motion(self, centre: _Frame, there: _Frame) -> tuple[Tensor, Tensor] | None:
        """DIS flow from the centre to a frame two or more away, and its confidence: one pair
        serves both frames (kept until the earlier leaves the window); None if it is a cut."""
        first, last = sorted((centre, there), key=lambda f: f.frame)
        key = (first.frame, last.frame)
        if key not in self._direct:
            motion = pair_motion(first.image, last.image, self.flow)
            self._direct[key] = (
                None
                if motion.cut
                else (
                    self._tensor(motion.forward),
                    self._tensor(motion.confidence_a),
                    self._tensor(motion.backward),
                    self._tensor(motion.confidence_b),
                )
            )
            oldest = self._window[0].frame
            for stale in [k for k in self._direct if k[0] < oldest]:
                del self._direct[stale]
        found = self._direct[key]
        if found is None:
            return None
        return (found[0], found[1]) if centre is first else (found[2], found[3])


def compose(
    first: Tensor, first_confidence: Tensor, then: Tensor, then_confidence: Tensor
) -> tuple[Tensor, Tensor]:
    """The flow a -> c from a -> b (``first``) and b -> c (``then``), all (h, w, 2) at one
    resolution, and its confidence: a's confidence times b's where a's vector lands (0 where
    it lands outside b)."""
    grid = sampling_grid(first)
    fields = torch.cat([then, then_confidence[..., None]], dim=-1).permute(2, 0, 1)[None]
    landed = F.grid_sample(fields, grid, mode="bilinear", padding_mode="border", align_corners=True)
    landed = landed[0].permute(1, 2, 0)
    inside = (grid[0].abs() <= 1.0).all(dim=-1)
    flow = first + landed[..., :2]
    confidence = first_confidence * landed[..., 2] * inside
    return flow, confidence


def sampling_grid(flow: Tensor) -> Tensor:
    """(1, h, w, 2) grid_sample positions (align_corners=True) of each pixel plus its vector."""
    h, w = flow.shape[:2]
    xs = torch.arange(w, dtype=torch.float32, device=flow.device)
    ys = torch.arange(h, dtype=torch.float32, device=flow.device)
    grid = flow.clone()
    grid[..., 0].add_(xs).mul_(2.0 / max(w - 1, 1)).sub_(1.0)
    grid[..., 1].add_(ys[:, None]).mul_(2.0 / max(h - 1, 1)).sub_(1.0)
    return grid[None]


def fuse_frame(
    centre: Mapping[str, Tensor],
    nonfinite: frozenset[str] | set[str],
    neighbours: list[_Neighbour],
    kinds: Mapping[str, str],
    settings: FusionSettings,
) -> dict[str, Tensor]:
    """Every pass of the centre frame fused with its warped neighbours (see the module)."""
    if not neighbours:
        return dict(centre)
    first = next(iter(centre.values()))
    height = first.shape[1]
    device = first.device
    channels = sum(values.shape[0] for values in centre.values())
    bytes_per_row = channels * first.shape[2] * 4 * (len(neighbours) + 4)
    out = {name: torch.empty_like(values) for name, values in centre.items()}
    for rows in row_blocks(device, height, bytes_per_row, _BAND_BYTES):
        band = _Band(rows, [n.grid[:, rows] for n in neighbours], neighbours, settings)
        for name, kind in kinds.items():
            dirty = name in nonfinite or any(name in n.frame.nonfinite for n in neighbours)
            if kind == "points":
                out[name][:, rows] = band.fuse_points(centre[name], name, dirty)
            else:
                samples = [centre[name][:, rows], *band.warped(name)]
                out[name][:, rows] = band.fuse(kind, samples, band.base, dirty)
    return out


class _Band:
    """One band of rows of the centre frame: the neighbours' sampling positions there and the
    base weights (the centre's kernel weight first, then each neighbour's)."""

    def __init__(
        self,
        rows: slice,
        grids: list[Tensor],
        neighbours: list[_Neighbour],
        settings: FusionSettings,
    ) -> None:
        self.rows = rows
        self.grids = grids
        self.neighbours = neighbours
        self.settings = settings
        centre_weight = torch.full_like(neighbours[0].weight[rows], settings.kernel(0))
        self.base = [centre_weight, *(n.weight[rows] for n in neighbours)]

    def warped(self, name: str, channels: slice | None = None) -> list[Tensor]:
        out = []
        for neighbour, grid in zip(self.neighbours, self.grids, strict=True):
            values = neighbour.frame.passes[name]
            if channels is not None:
                values = values[channels]
            out.append(
                F.grid_sample(
                    values[None], grid, mode="bilinear", padding_mode="border", align_corners=True
                )[0]
            )
        return out

    def fuse(self, kind: str, samples: list[Tensor], weights: list[Tensor], dirty: bool) -> Tensor:
        """The robust mean of the samples (the centre first); non-finite samples have no
        weight, and where no finite sample is left the centre stands."""
        if not dirty:
            return robust_mean(
                kind, samples, weights, self.settings.scale(kind), self.settings.iterations
            )
        finite = [torch.isfinite(x).all(dim=0) for x in samples]
        weights = [w * f for w, f in zip(weights, finite, strict=True)]
        clean = [torch.nan_to_num(x, 0.0, 0.0, 0.0) for x in samples]
        fused = robust_mean(
            kind, clean, weights, self.settings.scale(kind), self.settings.iterations
        )
        left = finite[0] | (torch.stack(weights[1:]).sum(dim=0) > 0)
        return torch.where(left, fused, samples[0])

    def fuse_points(self, centre: Tensor, name: str, dirty: bool) -> Tensor:
        """Points: a pixel's point lies on its ray, and the ray belongs to the pixel (the
        camera's), not to what is seen there. So depth (z) is fused along the flow, as the
        body moves, while the ray (x/z, y/z, 1) is fused at the pixel over the same frames,
        without warping (weights: the temporal kernel); the point is the ray at that depth.
        Fusing whole points along the flow would blend positions the body had at other
        times."""
        rows = self.rows
        depth = [centre[2:3, rows], *self.warped(name, slice(2, 3))]
        fused_depth = self.fuse("points", depth, self.base, dirty)
        rays = [centre[:, rows]] + [n.frame.passes[name][:, rows] for n in self.neighbours]
        rays = [p / p[2:3] for p in rays]
        kernel = [torch.full_like(w, self.settings.kernel(0)) for w in self.base[:1]]
        kernel += [torch.full_like(w, self.settings.kernel(n.distance)) for w, n in
                   zip(self.base[1:], self.neighbours, strict=True)]  # fmt: skip
        fused_ray = self.fuse("points", rays, kernel, True)
        points = fused_ray * (fused_depth / fused_ray[2:3])
        usable = torch.isfinite(points).all(dim=0) & (centre[2, rows].abs() > _TINY)
        return torch.where(usable, points, centre[:, rows])


def robust_mean(
    kind: str, samples: list[Tensor], weights: list[Tensor], scale: float, iterations: int
) -> Tensor:
    """The robust weighted mean of ``samples`` (each (C, h, w), the centre first) under their
    base ``weights`` ((h, w) each). It starts from each pixel's weighted medoid (the sample
    with the least weighted distance to the others: what most of the trusted samples agree
    on, which a plain mean is not where some samples are wrong), then ``iterations`` times
    takes the mean with each weight times exp(-r^2 / 2 scale^2) of the sample's distance r to
    the last estimate (module table)."""
    distance = _DISTANCE[kind]
    estimate = _medoid(samples, weights, distance)
    factor = -0.5 / scale**2
    for _ in range(max(1, iterations)):
        robust = []
        for x, w in zip(samples, weights, strict=True):
            exponent = distance(x, estimate).square_().mul_(factor).clamp_(min=_FLOOR)
            robust.append(exponent.exp_().mul_(w))
        estimate = _weighted_mean(kind, samples, robust)
    return estimate


def _medoid(
    samples: list[Tensor], weights: list[Tensor], distance: Callable[[Tensor, Tensor], Tensor]
) -> Tensor:
    """Per pixel, the sample whose weighted distance to the others is least (ties: the
    earlier, so the centre)."""
    count = len(samples)
    costs = [torch.zeros_like(weights[0]) for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            d = distance(samples[i], samples[j])
            costs[i].addcmul_(d, weights[j])
            costs[j].addcmul_(d, weights[i])
    best = samples[0]
    least = costs[0]
    for j in range(1, count):
        better = (costs[j] < least) & (weights[j] > 0)
        best = torch.where(better, samples[j], best)
        least = torch.where(better, costs[j], least)
    return best


def _weighted_mean(kind: str, samples: list[Tensor], weights: list[Tensor]) -> Tensor:
    centre = samples[0]
    total = weights[0] + _EPS
    mean = centre * total
    for x, w in zip(samples[1:], weights[1:], strict=True):
        mean.addcmul_(x, w)
        total.add_(w)
    mean.div_(total)
    if kind == "unit_vectors":
        norm = _norm(mean)
        mean = torch.where(norm > _TINY, mean / norm.clamp_min(_TINY), centre)
    return mean


def _norm(x: Tensor) -> Tensor:
    """The length of each pixel's vector (over dim 0); ``linalg.vector_norm`` over the outer
    dimension is some ten times slower on the CPU."""
    return x.square().sum(dim=0).sqrt_()


def _chord(x: Tensor, m: Tensor) -> Tensor:
    return _norm(x - m)


def _relative(x: Tensor, m: Tensor) -> Tensor:
    return _norm(x - m).div_(_norm(m).clamp_min_(_TINY))


def _absolute(x: Tensor, m: Tensor) -> Tensor:
    return (x - m).abs_().amax(dim=0)


def _rms(x: Tensor, m: Tensor) -> Tensor:
    return (x - m).square_().mean(dim=0).sqrt_()


def _total_variation(x: Tensor, m: Tensor) -> Tensor:
    return (x - m).abs_().sum(dim=0).mul_(0.5)


_DISTANCE: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "unit_vectors": _chord,
    "points": _relative,
    "relative_depth": _absolute,
    "colour": _rms,
    "alpha": _absolute,
    "labels": _total_variation,
}


def _all_finite(values: Tensor) -> bool:
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))


__all__ = [
    "DEFAULT_FUSION",
    "KINDS",
    "FusionSettings",
    "StabilisedFrame",
    "TemporalStabiliser",
    "compose",
    "fuse_frame",
    "robust_mean",
    "sampling_grid",
]
