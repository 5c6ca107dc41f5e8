"""Input preparation, as upstream's test pipelines do it (reference §3.1-3.2), in torch.

Plates arrive as float RGB in [0, 1] in the model's encoding (sRGB display, after the
colour conversion). Upstream reads 8-bit BGR with OpenCV; we keep the float precision and do
the RGB normalisation (x*255 - mean) / std with the same statistics. Resizes use torch
equivalents of upstream's OpenCV calls: INTER_LINEAR -> bilinear (align_corners=False, no
antialias, like OpenCV), INTER_CUBIC -> bicubic (both use a = -0.75) and INTER_AREA ->
area averaging (equal to OpenCV for integer factors, close otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

MEAN = (123.675, 116.28, 103.53)  # RGB, 0-255 scale
STD = (58.395, 57.12, 57.375)


def to_batch(images: np.ndarray | Tensor, device: torch.device | str = "cpu") -> Tensor:
    """(B, H, W, 3) or (H, W, 3) array/tensor of RGB in [0, 1] -> float32 (B, 3, H, W)."""
    t = torch.as_tensor(images)
    if t.ndim == 3:
        t = t[None]
    if t.ndim != 4 or t.shape[-1] != 3:
        raise ValueError(f"expected RGB images (B, H, W, 3), got shape {tuple(t.shape)}")
    return t.to(device=device, dtype=torch.float32).permute(0, 3, 1, 2)


def normalize(x01: Tensor) -> Tensor:
    """RGB in [0, 1] (B, 3, H, W) -> the network's input statistics."""
    mean = torch.tensor(MEAN, device=x01.device, dtype=x01.dtype).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x01.device, dtype=x01.dtype).view(1, 3, 1, 1)
    return (x01 * 255.0 - mean) / std


@dataclass(frozen=True)
class Geometry:
    """How an input of `in_hw` was placed into the model's `out_hw` canvas."""

    in_hw: tuple[int, int]
    resized_hw: tuple[int, int]
    pad: tuple[int, int, int, int]  # left, right, top, bottom
    out_hw: tuple[int, int]

    @property
    def scale_x(self) -> float:
        return self.resized_hw[1] / self.in_hw[1]

    def padded(self, bottom: int, right: int) -> Geometry:
        """The same placement with extra bottom/right padding (see `pad_to_multiple`)."""
        left, r, top, b = self.pad
        oh, ow = self.out_hw
        return Geometry(
            self.in_hw,
            self.resized_hw,
            (left, r + right, top, b + bottom),
            (oh + bottom, ow + right),
        )


def _resize(x: Tensor, hw: tuple[int, int], mode: str) -> Tensor:
    if tuple(x.shape[-2:]) == tuple(hw):
        return x
    if mode == "area":
        return F.interpolate(x, size=hw, mode="area")
    return F.interpolate(x, size=hw, mode=mode, align_corners=False)


def letterbox(x01: Tensor, out_hw: tuple[int, int]) -> tuple[Tensor, Geometry]:
    """Aspect-preserving resize (int() truncation, bilinear) into `out_hw`, centred zero pad
    (black in pixel space, before normalisation): normal, pointmap and albedo."""
    h, w = x01.shape[-2:]
    oh, ow = out_hw
    scale = min(ow / w, oh / h)
    nh, nw = max(1, int(h * scale)), max(1, int(w * scale))
    resized = _resize(x01, (nh, nw), "bilinear")
    left, top = (ow - nw) // 2, (oh - nh) // 2
    pad = (left, ow - nw - left, top, oh - nh - top)
    out = F.pad(resized, pad, value=0.0) if any(pad) else resized
    return out, Geometry((h, w), (nh, nw), pad, out_hw)


def stretch(x01: Tensor, out_hw: tuple[int, int]) -> tuple[Tensor, Geometry]:
    """Plain stretch (segmentation, matting): area when narrowing, bicubic otherwise, the
    choice made on width as upstream does."""
    h, w = x01.shape[-2:]
    mode = "area" if out_hw[1] < w else "bicubic"
    out = _resize(x01, out_hw, mode)
    return out, Geometry((h, w), out_hw, (0, 0, 0, 0), out_hw)


def restore(y: Tensor, geom: Geometry) -> Tensor:
    """Undo `letterbox`/`stretch` on a model output (B, C, H', W') at any multiple of the
    canvas size: crop the padding, resize bilinearly to the input size."""
    oh, ow = geom.out_hw
    fy, fx = y.shape[-2] / oh, y.shape[-1] / ow
    left, right, top, bottom = geom.pad
    if any(geom.pad):
        y = y[
            ...,
            round(top * fy) : y.shape[-2] - round(bottom * fy),
            round(left * fx) : y.shape[-1] - round(right * fx),
        ]
    return _resize(y, geom.in_hw, "bilinear")


def pad_to_multiple(x: Tensor, multiple: int) -> tuple[Tensor, tuple[int, int]]:
    """Zero-pad bottom/right to a multiple of `multiple` px; returns the (bottom, right) pad.
    Used instead of letting the patch embedding crop the remainder away."""
    h, w = x.shape[-2:]
    pb, pr = (-h) % multiple, (-w) % multiple
    if pb or pr:
        x = F.pad(x, (0, pr, 0, pb), value=0.0)
    return x, (pb, pr)
