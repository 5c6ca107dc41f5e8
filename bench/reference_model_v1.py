"""A straightforward implementation of Sapiens v1's inference maths, straight from a state dict.

The yardstick for `sapiens/v1_backbone.py` and the v1 heads (tests/test_sapiens1_models.py),
written the way upstream's mmpretrain VisionTransformer and mmseg/mmpose heads compute, with
nothing cached or fused: the patch conv, the cls token concatenated (pretrain), the position
embedding resized on every call, attention as an explicit softmax(q k^T / sqrt(hd)) v, the
GELU MLP, the final LayerNorm over every token and only then the cls token dropped; each head
layer by layer. What a v1 state dict does not hold is passed in: the head count, the patch
padding and the grid the position embedding was stored for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-6


def _ln(x: Tensor, sd: Mapping[str, Tensor], pre: str) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), sd[f"{pre}weight"], sd[f"{pre}bias"], EPS)


def _linear(x: Tensor, sd: Mapping[str, Tensor], pre: str) -> Tensor:
    return F.linear(x, sd[f"{pre}weight"], sd[f"{pre}bias"])


def resized_pos_embed(
    pos: Tensor, stored: tuple[int, int], grid: tuple[int, int], extra: int
) -> Tensor:
    """Bicubic (align_corners=False, in fp32) from the stored grid to the input grid; the
    leading `extra` cls slots pass through."""
    if tuple(stored) == tuple(grid):
        return pos
    c = pos.shape[-1]
    head, body = pos[:, :extra], pos[:, extra:]
    body = body.reshape(1, stored[0], stored[1], c).permute(0, 3, 1, 2).float()
    body = F.interpolate(body, size=grid, mode="bicubic", align_corners=False)
    body = body.flatten(2).transpose(1, 2).to(pos.dtype)
    return torch.cat([head, body], dim=1)


def _attention(sd: Mapping[str, Tensor], pre: str, x: Tensor, heads: int) -> Tensor:
    b, n, c = x.shape
    hd = c // heads
    qkv = _linear(x, sd, f"{pre}qkv.").reshape(b, n, 3, heads, hd).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    weights = torch.softmax((q @ k.transpose(-2, -1)) * hd**-0.5, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(b, n, c)
    return _linear(out, sd, f"{pre}proj.")


def _block(sd: Mapping[str, Tensor], pre: str, x: Tensor, heads: int) -> Tensor:
    x = x + _attention(sd, f"{pre}attn.", _ln(x, sd, f"{pre}ln1."), heads)
    h = F.gelu(_linear(_ln(x, sd, f"{pre}ln2."), sd, f"{pre}ffn.layers.0.0."))
    return x + _linear(h, sd, f"{pre}ffn.layers.1.")


def _count(sd: Mapping[str, Tensor], pattern: str) -> int:
    rx = re.compile(pattern)
    return len({m.group(1) for k in sd if (m := rx.match(k))})


def backbone_forward(
    sd: Mapping[str, Tensor],
    x: Tensor,
    *,
    num_heads: int,
    patch_padding: int,
    pos_grid: tuple[int, int],
) -> Tensor:
    """Feature map (B, C, H/16, W/16) from un-prefixed v1 backbone weights."""
    b = x.shape[0]
    x = F.conv2d(
        x,
        sd["patch_embed.projection.weight"],
        sd["patch_embed.projection.bias"],
        stride=16,
        padding=patch_padding,
    )
    c, h, w = x.shape[1:]
    x = x.flatten(2).transpose(1, 2)
    extra = 0
    if "cls_token" in sd:
        x = torch.cat([sd["cls_token"].expand(b, -1, -1), x], dim=1)
        extra = 1
    x = x + resized_pos_embed(sd["pos_embed"], pos_grid, (h, w), extra)
    for i in range(_count(sd, r"layers\.(\d+)\.")):
        x = _block(sd, f"layers.{i}.", x, num_heads)
    x = _ln(x, sd, "ln1.")
    return x[:, extra:].reshape(b, h, w, c).permute(0, 3, 1, 2)


def _indices(sd: Mapping[str, Tensor], prefix: str) -> list[int]:
    rx = re.compile(re.escape(prefix) + r"(\d+)\.weight$")
    return sorted(int(m.group(1)) for k in sd if (m := rx.match(k)))


def head_forward(sd: Mapping[str, Tensor], feats: Tensor) -> Tensor:
    """Raw output of an un-prefixed v1 head: deconv (k4 s2 p1, no bias) -> InstanceNorm ->
    SiLU blocks, conv -> InstanceNorm -> SiLU blocks, then the output conv."""
    x = feats
    for i in _indices(sd, "deconv_layers."):
        x = F.conv_transpose2d(x, sd[f"deconv_layers.{i}.weight"], stride=2, padding=1)
        x = F.silu(F.instance_norm(x, eps=1e-5))
    for i in _indices(sd, "conv_layers."):
        wgt = sd[f"conv_layers.{i}.weight"]
        x = F.conv2d(x, wgt, sd[f"conv_layers.{i}.bias"], padding=(wgt.shape[-1] - 1) // 2)
        x = F.silu(F.instance_norm(x, eps=1e-5))
    out = "final_layer" if "final_layer.weight" in sd else "conv_seg"
    return F.conv2d(x, sd[f"{out}.weight"], sd[f"{out}.bias"])


def model_forward(
    sd: Mapping[str, Tensor],
    x: Tensor,
    *,
    num_heads: int,
    patch_padding: int,
    pos_grid: tuple[int, int],
) -> Tensor:
    """A whole v1 state dict (pretrain, or backbone.* with decode_head.* / head.*)."""
    kw = {"num_heads": num_heads, "patch_padding": patch_padding, "pos_grid": pos_grid}
    if not any(k.startswith("backbone.") for k in sd):
        return backbone_forward(sd, x, **kw)
    bb = {k[len("backbone.") :]: v for k, v in sd.items() if k.startswith("backbone.")}
    prefix = "head." if any(k.startswith("head.") for k in sd) else "decode_head."
    head = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
    return head_forward(head, backbone_forward(bb, x, **kw))
