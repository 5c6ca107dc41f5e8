"""One frame's fusion: each pass of the centre frame fused with its neighbours' passes warped
to it along the plate's motion, by the rule of its kind of values (``tasks.stabilise.rules``).
``fuse_frame`` fuses a whole frame at the fusion's (reduced) size; ``fuse_pixels`` fuses some
of its pixels at the plate's own size (those near edges, ``tasks.stabilise.lift``), with the
same samples, weights and rule.

Each sample's weight is the product of the flow's confidence (0 where the pixel is hidden in
the neighbour or leaves the frame: no ghosting at occlusions), the temporal kernel over the
frame distance, the sample's certainty (``warp_with_certainty``: a sample whose taps straddle
an edge of its own frame loses its weight) and a robustness term (``robust_mean``: a sample far
from what the others agree on loses its weight). Points fuse depth along the flow and the ray
at the pixel; relative depth fuses where the person is and its depth there apart. Why:
docs/design/stabilisation.md.

On the CPU the work runs over bands of rows (``tasks.pixel_blocks``), so the warped samples of
a band stay in cache; on a GPU over the whole frame.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tasks.pixel_blocks import row_blocks
from tasks.stabilise.rules import (
    DISTANCE,
    NEAREST_CERTAINTY,
    OFF_PERSON,
    TINY,
    all_finite,
    on_person,
    robust_mean,
    warp,
    warp_relative_depth,
    warp_with_certainty,
)
from tasks.stabilise.settings import FusionSettings

# Bands of rows on the CPU: per band and neighbour a few dozen torch operations, so bands must
# be large enough to hide their overhead (see tasks.pixel_blocks); the samples of every pass of
# every frame of the window are held for one band.
BAND_BYTES = 24 << 20


@dataclass
class Fused:
    """The fusion of a frame's passes of one size (``TemporalStabiliser.groups``), until the
    frame is returned: fused at the plate's size (``pixels`` None), or at the reduced size,
    with ``exact``, the (C, N) values of the plate pixels ``pixels`` fused at the plate's
    size."""

    passes: dict[str, Tensor]
    pixels: Tensor | None = None
    exact: dict[str, Tensor] | None = None


@dataclass
class Frame:
    """A frame in the stabiliser's window: its passes at the plate's and the fusion's sizes,
    its flow image and its motion to the frames beside it."""

    frame: int
    passes: dict[str, Tensor]  # at the plate's size
    reduced: dict[str, Tensor]  # each at its fusion size (the pushed tensor when the plate's)
    nonfinite: frozenset[str]
    image: np.ndarray  # the flow image (small: at most FlowSettings.max_side)
    # flow resolution, on the device: to the next / previous frame and its confidence
    forward: Tensor | None = None
    forward_confidence: Tensor | None = None
    backward: Tensor | None = None
    backward_confidence: Tensor | None = None
    fused: list[Fused] | None = None  # one per group of passes fused at one size
    # relative depth as its neighbours warp it (``on_person``), per (pass, plate size): made
    # once, not for every band and centre (a 4K plane is 8.8 million pixels)
    prepared: dict[tuple[str, bool], Tensor] = field(default_factory=dict)

    def on_person(self, name: str, full: bool) -> Tensor:
        key = (name, full)
        if key not in self.prepared:
            self.prepared[key] = on_person(self.passes[name] if full else self.reduced[name])
        return self.prepared[key]


@dataclass
class Neighbour:
    """A frame of the centre's window as the fusion at one size samples it."""

    frame: Frame
    distance: int  # frames from the centre
    grid: Tensor  # (1, h, w, 2) normalised sampling positions in the neighbour, fusion size
    weight: Tensor  # (h, w) confidence x temporal kernel, fusion size
    flow: Tensor  # (h, w, 2) the flow there and its confidence (h, w), at flow resolution
    confidence: Tensor
    kernel: float  # the temporal kernel's weight at this distance


def fuse_frame(
    centre: Mapping[str, Tensor],
    nonfinite: frozenset[str] | set[str],
    neighbours: list[Neighbour],
    kinds: Mapping[str, str],
    settings: FusionSettings,
) -> dict[str, Tensor]:
    """Every pass of the centre frame (at the fusion's size) fused with its warped neighbours'
    reduced passes (see the module): band by band of rows on the CPU."""
    if not neighbours:
        return dict(centre)
    first = next(iter(centre.values()))
    height = first.shape[1]
    device = first.device
    channels = sum(values.shape[0] for values in centre.values())
    bytes_per_row = channels * first.shape[2] * 4 * (len(neighbours) + 4)
    out = {name: torch.empty_like(values) for name, values in centre.items()}
    kernel = settings.kernel(0)
    for rows in row_blocks(device, height, bytes_per_row, BAND_BYTES):
        band = Band(
            lambda values, rows=rows: values[:, rows],
            [(n.grid[:, rows], n.weight[rows]) for n in neighbours],
            torch.full_like(neighbours[0].weight[rows], kernel),
            neighbours,
            settings,
            full=False,
        )
        for name, fused in band.fuse_all(centre, nonfinite, kinds).items():
            out[name][:, rows] = fused
    return out


def fuse_pixels(
    centre: Mapping[str, Tensor],
    nonfinite: frozenset[str] | set[str],
    pixels: Tensor,
    neighbours: list[Neighbour],
    kinds: Mapping[str, str],
    settings: FusionSettings,
) -> dict[str, Tensor]:
    """The fusion at the plate's own size, for some of its pixels only (``pixels``: flat
    indices into (H, W)): each pass's (C, N) fused values there. The same samples, weights
    and rule as ``fuse_frame`` over a whole plate-size frame, with each neighbour's flow and
    confidence looked up at those pixels (as ``to_plate`` would upsample them) and its
    plate-size passes warped there."""
    first = next(iter(centre.values()))
    height, width = first.shape[1:]
    count = int(pixels.numel())
    channels = sum(values.shape[0] for values in centre.values())
    step = max(1, BAND_BYTES // (channels * 4 * (len(neighbours) + 4)))
    if first.device.type != "cpu":
        step = max(1, count)
    ys = torch.div(pixels, width, rounding_mode="floor").to(torch.float32)
    xs = (pixels % width).to(torch.float32)
    looked_up = _pixel_motion(neighbours, xs, ys, (height, width))
    out = {name: torch.empty(values.shape[0], count, device=values.device) for name, values in
           centre.items()}  # fmt: skip
    kernel = settings.kernel(0)
    for start in range(0, count, step):
        part = slice(start, min(start + step, count))
        index = pixels[part]

        def take(values: Tensor, index: Tensor = index) -> Tensor:
            return values.reshape(values.shape[0], -1).index_select(1, index)[:, None, :]

        band = Band(
            take,
            [(grid[:, :, part], weight[:, part]) for grid, weight in looked_up],
            torch.full((1, part.stop - part.start), kernel, device=first.device),
            neighbours,
            settings,
            full=True,
        )
        for name, fused in band.fuse_all(centre, nonfinite, kinds).items():
            out[name][:, part] = fused[:, 0]
    return out


def _pixel_motion(
    neighbours: list[Neighbour], xs: Tensor, ys: Tensor, plate_hw: tuple[int, int]
) -> list[tuple[Tensor, Tensor]]:
    """Per neighbour, at the plate pixels (xs, ys): its sampling positions (1, 1, N, 2) and
    base weights (1, N), from the flow-resolution flow and confidence."""
    height, width = plate_hw
    at = torch.stack([(2.0 * xs + 1.0) / width - 1.0, (2.0 * ys + 1.0) / height - 1.0], dim=-1)
    out = []
    for n in neighbours:
        h, w = n.flow.shape[:2]
        fields = torch.cat([n.flow, n.confidence[..., None]], dim=-1).permute(2, 0, 1)[None]
        found = F.grid_sample(
            fields, at[None, None], mode="bilinear", padding_mode="border", align_corners=False
        )[0, :, 0]
        x = (xs + found[0] * (width / w)).mul_(2.0 / max(width - 1, 1)).sub_(1.0)
        y = (ys + found[1] * (height / h)).mul_(2.0 / max(height - 1, 1)).sub_(1.0)
        out.append((torch.stack([x, y], dim=-1)[None, None], found[2][None] * n.kernel))
    return out


class Band:
    """Some pixels of the centre frame (a band of rows, or a list of pixels): ``take`` picks
    them out of a frame-size pass; per neighbour its sampling positions there and its base
    weight; the centre's own weight (its kernel). ``full``: the neighbours' plate-size passes
    are sampled, else their reduced ones."""

    def __init__(
        self,
        take: Callable[[Tensor], Tensor],
        motion: list[tuple[Tensor, Tensor]],
        centre_weight: Tensor,
        neighbours: list[Neighbour],
        settings: FusionSettings,
        *,
        full: bool,
    ) -> None:
        self.take = take
        self.grids = [grid for grid, _ in motion]
        self.neighbours = neighbours
        self.settings = settings
        self.full = full
        self.base = [centre_weight, *(weight for _, weight in motion)]

    def source(self, neighbour: Neighbour, name: str) -> Tensor:
        frame = neighbour.frame
        return frame.passes[name] if self.full else frame.reduced[name]

    def fuse_all(
        self,
        centre: Mapping[str, Tensor],
        nonfinite: frozenset[str] | set[str],
        kinds: Mapping[str, str],
    ) -> dict[str, Tensor]:
        out = {}
        for name, kind in kinds.items():
            dirty = name in nonfinite or any(name in n.frame.nonfinite for n in self.neighbours)
            if kind == "points":
                out[name] = self.fuse_points(centre[name], name, dirty)
            elif kind == "relative_depth":
                out[name] = self.fuse_relative_depth(centre[name], name, dirty)
            else:
                warped, weights = self.warped(name, kind)
                samples = [self.take(centre[name]), *warped]
                out[name] = self.fuse(kind, samples, weights, dirty)
        return out

    def warped(
        self, name: str, kind: str, channels: slice | None = None
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Each neighbour's pass (``channels`` of it) warped to the centre, and the weights of
        all the samples, the centre's first: each neighbour's base weight times its sample's
        certainty (``warp_with_certainty``; relative depth has its own,
        ``fuse_relative_depth``)."""
        samples, weights = [], [self.base[0]]
        scale, certain = self.settings.scale(kind), kind in NEAREST_CERTAINTY
        for neighbour, grid, base in zip(self.neighbours, self.grids, self.base[1:], strict=True):
            values = self.source(neighbour, name)
            if channels is not None:
                values = values[channels]
            if certain:
                sample, certainty = warp_with_certainty(values, grid, DISTANCE[kind], scale)
            else:
                sample, certainty = warp(values, grid, "bilinear"), None
            samples.append(sample)
            weights.append(base if certainty is None else base * certainty)
        return samples, weights

    def fuse_relative_depth(self, centre: Tensor, name: str, dirty: bool) -> Tensor:
        """Relative depth: where the person is, and its depth there, are fused apart. The
        person: the robust mean of the samples (``warp_relative_depth``) weighted by their share
        certainty, -1 or a depth, so a pixel is on it where most trusted samples say so. Its
        depth: the robust mean of the samples on the person only, weighted by their share and
        slope certainties. Weighted as one, a neighbour on a steep rim lost its vote with its
        value, and the silhouette pixels a per-frame mask had missed stayed missed."""
        here = self.take(centre)
        samples, person_weights, depth_weights = [here], [self.base[0]], [self.base[0]]
        for neighbour, grid, base in zip(self.neighbours, self.grids, self.base[1:], strict=True):
            pair = neighbour.frame.on_person(name, self.full)
            sample, certainty, steadiness = warp_relative_depth(pair, grid)
            samples.append(sample)
            person_weights.append(base * certainty)
            depth_weights.append(base * certainty * steadiness)
        voted = self.fuse("relative_depth", samples, person_weights, dirty)
        on = [x[0] > OFF_PERSON for x in samples]
        depth_weights = [w * o for w, o in zip(depth_weights, on, strict=True)]
        # a centre off the person has no weight, and the voted depth stands in for it: the
        # depth where no sample on the person is trusted
        samples[0] = torch.where(on[0], here, voted)
        depth = self.fuse("relative_depth", samples, depth_weights, dirty)
        # off the person -1 (a non-finite vote stays so: ``Band.fuse``)
        return torch.where(voted > OFF_PERSON, depth, voted.clamp(max=-1.0))

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
        here = self.take(centre)
        warped, weights = self.warped(name, "points", slice(2, 3))
        fused_depth = self.fuse("points", [here[2:3], *warped], weights, dirty)
        rays = [here] + [self.take(self.source(n, name)) for n in self.neighbours]
        rays = [p / p[2:3] for p in rays]
        kernel = [torch.full_like(w, self.settings.kernel(0)) for w in self.base[:1]]
        kernel += [torch.full_like(w, self.settings.kernel(n.distance)) for w, n in
                   zip(self.base[1:], self.neighbours, strict=True)]  # fmt: skip
        # a ray is not finite where its point's depth is 0 (or its point is not): looked for,
        # as the finite path is the same fusion without a copy and a mask of every sample
        finite = not dirty and all(all_finite(ray) for ray in rays)
        fused_ray = self.fuse("points", rays, kernel, not finite)
        points = fused_ray * (fused_depth / fused_ray[2:3])
        usable = torch.isfinite(points).all(dim=0) & (here[2].abs() > TINY)
        return torch.where(usable, points, here)


# The kinds whose neighbours' samples get a certainty from their bilinear value against the
