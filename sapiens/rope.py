"""Rotary position embedding with upstream's numerics, and tables cached per grid size.

Upstream computes coordinates, angles, sin and cos in bf16 and rotates q and k in bf16
(reference §1.6, checklist 13). We reproduce those numerics exactly, so features match the
released models, but unlike upstream: the tables are built once per (grid, device) and
cached; the 9 prefix tokens get cos=1, sin=0 (bit-identical to skipping them after the bf16
cast) instead of slice + cat copies; the rotation runs on the K/V heads before any expansion;
and the periods stay bf16 whatever the model is cast to, so `.float()` no longer silently
changes the result.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .arch import NUM_PREFIX_TOKENS, ROPE_BASE

ROPE_DTYPE = torch.bfloat16


def upstream_periods(head_dim: int, base: float = ROPE_BASE, device=None) -> Tensor:
    """periods[i] = base^(2i/(hd/2)) for i < hd/4, computed in bf16 as upstream does."""
    idx = torch.arange(head_dim // 4, device=device, dtype=ROPE_DTYPE)
    return base ** (2 * idx / (head_dim // 2))


def rope_angles(periods: Tensor, grid_h: int, grid_w: int) -> Tensor:
    """Angles (HW, hd) for a grid, in bf16, with upstream's op order ("separate" coords)."""
    dd = {"device": periods.device, "dtype": ROPE_DTYPE}
    periods = periods.to(ROPE_DTYPE)
    coords_h = torch.arange(0.5, grid_h, **dd) / grid_h
    coords_w = torch.arange(0.5, grid_w, **dd) / grid_w
    coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1)
    coords = 2.0 * coords.flatten(0, 1) - 1.0  # (HW, 2) in [-1, 1]
    angles = 2 * math.pi * coords[:, :, None] / periods[None, None, :]  # (HW, 2, hd/4)
    return angles.flatten(1, 2).tile(2)  # (HW, hd): [h-angles | w-angles] twice


class RopeEmbedding(nn.Module):
    """Holds `periods` (a persistent bf16 buffer, as in upstream checkpoints) and the tables."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.register_buffer("periods", upstream_periods(head_dim), persistent=True)
        self._tables: dict[tuple, tuple[Tensor, Tensor]] = {}

    def _apply(self, fn, recurse: bool = True):  # type: ignore[override]
        # Keep the stored periods in bf16 under .float()/.half()/.to(dtype): upstream's result
        # depends on that cast, ours does not.
        super()._apply(fn, recurse)
        periods = self._buffers["periods"]
        if periods is not None and periods.dtype != ROPE_DTYPE and not periods.is_meta:
            self._buffers["periods"] = periods.to(ROPE_DTYPE)
        self._tables.clear()
        return self

    def tables(
        self, grid_h: int, grid_w: int, prefix: int = NUM_PREFIX_TOKENS
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin), each (prefix + HW, 1, hd) bf16; the prefix rows are cos=1, sin=0."""
        key = (grid_h, grid_w, prefix, self.periods.device)
        cached = self._tables.get(key)
        if cached is not None:
            return cached
        with torch.no_grad():
            angles = rope_angles(self.periods, grid_h, grid_w)
            cos, sin = torch.cos(angles), torch.sin(angles)
            dd = {"device": angles.device, "dtype": ROPE_DTYPE}
            cos = torch.cat([torch.ones(prefix, self.head_dim, **dd), cos])[:, None, :]
            sin = torch.cat([torch.zeros(prefix, self.head_dim, **dd), sin])[:, None, :]
        self._tables[key] = (cos.contiguous(), sin.contiguous())
        return self._tables[key]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE on (B, N, heads, hd) in bf16, cast back to x's dtype (upstream maths)."""
    dtype = x.dtype
    xb = x.to(ROPE_DTYPE)
    x1, x2 = xb.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return ((xb * cos) + (rotated * sin)).to(dtype)
