"""Small random-weight models for tests (every output they make is untrained)."""

from __future__ import annotations

import torch
from torch import nn

import sapiens

SMALL_HW = (256, 192)


def perturbed(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere, including norms and LayerScale (init 1e-4 would hide the
    attention branch and make comparisons blind to it)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gamma" in name or "norm" in name or name.endswith("ln1.weight") or "ln2" in name:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=gen))
    return model


def tiny(task: str | None = None, tokenizer: bool = False, seed: int = 0) -> nn.Module:
    model = sapiens.build_model("tiny", task, tokenizer=tokenizer, input_hw=SMALL_HW, seed=seed)
    return perturbed(model, seed)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ||a - b|| / ||b||. (Upstream rounds q and k to bf16 for RoPE, so any
    reordering of fp32 sums may flip one rounding: the max-abs error is bounded separately.)"""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
