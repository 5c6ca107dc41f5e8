"""Blending per-tile model outputs back into one frame, with feathered weights.

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

    S' = S + w;   t = w / S';   m' = m + (v - m) * t

which is the same weighted mean in real arithmetic, and in floating point:

- the first tile over a pixel has S = 0, so S' = w and t = w / w = 1 exactly, and
  m' = 0 + (v - 0) * 1 = v exactly: a pixel only one tile covers gets that tile's value
  bit for bit, whatever its weight;
- a later tile with the same value has v - m = 0, so m' = m + 0 = m exactly;
- the exceptions are signed zeros (-0.0 + 0.0 is +0.0) and infinities (inf - inf is NaN).
  The blender computes the step as ``m' = m - (m - v) * t`` (see "Cost" below), where
  ``m - 0`` keeps m's zero sign, and copies v outright where v and m are equal infinities.
  So wherever ``v == m`` the result is v, with one exception: tiles that disagree on the
  sign of a zero (m = +0.0, then v = -0.0) keep the earlier tile's +0.0.

Hence an identity model through plan -> extract -> blend returns its input bit-exact, in
float32, with no float64 anywhere. For differing values each step is a convex combination of
the mean so far and the new value, so blended values stay in the range of the tile values
and per-pixel probability vectors (segmentation) keep summing to 1 up to rounding. Where
tiles disagree and one of them is not finite (or the two differ by more than the float
range), the pixel becomes inf or NaN: model outputs are expected to be finite.
Segmentation blends probabilities, never labels; normals are blended as vectors and should
be re-normalised afterwards (``tasks.normal_rotation.normalize_vectors``): the blender itself
never changes values, or identity would not be exact.

The running mean's last bits depend on the order tiles are added, so add them in plan order
for reproducible files. Memory: one frame-sized accumulator of ``channels`` plus one float32
weight map, and work arrays of a few rows; tiles are added as they arrive and not kept.

Cost. Only pixels an earlier tile reached need the step above; everywhere else the tile's
value is the mean, and is copied. Tiles added in plan order meet earlier tiles in a strip
along their top and one along their left (``_covered_bands``), so at 4096x2160 with the
default 1024x768 tiles about half of the tile pixels are copied rather than blended. The step
itself is computed as ``m' = m - (m - v) * t`` (the same rounding as ``m + (v - m) * t``,
since negation is exact, and ``m - 0`` keeps the sign of a zero, so equal values leave m as it
is without a comparison pass), a few rows at a time so that the work arrays stay in the CPU
cache; a NaN in ``m - v`` (a NaN, or equal infinities) sends that block through the careful
step with the explicit ``v == m`` copy. Measured on 2 cores, identity stand-in, all five
passes of a 4096x2160 frame: 2.8 core-s before, 0.8 after, with bit-identical results
(also for random tiles in random order) except for the opposite-signed zeros above.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from tasks.tiling import Feather, FramePlan, Tile

_BLOCK_BYTES = 256 * 1024  # rows of work arrays per step: a fraction of a core's L2 cache
_MAX_BANDS = 16


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


def feather_weights(tile: Tile) -> np.ndarray:
    """The tile's blending weights over its frame box, float32 (h, w), all in (0, 1].

    Read-only and shared between tiles of the same shape and feather.
    """
    return _cached_weights(tile.box.height, tile.box.width, tile.feather)


class FrameBlender:
    """Accumulates tile outputs into one frame as a running feathered weighted mean.

    ``channels`` is the last axis of the values (3 for normals, 29 for segmentation
    probabilities), or None for single-channel passes given as (h, w) arrays (matte).
    """

    def __init__(
        self,
        height: int,
        width: int,
        channels: int | None,
        dtype: np.dtype | type = np.float32,
    ) -> None:
        if height < 1 or width < 1:
            raise ValueError(f"cannot blend into an empty frame of {height}x{width} (h x w)")
        if channels is not None and channels < 1:
            raise ValueError(f"channels must be positive or None, got {channels}")
        self.height = height
        self.width = width
        self.channels = channels
        shape = (height, width) if channels is None else (height, width, channels)
        self._mean = np.zeros(shape, dtype=dtype)
        self._weight_sum = np.zeros((height, width), dtype=np.float32)
        self._scratch: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def for_plan(
        cls, plan: FramePlan, channels: int | None, dtype: np.dtype | type = np.float32
    ) -> FrameBlender:
        if not plan.tiles:
            raise ValueError(f"the {plan.pass_name} plan has no tiles to blend ({plan.note})")
        return cls(plan.height, plan.width, channels, dtype)

    def add(self, tile: Tile, values: np.ndarray) -> None:
        """Blend one tile's model output, shaped like the tile array (``tile.shape`` [+ C])."""
        trailing = () if self.channels is None else (self.channels,)
        expected = (*tile.shape, *trailing)
        if values.shape != expected:
            raise ValueError(
                f"tile {tile.index} output has shape {values.shape}, expected {expected}"
            )
        box = tile.box
        if box.y0 < 0 or box.x0 < 0 or box.y1 > self.height or box.x1 > self.width:
            raise ValueError(
                f"tile {tile.index} box {tuple(box)} lies outside the "
                f"{self.height}x{self.width} frame (h x w)"
            )
        new = np.asarray(values[tile.valid.slices], dtype=self._mean.dtype)
        mean = self._mean[box.slices]
        weight_sum = self._weight_sum[box.slices]
        weights = feather_weights(tile)
        covered = weight_sum > 0  # pixels an earlier tile reached
        bands = _covered_bands(covered)
        weight_sum += weights
        for r0, r1, c0, c1 in bands:
            rows = slice(r0, r1)
            # Outside [c0, c1) no earlier tile reached these rows: the first value is the mean.
            if c0 > 0:
                mean[rows, :c0] = new[rows, :c0]
            if c1 < box.width:
                mean[rows, c1:] = new[rows, c1:]
            if c1 > c0:
                cols = slice(c0, c1)
                reached = covered[rows, cols]
                self._blend(
                    mean[rows, cols],
                    new[rows, cols],
                    weights[rows, cols],
                    weight_sum[rows, cols],
                    reached,
                    careful=not reached.all(),
                )

    def _blend(
        self,
        mean: np.ndarray,
        new: np.ndarray,
        weights: np.ndarray,
        weight_sum: np.ndarray,
        reached: np.ndarray,
        careful: bool,
    ) -> None:
        """One running-mean step over a region, a few rows at a time so that the work arrays
        stay in the CPU cache; ``weight_sum`` already includes ``weights``; ``reached`` marks
        the pixels an earlier tile reached, ``careful`` that some were not (``_careful_step``).
        """
        height = weights.shape[0]
        block = max(1, min(height, _BLOCK_BYTES // max(1, new[0].nbytes)))
        step_buffer, delta_buffer = self._scratch_for(block, new.shape[1:])
        vector = self.channels is not None
        for top in range(0, height, block):
            rows = slice(top, min(top + block, height))
            step = step_buffer[: rows.stop - top]
            np.divide(weights[rows], weight_sum[rows], out=step)
            if careful:
                _careful_step(mean[rows], new[rows], step, reached[rows], vector)
                continue
            delta = delta_buffer[: rows.stop - top]
            # m' = m - (m - v) * t rounds exactly like m + (v - m) * t, and where v == m it
            # gives m - 0 = m, the sign of a zero included: equal values leave m untouched.
            with np.errstate(invalid="ignore", over="ignore"):
                np.subtract(mean[rows], new[rows], out=delta)
                np.multiply(delta, step[..., None] if vector else step, out=delta)
                unusual = np.isnan(np.add.reduce(delta, axis=None))
            if unusual:  # a NaN, or equal infinities (inf - inf): the careful step copies v
                _careful_step(mean[rows], new[rows], step, reached[rows], vector)
            else:
                np.subtract(mean[rows], delta, out=mean[rows])

    def _scratch_for(self, rows: int, trailing: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Work arrays of ``rows`` rows, reused between calls: fresh arrays cost page faults."""
        width = trailing[0]
        if (
            self._scratch is None
            or self._scratch[0].shape[0] < rows
            or self._scratch[1].shape[1:] != trailing
        ):
            self._scratch = (
                np.empty((rows, width), dtype=np.float32),
                np.empty((rows, *trailing), dtype=self._mean.dtype),
            )
        return self._scratch

    def covered(self) -> np.ndarray:
        """Boolean (H, W): pixels that at least one added tile covers."""
        return self._weight_sum > 0

    def result(self) -> np.ndarray:
        """The blended frame, (H, W[, C]); raises if any pixel was covered by no tile.

        Returns the accumulator itself, not a copy: do not add more tiles afterwards.
        """
        uncovered = int(np.count_nonzero(self._weight_sum == 0))
        if uncovered:
            raise ValueError(
                f"{uncovered} of {self.height * self.width} pixels are covered by no tile; "
                "add every tile of the plan before taking the result"
            )
        return self._mean


def _covered_bands(covered: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Bands of rows ``(r0, r1, c0, c1)`` of a tile: in rows ``r0:r1`` every pixel an earlier
    tile reached lies in columns ``c0:c1`` (``c0 == c1`` when none did).

    Tiles added in plan order meet earlier tiles in a strip along the top and one along the
    left, so this gives two or three bands, and only those strips are blended: the rest is a
    copy. Irregular coverage (many bands) falls back to one band around all of it.
    """
    height, width = covered.shape
    any_row = covered.any(axis=1)
    if not any_row.any():
        return [(0, height, 0, 0)]
    first = np.where(any_row, covered.argmax(axis=1), 0)
    last = np.where(any_row, width - covered[:, ::-1].argmax(axis=1), 0)
    key = first.astype(np.int64) * (width + 1) + last
    starts = (np.flatnonzero(np.diff(key)) + 1).tolist()
    if len(starts) < _MAX_BANDS:
        edges = [0, *starts, height]
        return [(r0, r1, int(first[r0]), int(last[r0])) for r0, r1 in itertools.pairwise(edges)]
    rows = np.flatnonzero(any_row)
    r0, r1 = int(rows[0]), int(rows[-1]) + 1
    c0, c1 = int(first[any_row].min()), int(last[any_row].max())
    bands = [(0, r0, 0, 0)] if r0 > 0 else []
    bands.append((r0, r1, c0, c1))
    if r1 < height:
        bands.append((r1, height, 0, 0))
    return bands


def _careful_step(
    mean: np.ndarray, new: np.ndarray, step: np.ndarray, reached: np.ndarray, vector: bool
) -> None:
    """m' = m + (v - m) * t with v copied where v == m (equal infinities; equal zeros except
    m = +0.0, v = -0.0, which keeps +0.0 as the fast step does) and where no earlier tile
    reached the pixel (``reached`` False: the first value is the mean, zeros' signs too)."""
    with np.errstate(invalid="ignore", over="ignore"):
        blended = new - mean
        blended *= step[..., None] if vector else step
        blended += mean
    copy = new == mean
    copy &= ~((mean == 0) & np.signbit(new) & ~np.signbit(mean))
    copy |= ~(reached[..., None] if vector else reached)
    np.copyto(blended, new, where=copy)
    mean[...] = blended
