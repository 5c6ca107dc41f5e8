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


# ----------------------------------------------------------------------------- Sapiens v1
# A tiny v1 size for tests only (not a public size): width 64, 3 blocks of 4 heads, and heads
# with the released number of deconvs per task but few channels. Its name is what
# `identify_v1` calls any width that is no released size.
V1_TINY_HEADS = {
    "seg": ((16, 16, 8), (8,)),
    "depth": ((16, 16, 8, 8), (8,)),
    "normal": ((16, 16, 8), (8, 8)),
    "pose": ((16, 8), (8,)),
}


def tiny_v1_info(
    task: str | None = None,
    *,
    patch_padding: int | None = None,
    num_keypoints: int = 17,
    input_hw: tuple[int, int] | None = None,
) -> sapiens.ModelInfo:
    from sapiens import v1_arch

    hw = input_hw or (SMALL_HW if task else (256, 256))
    padding = v1_arch.PATCH_PADDING[task] if patch_padding is None else patch_padding
    spec = sapiens.BackboneSpec(
        "sapiens1_custom",
        64,
        3,
        4,
        (4, 4, 4),
        256,
        family="sapiens1",
        patch_padding=padding,
        pos_grid=(hw[0] // 16, hw[1] // 16),
        cls_token=task is None,
    )
    head = None
    if task is not None:
        deconv, conv = V1_TINY_HEADS[task]
        out = num_keypoints if task == "pose" else None
        head = v1_arch.v1_head_spec(task, 64, deconv=deconv, conv=conv, out_channels=out)
    return sapiens.ModelInfo(spec.name, task, spec, head, input_hw=hw)


def tiny_v1(task: str | None = None, seed: int = 0, **kw) -> nn.Module:
    """A tiny random v1 model with every weight perturbed: LayerNorm scales and shifts,
    biases, and a position embedding as large as the patch features, so that a wrong
    resize or a dropped bias shows."""
    from sapiens.model import make_model

    model = make_model(tiny_v1_info(task, **kw), torch.device("cpu"), seed).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith(("ln1.weight", "ln2.weight")):
                p.copy_(1.0 + 0.5 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif name.endswith(("pos_embed", "cls_token")):
                p.copy_(noise)
    return model
