"""Desqueezing anamorphic plates for the model and squeezing its outputs back.

An anamorphic plate stores pixels that are ``pixel_aspect`` (PAR) times wider than tall. The
model wants square pixels, so ``desqueeze`` resamples the width to round(W * PAR) (2.0 -> twice
as wide) and every pass is planned, predicted and blended on that desqueezed frame.
``resqueeze`` resamples the outputs back to the plate's width, so they line up pixel for pixel
with the plate, whose EXR header keeps its pixelAspectRatio. Both run in torch on the model's
device.

Resampling runs along the width only: linear interpolation (pixel centres at j + 0.5, edges
clamped) when enlarging, exact area averaging when shrinking (each output pixel is the mean of
the input it covers, partial pixels weighted by the covered fraction). The weights of every
output pixel sum to 1, so segmentation probabilities keep summing to 1. Written here rather
than taken from Pillow or OpenImageIO because their box filters give a partly covered pixel
all or nothing of its weight at non-integer ratios (1.33x, 1.8x lenses), which is not an area
average; the banded gather below is exact and vectorised.

Normals need no component change when squeezing. They are directions in 3-D camera space,
and squeezing only changes how that space is sampled onto pixels (the plate's horizontal focal
length in plate pixels is f / PAR, its vertical one f, with f the focal length in desqueezed
pixels); the surface seen at a plate pixel has the same 3-D normal either way. A 1/PAR factor
on x belongs to quantities measured in pixels (screen-space gradients, motion vectors, 2-D
keypoint x, the focal length along x), not to camera-space normals or points. What resampling
does change is length: an average of unit vectors is shorter than 1, so ``unit_vectors=True``
re-normalises after resampling. Pointmap XYZ stay as they are for the same reason.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from tasks.normal_rotation import normalize_vectors


def desqueezed_width(width: int, pixel_aspect: float) -> int:
    """Width in square pixels of a plate ``width`` pixels wide with the given PAR."""
    _check_pixel_aspect(pixel_aspect)
    return max(1, round(width * pixel_aspect))


def desqueeze(pixels: Tensor, pixel_aspect: float) -> Tensor:
    """Resample ``pixels`` (C, H, W), on any device, to square pixels: (C, H, round(W * PAR)),
    float32. PAR 1.0 returns ``pixels`` itself."""
    _check_pixel_aspect(pixel_aspect)
    if pixel_aspect == 1.0:
        return pixels
    return resample_width(pixels, desqueezed_width(pixels.shape[-1], pixel_aspect))


def resqueeze(values: Tensor, width: int, *, unit_vectors: bool = False) -> Tensor:
    """Resample model outputs (C, H, W') back to the plate's ``width``, float32.

    ``unit_vectors=True`` (normals, C = 3) re-normalises each vector afterwards. Same width
    returns ``values`` itself.
    """
    if values.shape[-1] == width:
        return values
    resampled = resample_width(values, width)
    return normalize_vectors(resampled) if unit_vectors else resampled


def resample_width(values: Tensor, width: int) -> Tensor:
    """Resample (..., W) to (..., width) in float32 on the values' device: linear up, area
    average down. Each output pixel is its taps' weighted sum, added tap by tap."""
    if width < 1:
        raise ValueError(f"target width must be positive, got {width}")
    source_width = values.shape[-1]
    if width > source_width:
        indices, weights = _linear_taps(source_width, width)
    else:
        indices, weights = _area_taps(source_width, width)
    source = values.to(torch.float32)
    out = source.new_zeros((*source.shape[:-1], width))
    taps = torch.from_numpy(np.ascontiguousarray(indices.T)).to(source.device)
    tap_weights = torch.from_numpy(np.ascontiguousarray(weights.T)).to(source.device)
    for tap in range(indices.shape[1]):
        out += torch.index_select(source, -1, taps[tap]) * tap_weights[tap]
    return out


def _linear_taps(source_width: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Two taps per output pixel for linear interpolation with half-pixel centres."""
    centers = (np.arange(width) + 0.5) * (source_width / width) - 0.5
    centers = np.clip(centers, 0.0, source_width - 1)
    left = np.floor(centers).astype(np.int64)
    right = np.minimum(left + 1, source_width - 1)
    fraction = centers - left
    weights = np.stack([1.0 - fraction, fraction], axis=1)
    return np.stack([left, right], axis=1), weights.astype(np.float32)


def _area_taps(source_width: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Taps per output pixel for an exact area average: coverage of each input pixel."""
    scale = source_width / width
    starts = np.arange(width) * scale
    ends = starts + scale
    taps = math.ceil(scale) + 1
    candidates = np.floor(starts).astype(np.int64)[:, None] + np.arange(taps)[None, :]
    coverage = np.minimum(candidates + 1, ends[:, None]) - np.maximum(candidates, starts[:, None])
    coverage = np.clip(coverage, 0.0, None)
    coverage /= coverage.sum(axis=1, keepdims=True)
    indices = np.minimum(candidates, source_width - 1)  # overhanging taps carry weight 0
    return indices, coverage.astype(np.float32)


def _check_pixel_aspect(pixel_aspect: float) -> None:
    if not math.isfinite(pixel_aspect) or pixel_aspect <= 0:
        raise ValueError(f"pixel aspect ratio must be a positive number, got {pixel_aspect}")
