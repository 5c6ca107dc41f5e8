"""The numpy per-pixel code the platform ran on the host before it moved to torch on the
model's device (commit e543ce9), kept verbatim as the yardstick the device code must equal:
bit for bit where it was exact, within a stated tolerance where the arithmetic differs
(tests/test_device_pixels.py). Test-only: nothing of the product imports it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from storage.cryptomatte import DEFAULT_MIN_COVERAGE, DEFAULT_RANKS, float_id, manifest
from tasks.anamorphic import _area_taps, _linear_taps  # unchanged: the taps, not the pixels
from tasks.blending import feather_weights  # unchanged: the weights, not the blending
from tasks.tiling import FramePlan, Tile

_LABEL_BLOCK_BYTES = 1 << 20
_RANK_BLOCK_BYTES = 1 << 20


_BLEND_BLOCK_BYTES = 256 * 1024  # rows of work arrays per step: a fraction of a core's L2 cache
_MAX_BANDS = 16


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
        block = max(1, min(height, _BLEND_BLOCK_BYTES // max(1, new[0].nbytes)))
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


def rank_channels(
    probabilities: np.ndarray,
    names: Sequence[str],
    layer_name: str,
    ranks: int = DEFAULT_RANKS,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> dict[str, np.ndarray]:
    """Ranked ID/coverage channels (float32, H x W each) from (H, W, C) class probabilities.

    `names[c]` is the name of class `c`. `ranks` is rounded up to a whole RGBA layer; ranks
    beyond the number of classes stay 0.
    """
    if probabilities.ndim != 3 or probabilities.shape[2] != len(names):
        raise ValueError(
            f"probabilities must be (H, W, {len(names)}) for {len(names)} class names, "
            f"got {probabilities.shape}"
        )
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    ids = np.array([float_id(name) for name in manifest(names)], dtype=np.float32)
    height, width, classes = probabilities.shape
    layers = (ranks + 1) // 2
    kept = min(ranks, classes)
    # Rank by sorting packed uint32 keys: the bit pattern of a non-negative float32 orders like
    # the float, so its lowest mantissa bits are replaced by the class index and one sort of
    # the `classes` keys per pixel (numpy's SIMD sort; faster than a partition plus a sort of
    # the top `kept`, and several times faster than argpartition + take_along_axis) gives
    # classes and probabilities together. The coverage loses those low bits (relative error
    # < 2**-(23 - index_bits), 4e-6 for 29 classes) before renormalising.
    index_bits = max(1, (classes - 1).bit_length())
    if index_bits > 16:
        raise ValueError(f"too many classes ({classes}) for one Cryptomatte layer")
    index_mask = np.uint32((1 << index_bits) - 1)
    value_mask = np.uint32(0x7FFFFFFF ^ int(index_mask))  # the sign bit too: -0.0 ranks as 0
    # rank, (id, coverage), pixel: each block of rows is one run of pixels in every plane
    planes = np.zeros((layers * 2, 2, height * width), dtype=np.float32)
    block_rows = max(1, _RANK_BLOCK_BYTES // max(1, width * classes * 4))
    keys_buffer = np.empty((block_rows * width, classes), dtype=np.uint32)
    # The class index of every key, as a full block: OR-ing a broadcast row is slower.
    class_index = np.tile(np.arange(classes, dtype=np.uint32), (block_rows * width, 1))
    top_buffer = np.empty((kept, block_rows * width), dtype=np.uint32)
    for top in range(0, height, block_rows):
        rows = slice(top, min(top + block_rows, height))
        block = np.ascontiguousarray(probabilities[rows], dtype=np.float32)
        bits = block.view(np.uint32).reshape(-1, classes)
        # Finite non-negative float32 values are exactly the bit patterns below +inf's, and
        # -0.0 (0x80000000); one max finds out whether the full check is needed.
        if bits.max() >= 0x7F800000 and (not np.isfinite(block).all() or (block < 0).any()):
            raise ValueError("class probabilities must be finite and non-negative")
        count = bits.shape[0]
        keys = keys_buffer[:count]
        np.bitwise_and(bits, value_mask, out=keys)
        keys |= class_index[:count]
        keys.sort(axis=-1)
        best = top_buffer[:, :count]
        np.copyto(best, keys[:, ::-1][:, :kept].T)  # (kept, pixels), rank 0 first
        pixels = slice(top * width, top * width + count)
        pixel_ids, coverage = planes[:kept, 0, pixels], planes[:kept, 1, pixels]
        np.bitwise_and(best, value_mask, out=coverage.view(np.uint32))
        np.copyto(coverage, np.float32(0.0), where=coverage < min_coverage)
        total = coverage.sum(axis=0)
        np.divide(coverage, total, out=coverage, where=total > 0)
        best &= index_mask
        np.take(ids, best, out=pixel_ids, mode="clip")  # indices < classes: no check
        np.copyto(pixel_ids, np.float32(0.0), where=coverage == 0)
    channels: dict[str, np.ndarray] = {}
    for layer in range(layers):
        prefix = f"{layer_name}{layer:02d}"
        channels[f"{prefix}.R"] = planes[2 * layer, 0].reshape(height, width)
        channels[f"{prefix}.G"] = planes[2 * layer, 1].reshape(height, width)
        channels[f"{prefix}.B"] = planes[2 * layer + 1, 0].reshape(height, width)
        channels[f"{prefix}.A"] = planes[2 * layer + 1, 1].reshape(height, width)
    return channels


def class_labels(probabilities: np.ndarray, dtype: Any = np.uint32) -> np.ndarray:
    """argmax over the last axis of (H, W, C) class probabilities, as `dtype` (H, W).

    A band of rows at a time, so the index temporaries stay small and in cache instead of a
    frame of int64 that is then converted.
    """
    height, width = probabilities.shape[:2]
    labels = np.empty((height, width), dtype=dtype)
    rows = max(1, _LABEL_BLOCK_BYTES // max(1, probabilities[:1].nbytes))
    for top in range(0, height, rows):
        block = slice(top, top + rows)
        labels[block] = np.argmax(probabilities[block], axis=-1)
    return labels


def rotate_normals(normals: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """``rotation @ n`` for every vector of ``normals`` (..., 3), in the normals' dtype.

    An exact identity rotation returns ``normals`` itself, bit for bit.
    """
    if normals.shape[-1:] != (3,):
        raise ValueError(f"normals must have 3 components in the last axis, got {normals.shape}")
    if np.array_equal(rotation, np.eye(3)):
        return normals
    return normals @ rotation.T.astype(normals.dtype)


def normalize_vectors(vectors: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Vectors (..., 3) scaled to unit length (a new array); near-zero vectors stay near zero.

    Use after blending or resampling normals: weighted means of unit vectors are shorter.
    """
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, np.asarray(eps, dtype=vectors.dtype))


def resample_width(values: np.ndarray, width: int) -> np.ndarray:
    """Resample (H, W[, C]) to (H, width[, C]) in float32: linear up, area average down."""
    if width < 1:
        raise ValueError(f"target width must be positive, got {width}")
    source_width = values.shape[1]
    if width > source_width:
        indices, weights = _linear_taps(source_width, width)
    else:
        indices, weights = _area_taps(source_width, width)
    source = np.asarray(values, dtype=np.float32)
    out = np.zeros((source.shape[0], width, *source.shape[2:]), dtype=np.float32)
    trailing = (1,) * (source.ndim - 2)
    for tap in range(indices.shape[1]):
        out += source[:, indices[:, tap]] * weights[:, tap].reshape(width, *trailing)
    return out
