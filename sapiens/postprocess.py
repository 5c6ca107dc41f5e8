"""Turning raw head outputs into passes (reference §2.8), batched and on the device."""

from __future__ import annotations

import torch
from torch import Tensor

from .arch import CANONICAL_FOCAL


def unit_normals(raw: Tensor) -> Tensor:
    """L2-normalise (B, 3, H, W) per pixel, the norm clamped at 1e-8 as upstream.

    The squares are added component by component: ``Tensor.norm`` over the channel axis
    runs far slower on the CPU (docs/design/pixel-blocks.md)."""
    x, y, z = raw[:, 0], raw[:, 1], raw[:, 2]
    length = x * x
    length += y * y
    length += z * z
    return raw / length.sqrt_().clamp_min_(1e-8)[:, None]


def metric_points(points: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """Canonical pointmap / scale -> metric XYZ, per sample (upstream's tool only handled
    batch 1). Also returns the focal length implied in the model's canvas: 768 / s."""
    s = scale.reshape(-1).float()
    metric = points.float() / s.view(-1, 1, 1, 1)
    return metric, CANONICAL_FOCAL / s


def seg_probabilities(logits: Tensor) -> Tensor:
    return torch.softmax(logits.float(), dim=1)


def albedo_rgb(raw: Tensor) -> Tensor:
    return raw.float().clamp(0.0, 1.0)


def split_matte(out: Tensor) -> tuple[Tensor, Tensor | None]:
    """Matting output (already sigmoid): the last channel is alpha, the first 3 (if present)
    the foreground colour."""
    alpha = out[:, -1:].float()
    fg = out[:, :3].float() if out.shape[1] >= 4 else None
    return alpha, fg
