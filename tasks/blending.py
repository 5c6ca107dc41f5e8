"""Blending per-tile model outputs back into one frame, with feathered weights, in torch on the
model's device (the frame-sized accumulator stays there; nothing crosses to the host).

Weights. Each tile weighs its pixels with a separable linear ramp over its overlap with each
neighbour (``Tile.feather``) and 1 elsewhere: along a ramp of length L the weight is
``(i + 0.5) / L`` for the i-th pixel in from the tile edge, so it is strictly positive
everywhere inside the tile (every covered pixel has weight) and the two ramps of a seam add up
to exactly 1 in real arithmetic (a partition of unity, also at corners where the separable
products of four tiles meet). Tile edges, where the model saw the least context, count least.

Exactness. The textbook blend ``sum(w_i * v_i) / sum(w_i)`` does not give back v when every
v_i equals v: ``(w_a*v + w_b*v) / (w_a + w_b)`` rounds twice and is often one ulp off. So the
blender keeps a *running weighted mean* instead of a weighted sum. With S the weight summed so
far at a pixel and m the mean so far, adding a tile value v of weight w does

    S' = S + w;   t = w / S';   m' = m - (m - v) * t

which is the same weighted mean in real arithmetic (``m + (v - m) * t`` rounds identically:
negation is exact), and in floating point:

- the first tile over a pixel (S = 0) is copied: m' = v bit for bit, whatever its weight;
- a later tile with the same finite value has m - v = 0, so m' = m - 0 = m exactly (the sign
  of a zero included: tiles that disagree only on the sign of a zero keep the first one's,
  except that m = -0.0 meeting v = +0.0 gives +0.0);
- non-finite values: a NaN or infinity that meets another tile's value makes the pixel NaN or
  infinite (inf - inf is NaN). Non-finite outputs fail their frame by name
  (``tasks.frame_passes``), so how they mix does not matter; a pixel one tile covers keeps its
  value as it is.

Hence an identity model through plan -> extract -> blend returns its finite input bit-exact,
in float32, with no float64 anywhere. For differing values each step is a convex combination
of the mean so far and the new value, so blended values stay in the range of the tile values
and per-pixel probability vectors (segmentation) keep summing to 1 up to rounding.
Segmentation blends probabilities, never labels; normals are blended as vectors and
re-normalised afterwards (``tasks.normal_rotation.normalize_vectors``): the blender itself
never changes values, or identity would not be exact.

The running mean's last bits depend on the order tiles are added, so add them in plan order
for reproducible files. Memory: one frame-sized accumulator of ``channels`` (channels first,
the EXR's planar layout) plus one weight map, on the device; tiles are added as they arrive and
not kept.

Cost. Only pixels an earlier tile reached need the step above; everywhere else the tile's
value is the mean, and is copied. Which pixels those are follows from the boxes added so far
(``covered_bands``: plain rectangle arithmetic on the host, so the device is never asked), and
tiles added in plan order meet earlier tiles in a strip along their top and one along their
left: at 4096x2160 with the default 1024x768 tiles about half of the tile pixels are copied
rather than blended. A band that earlier tiles reached only in part (tiles added out of order)
is blended where the weight summed so far is positive and copied elsewhere. On the CPU the
step runs a band of rows at a time so its work arrays stay in cache (``tasks.pixel_blocks``);
on a GPU, one kernel per operation over the whole strip.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from tasks.pixel_blocks import row_blocks
from tasks.tiling import Feather, FramePlan, Region, Tile


def _ramp(length: int, before: int, after: int) -> np.ndarray:
    """1-D weights: linear ramps of ``before`` / ``after`` pixels at the two ends, 1 between.

    Where the two ramps overlap (a tile overlapping both neighbours by more than half its
    size) the smaller weight wins, so weights stay in (0, 1].
    """
    weights = np.ones(length, dtype=np.float64)
    position = np.arange(length, dtype=np.float64)
    if before > 0:
        weights = np.minimum(weights, (position + 0.5) / before)
    if after > 0:
        weights = np.minimum(weights, (length - position - 0.5) / after)
    return weights


@lru_cache(maxsize=64)
def _cached_weights(height: int, width: int, feather: Feather) -> np.ndarray:
    rows = _ramp(height, feather.top, feather.bottom)
    cols = _ramp(width, feather.left, feather.right)
    weights = np.outer(rows, cols).astype(np.float32)
    weights.flags.writeable = False
    return weights


@lru_cache(maxsize=64)
def _device_weights(height: int, width: int, feather: Feather, device: str) -> Tensor:
    return torch.from_numpy(_cached_weights(height, width, feather).copy()).to(device)


def feather_weights(tile: Tile) -> np.ndarray:
    """The tile's blending weights over its frame box, float32 (h, w), all in (0, 1].

    Read-only and shared between tiles of the same shape and feather.
    """
    return _cached_weights(tile.box.height, tile.box.width, tile.feather)


class Band(NamedTuple):
    """Rows ``r0:r1`` of a tile (tile-local): earlier tiles reached columns ``c0:c1`` of them
    (none when ``c0 == c1``), all of those pixels, or only some when ``partial``."""

    r0: int
    r1: int
    c0: int
    c1: int
    partial: bool


def covered_bands(box: Region, earlier: Sequence[Region]) -> list[Band]:
    """Where the boxes ``earlier`` overlap ``box``, as bands of rows of ``box``.

    Tiles added in plan order give two or three bands (the strip along the top, the strip
    along the left, maybe the rest); columns reached in several separate runs make one
    ``partial`` band around all of them.
    """
    rects = []
    for other in earlier:
        y0, x0 = max(box.y0, other.y0) - box.y0, max(box.x0, other.x0) - box.x0
        y1, x1 = min(box.y1, other.y1) - box.y0, min(box.x1, other.x1) - box.x0
        if y0 < y1 and x0 < x1:
            rects.append((y0, x0, y1, x1))
    edges = sorted({0, box.height, *(r[0] for r in rects), *(r[2] for r in rects)})
    bands: list[Band] = []
    for r0, r1 in itertools.pairwise(edges):
        runs: list[list[int]] = []
        for x0, x1 in sorted((x0, x1) for y0, x0, y1, x1 in rects if y0 <= r0 and y1 >= r1):
            if runs and x0 <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], x1)
            else:
                runs.append([x0, x1])
        c0, c1 = (runs[0][0], runs[-1][1]) if runs else (0, 0)
        band = Band(r0, r1, c0, c1, len(runs) > 1)
        if bands and bands[-1][2:] == band[2:]:
            bands[-1] = bands[-1]._replace(r1=r1)
        else:
            bands.append(band)
    return bands


class FrameBlender:
    """Accumulates tile outputs into one frame as a running feathered weighted mean, on a
    device: values are (C, h, w) tensors, the result a (C, H, W) tensor."""

    def __init__(
        self,
        height: int,
        width: int,
        channels: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        fill: Sequence[float] | None = None,
    ) -> None:
        """``fill``: a value per channel for pixels no tile covers (the person gate's
        background); without it every pixel must be covered (``result`` raises)."""
        if height < 1 or width < 1:
            raise ValueError(f"cannot blend into an empty frame of {height}x{width} (h x w)")
        if channels < 1:
            raise ValueError(f"channels must be positive, got {channels}")
        self.height = height
        self.width = width
        self.channels = channels
        self.device = torch.device(device)
        self._mean = torch.zeros((channels, height, width), dtype=dtype, device=self.device)
        if fill is not None:
            if len(fill) != channels:
                raise ValueError(f"fill has {len(fill)} values for {channels} channels")
            for channel, value in enumerate(fill):
                if value != 0.0:
                    self._mean[channel].fill_(value)
        self._filled = fill is not None
        self._weight_sum = torch.zeros((height, width), dtype=torch.float32, device=self.device)
        self._boxes: list[Region] = []
        self._scratch: Tensor | None = None

    @classmethod
    def for_plan(
        cls,
        plan: FramePlan,
        channels: int,
        *,
        device: torch.device | str = "cpu",
        fill: Sequence[float] | None = None,
    ) -> FrameBlender:
        if not plan.tiles:
            raise ValueError(f"the {plan.pass_name} plan has no tiles to blend ({plan.note})")
        return cls(plan.height, plan.width, channels, device=device, fill=fill)

    def add(self, tile: Tile, values: Tensor) -> None:
        """Blend one tile's model output, (C, h, w) shaped like the tile array."""
        expected = (self.channels, *tile.shape)
        if tuple(values.shape) != expected:
            raise ValueError(
                f"tile {tile.index} output has shape {tuple(values.shape)}, expected {expected}"
            )
        box = tile.box
        if box.y0 < 0 or box.x0 < 0 or box.y1 > self.height or box.x1 > self.width:
            raise ValueError(
                f"tile {tile.index} box {tuple(box)} lies outside the "
                f"{self.height}x{self.width} frame (h x w)"
            )
        valid = tile.valid
        new = values[:, valid.y0 : valid.y1, valid.x0 : valid.x1].to(
            device=self.device, dtype=self._mean.dtype
        )
        mean = self._mean[:, box.y0 : box.y1, box.x0 : box.x1]
        weight_sum = self._weight_sum[box.y0 : box.y1, box.x0 : box.x1]
        weights = _device_weights(box.height, box.width, tile.feather, str(self.device))
        bands = covered_bands(box, self._boxes)
        reached = {
            band: weight_sum[band.r0 : band.r1, band.c0 : band.c1] > 0
            for band in bands
            if band.partial
        }  # before this tile's weights count
        weight_sum += weights
        for band in bands:
            rows = slice(band.r0, band.r1)
            # Outside [c0, c1) no earlier tile reached these rows: the first value is the mean.
            if band.c0 > 0:
                mean[:, rows, : band.c0] = new[:, rows, : band.c0]
            if band.c1 < box.width:
                mean[:, rows, band.c1 :] = new[:, rows, band.c1 :]
            if band.c1 > band.c0:
                cols = slice(band.c0, band.c1)
                self._blend(
                    mean[:, rows, cols],
                    new[:, rows, cols],
                    weights[rows, cols],
                    weight_sum[rows, cols],
                    reached.get(band),
                )
        self._boxes.append(box)

    def _blend(
        self,
        mean: Tensor,
        new: Tensor,
        weights: Tensor,
        weight_sum: Tensor,
        reached: Tensor | None,
    ) -> None:
        """One running-mean step over a region (``weight_sum`` already includes ``weights``);
        where ``reached`` is given, only its pixels step and the others take ``new``."""
        channels, rows, width = new.shape
        for block in row_blocks(self.device, rows, channels * width * 4):
            count = block.stop - block.start
            step = self._work(count * width, (count, width), 0)
            delta = self._work(channels * count * width, (channels, count, width), 1)
            torch.div(weights[block], weight_sum[block], out=step)
            torch.sub(mean[:, block], new[:, block], out=delta)
            delta.mul_(step)
            if reached is None:
                mean[:, block].sub_(delta)
            else:
                torch.sub(mean[:, block], delta, out=delta)
                torch.where(reached[block], delta, new[:, block], out=delta)
                mean[:, block] = delta

    def _work(self, numel: int, shape: tuple[int, ...], slot: int) -> Tensor:
        """Work arrays reused between steps (two slots in one buffer): fresh arrays cost page
        faults on the CPU and allocator calls on a GPU."""
        per_slot = self._scratch.numel() // 2 if self._scratch is not None else 0
        if per_slot < numel:
            per_slot = max(numel, 2 * per_slot)
            self._scratch = torch.empty(2 * per_slot, dtype=torch.float32, device=self.device)
        assert self._scratch is not None
        return self._scratch[slot * per_slot : slot * per_slot + numel].view(shape)

    def covered(self) -> Tensor:
        """Boolean (H, W): pixels that at least one added tile covers."""
        return self._weight_sum > 0

    def result(self) -> Tensor:
        """The blended frame, (C, H, W); a pixel no tile covered holds the fill, or raises
        when there is none.

        Returns the accumulator itself, not a copy: do not add more tiles afterwards.
        """
        whole = Region(0, 0, self.height, self.width)
        gaps = (
            []
            if self._filled
            else [
                band
                for band in covered_bands(whole, self._boxes)
                if band.partial or (band.c0, band.c1) != (0, self.width)
            ]
        )
        if gaps:
            rows = ", ".join(f"{band.r0}-{band.r1 - 1}" for band in gaps[:3])
            raise ValueError(
                f"pixels of rows {rows} are covered by no tile; "
                "add every tile of the plan before taking the result"
            )
        self._scratch = None
        return self._mean
