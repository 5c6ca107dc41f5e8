"""A straightforward implementation of upstream's inference maths, straight from a state dict.

This is the yardstick, not the product: tests check the fast modules against it (1e-4
relative in fp32) and `bench/model.py` times it as "the upstream way". It deliberately keeps
upstream's structure: K/V expanded with repeat_interleave, RoPE tables rebuilt on every call,
the prefix sliced off and concatenated back, the tokenizer as a Python loop over chunks of
1024 windows, and each head written out layer by layer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

NUM_PREFIX = 9
EPS = 1e-6


def _rms(x: Tensor, w: Tensor) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def _rope_tables(periods: Tensor, h: int, w: int) -> tuple[Tensor, Tensor]:
    dt = periods.dtype
    dd = {"device": periods.device, "dtype": dt}
    ch = torch.arange(0.5, h, **dd) / h
    cw = torch.arange(0.5, w, **dd) / w
    coords = torch.stack(torch.meshgrid(ch, cw, indexing="ij"), dim=-1).flatten(0, 1)
    coords = 2.0 * coords - 1.0
    angles = 2 * math.pi * coords[:, :, None] / periods[None, None, :]
    angles = angles.flatten(1, 2).tile(2)
    return torch.sin(angles), torch.cos(angles)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _apply_rope(q: Tensor, k: Tensor, sin: Tensor, cos: Tensor) -> tuple[Tensor, Tensor]:
    qd, kd = q.dtype, k.dtype
    q, k = q.to(sin.dtype), k.to(sin.dtype)
    p = q.shape[-2] - sin.shape[-2]
    q = torch.cat([q[:, :, :p], q[:, :, p:] * cos + _rotate_half(q[:, :, p:]) * sin], dim=-2)
    k = torch.cat([k[:, :, :p], k[:, :, p:] * cos + _rotate_half(k[:, :, p:]) * sin], dim=-2)
    return q.to(qd), k.to(kd)


def _attention(sd: Mapping[str, Tensor], pre: str, x: Tensor, head_dim: int, rope=None) -> Tensor:
    b, n, c = x.shape
    hd = head_dim
    heads = c // hd
    kv = sd[f"{pre}wk.weight"].shape[0] // hd
    q = F.linear(x, sd[f"{pre}wq.weight"], sd[f"{pre}wq.bias"]).view(b, n, heads, hd)
    k = F.linear(x, sd[f"{pre}wk.weight"], sd[f"{pre}wk.bias"]).view(b, n, kv, hd)
    v = F.linear(x, sd[f"{pre}wv.weight"], sd[f"{pre}wv.bias"]).view(b, n, kv, hd)
    q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
    if f"{pre}q_norm.weight" in sd:
        q = _rms(q, sd[f"{pre}q_norm.weight"])
        k = _rms(k, sd[f"{pre}k_norm.weight"])
    if kv != heads:
        k = k.repeat_interleave(heads // kv, dim=1)
        v = v.repeat_interleave(heads // kv, dim=1)
    if rope is not None:
        q, k = _apply_rope(q, k, *rope)
    out = F.scaled_dot_product_attention(q, k, v)
    out = out.permute(0, 2, 1, 3).reshape(b, n, c)
    out = F.linear(out, sd[f"{pre}proj.weight"], sd[f"{pre}proj.bias"])
    if f"{pre}gamma.weight" in sd:
        out = out * sd[f"{pre}gamma.weight"]
    return out


def _block(sd: Mapping[str, Tensor], pre: str, x: Tensor, head_dim: int, rope=None) -> Tensor:
    x = x + _attention(sd, f"{pre}attn.", _rms(x, sd[f"{pre}ln1.weight"]), head_dim, rope)
    h = F.linear(
        _rms(x, sd[f"{pre}ln2.weight"]), sd[f"{pre}ffn.w12.weight"], sd[f"{pre}ffn.w12.bias"]
    )
    a, g = h.chunk(2, dim=-1)
    return x + F.linear(F.silu(a) * g, sd[f"{pre}ffn.w3.weight"], sd[f"{pre}ffn.w3.bias"])


def _count(sd: Mapping[str, Tensor], pattern: str) -> int:
    rx = re.compile(pattern)
    return len({m.group(1) for k in sd if (m := rx.match(k))})


def backbone_forward(sd: Mapping[str, Tensor], x: Tensor, chunk_size: int = 1024) -> Tensor:
    """Feature map (B, C, H/16, W/16) from un-prefixed backbone weights, upstream's way."""
    b = x.shape[0]
    # Tokenizer blocks have no q_norm; they use the main encoder's head count.
    head_dim = sd["blocks.0.attn.q_norm.weight"].shape[0]
    x = F.conv2d(
        x, sd["patch_embed.projection.weight"], sd["patch_embed.projection.bias"], stride=16
    )
    h, w = x.shape[-2:]
    c = x.shape[1]
    x = x.flatten(2).transpose(1, 2)
    n_tok = _count(sd, r"tokenizer\.blocks\.(\d+)\.")
    if n_tok:
        ws = 4
        ph, pw = h // ws, w // ws
        win = x.view(b, ph, ws, pw, ws, c).permute(0, 1, 3, 2, 4, 5).contiguous()
        win = win.view(b * ph * pw, ws * ws, c)
        out = win.new_empty(win.shape[0], c)
        for i in range(0, win.shape[0], chunk_size):
            chunk = win[i : i + chunk_size]
            t = torch.cat([sd["tokenizer.w_cls"].expand(chunk.shape[0], -1, -1), chunk], dim=1)
            t = t + sd["tokenizer.local_pos_embed"]
            for j in range(n_tok):
                t = _block(sd, f"tokenizer.blocks.{j}.", t, head_dim)
            out[i : i + chunk.shape[0]] = t[:, 0]
        x = out.view(b, ph * pw, c)
        h, w = ph, pw
    x = torch.cat(
        [sd["cls_token"].expand(b, -1, -1), sd["storage_tokens"].expand(b, -1, -1), x], dim=1
    )
    rope = _rope_tables(sd["rope_embed.periods"], h, w)
    for i in range(_count(sd, r"blocks\.(\d+)\.")):
        x = _block(sd, f"blocks.{i}.", x, head_dim, rope)
    x = _rms(x, sd["ln1.weight"])
    return x[:, NUM_PREFIX:].transpose(1, 2).reshape(b, c, h, w)


def _in(x: Tensor) -> Tensor:
    return F.instance_norm(x, eps=1e-5)


def _rms2d(x: Tensor, w: Tensor) -> Tensor:
    return _rms(x.permute(0, 2, 3, 1), w).permute(0, 3, 1, 2)


def _dense_head(sd: Mapping[str, Tensor], x: Tensor, out_key: str) -> Tensor:
    rms = "input_conv.1.norm.weight" in sd

    def norm(t: Tensor, key: str) -> Tensor:
        return _rms2d(t, sd[key]) if rms else _in(t)

    x = F.silu(
        norm(
            F.conv2d(x, sd["input_conv.0.weight"], sd["input_conv.0.bias"], padding=1),
            "input_conv.1.norm.weight",
        )
    )
    for i in range(_count(sd, r"upsample_blocks\.(\d+)\.")):
        x = F.conv2d(
            x, sd[f"upsample_blocks.{i}.0.weight"], sd[f"upsample_blocks.{i}.0.bias"], padding=1
        )
        x = F.silu(norm(F.pixel_shuffle(x, 2), f"upsample_blocks.{i}.2.norm.weight"))
    for i in sorted(
        int(m.group(1)) for k in sd if (m := re.match(r"conv_layers\.(\d+)\.weight$", k))
    ):
        wgt = sd[f"conv_layers.{i}.weight"]
        x = F.conv2d(x, wgt, sd[f"conv_layers.{i}.bias"], padding=wgt.shape[-1] // 2)
        x = F.silu(norm(x, f"conv_layers.{i + 1}.norm.weight"))
    return F.conv2d(x, sd[f"{out_key}.weight"], sd[f"{out_key}.bias"])


def _deconv_head(sd: Mapping[str, Tensor], x: Tensor, out_key: str) -> Tensor:
    for i in sorted(
        int(m.group(1)) for k in sd if (m := re.match(r"deconv_layers\.(\d+)\.weight$", k))
    ):
        x = F.silu(_in(F.conv_transpose2d(x, sd[f"deconv_layers.{i}.weight"], stride=2, padding=1)))
    for i in sorted(
        int(m.group(1)) for k in sd if (m := re.match(r"conv_layers\.(\d+)\.weight$", k))
    ):
        x = F.silu(_in(F.conv2d(x, sd[f"conv_layers.{i}.weight"], sd[f"conv_layers.{i}.bias"])))
    return F.conv2d(x, sd[f"{out_key}.weight"], sd[f"{out_key}.bias"])


def head_forward(sd: Mapping[str, Tensor], feats: Tensor):
    """Raw head output from un-prefixed head weights (tuple for pointmap)."""
    if "conv_seg.weight" in sd:
        return _deconv_head(sd, feats, "conv_seg")
    if "conv_pose.weight" in sd:
        return _deconv_head(sd, feats, "conv_pose")
    for key in ("conv_normal", "conv_albedo", "conv_matting"):
        if f"{key}.weight" in sd:
            out = _dense_head(sd, feats, key)
            return out.sigmoid() if key == "conv_matting" else out
    out = _dense_head(sd, feats, "conv_pointmap")
    s = feats
    for i in (0, 3, 6):
        s = F.silu(
            _in(
                F.conv2d(
                    s,
                    sd[f"scale_conv_layers.{i}.weight"],
                    sd[f"scale_conv_layers.{i}.bias"],
                    stride=2,
                )
            )
        )
    s = s.flatten(1)
    for i in (1, 3, 5):
        s = F.linear(s, sd[f"scale_final_layer.{i}.weight"], sd[f"scale_final_layer.{i}.bias"])
        if i != 5:
            s = F.silu(s)
    return out, s


def model_forward(sd: Mapping[str, Tensor], x: Tensor):
    """Forward a whole task or pretrain state dict (prefixed or not), upstream's way."""
    if any(k.startswith("backbone.") for k in sd):
        bb = {k[9:]: v for k, v in sd.items() if k.startswith("backbone.")}
        head = {k[12:]: v for k, v in sd.items() if k.startswith("decode_head.")}
        return head_forward(head, backbone_forward(bb, x))
    return backbone_forward(sd, x)
