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
- the exceptions are signed zeros (-0.0 + 0.0 is +0.0) and infinities (inf - inf is NaN), so
  wherever ``v == m`` the blender copies v outright.

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
weight map, and work arrays of one tile's size; tiles are added as they arrive and not kept.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tasks.tiling import Feather, FramePlan, Tile


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
        self._scratch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

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
        if not weight_sum.any():
            # The first tile over all these pixels: the step below would be exactly 1.
            mean[...] = new
            weight_sum += weights
            return

        weight_sum += weights
        step, blended, same = self._scratch_for(new.shape)
        np.divide(weights, weight_sum, out=step)  # exactly 1 where this tile is the first
        # inf - inf is NaN for equal infinities; the copy below puts those back.
        with np.errstate(invalid="ignore", over="ignore"):
            np.subtract(new, mean, out=blended)
            blended *= step if self.channels is None else step[..., None]
            blended += mean
        np.equal(new, mean, out=same)
        np.copyto(blended, new, where=same)
        mean[...] = blended

    def _scratch_for(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Work arrays for one tile, reused between tiles: fresh large arrays cost page faults."""
        if self._scratch is None or self._scratch[1].shape != shape:
            self._scratch = (
                np.empty(shape[:2], dtype=np.float32),
                np.empty(shape, dtype=self._mean.dtype),
                np.empty(shape, dtype=bool),
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
