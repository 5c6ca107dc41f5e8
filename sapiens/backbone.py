"""The Sapiens2 backbone (every size, and the 4K variant with its window tokenizer).

Module and parameter names follow upstream exactly, so `state_dict()` keys and shapes are
those of the released checkpoints (reference §1.9). The maths is upstream's; the speed-ups
are: grouped-query attention through SDPA's native `enable_gqa` (no K/V copies), RoPE tables
cached per grid and applied to the K/V heads only, the tokenizer's windows run as one batched
call (chunked only to bound memory) and, in its last block, only the per-window CLS query and
FFN are computed, since nothing else of that block is used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .arch import LAYER_SCALE_INIT, NORM_EPS, NUM_REGISTERS, PATCH_SIZE, WINDOW_SIZE, BackboneSpec
from .errors import InputError
from .rope import RopeEmbedding, apply_rope

# Tokens per tokenizer call: 65,536 tokens is one 4K frame's 3,072 windows x 17 in one call,
# while a batch of 4K frames is split so that activations stay within a few GiB.
TOKENIZER_TOKENS_PER_CALL = 65_536


class PatchEmbed(nn.Module):
    """16x16 patches by a strided conv. `padding` zero pixels per side (v1 pose and normal
    use 2) shift the patch grid by that much while keeping its size."""

    def __init__(self, embed_dim: int, in_channels: int = 3, padding: int = 0) -> None:
        super().__init__()
        self.projection = nn.Conv2d(
            in_channels, embed_dim, PATCH_SIZE, stride=PATCH_SIZE, padding=padding
        )


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float = LAYER_SCALE_INIT) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight


class Attention(nn.Module):
    """Multi-head or grouped-query attention with optional QK RMSNorm, RoPE and LayerScale."""

    def __init__(
        self, dim: int, num_heads: int, kv_heads: int, qk_norm: bool, layer_scale: bool
    ) -> None:
        super().__init__()
        self.num_heads, self.kv_heads = num_heads, kv_heads
        self.head_dim = dim // num_heads
        kv_dim = kv_heads * self.head_dim
        self.wq = nn.Linear(dim, dim)
        self.wk = nn.Linear(dim, kv_dim)
        self.wv = nn.Linear(dim, kv_dim)
        if qk_norm:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=NORM_EPS)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=NORM_EPS)
        else:
            self.q_norm = self.k_norm = None
        self.proj = nn.Linear(dim, dim)
        self.gamma = LayerScale(dim) if layer_scale else nn.Identity()

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        return self._attend(x, x, rope)

    def forward_first_query(self, x: Tensor) -> Tensor:
        """Attention output of token 0 only, (B, 1, C): keys and values still see every token."""
        return self._attend(x[:, :1], x, None)

    def _attend(self, xq: Tensor, xkv: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        b, nq, c = xq.shape
        nk = xkv.shape[1]
        q = self.wq(xq).view(b, nq, self.num_heads, self.head_dim)
        k = self.wk(xkv).view(b, nk, self.kv_heads, self.head_dim)
        v = self.wv(xkv).view(b, nk, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            enable_gqa=self.kv_heads != self.num_heads,
        )
        return self.gamma(self.proj(out.transpose(1, 2).reshape(b, nq, c)))


class SwiGLUFFN(nn.Module):
    """w12: C -> 2*hidden; SiLU(first half) * second half; w3: hidden -> C (hidden = 4C)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden)
        self.w3 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(a) * b)


class Block(nn.Module):
    """Pre-norm transformer block; the FFN residual is added here (upstream adds it inside)."""

    def __init__(self, dim: int, num_heads: int, kv_heads: int, hidden: int, *, main: bool) -> None:
        super().__init__()
        self.ln1 = nn.RMSNorm(dim, eps=NORM_EPS)
        self.attn = Attention(dim, num_heads, kv_heads, qk_norm=main, layer_scale=main)
        self.ln2 = nn.RMSNorm(dim, eps=NORM_EPS)
        self.ffn = SwiGLUFFN(dim, hidden)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        x = x + self.attn(self.ln1(x), rope)
        return x + self.ffn(self.ln2(x))

    def forward_first_token(self, x: Tensor) -> Tensor:
        """Token 0 of `forward(x)`, (B, C), computing only what that token depends on."""
        x0 = x[:, :1] + self.attn.forward_first_query(self.ln1(x))
        return (x0 + self.ffn(self.ln2(x0)))[:, 0]


class Tokenizer(nn.Module):
    """4K variant: each 4x4-patch window plus a learned CLS runs through plain blocks; the
    per-window CLS outputs form a grid 4x smaller per side (reference §1.8)."""

    def __init__(self, dim: int, num_heads: int, hidden: int, depth: int) -> None:
        super().__init__()
        ws2 = WINDOW_SIZE * WINDOW_SIZE
        self.local_pos_embed = nn.Parameter(torch.zeros(1, 1 + ws2, dim))
        self.blocks = nn.ModuleList(
            Block(dim, num_heads, num_heads, hidden, main=False) for _ in range(depth)
        )
        self.w_cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.tokens_per_call = TOKENIZER_TOKENS_PER_CALL

    def forward(self, x: Tensor, grid_h: int, grid_w: int) -> tuple[Tensor, int, int]:
        b, _, c = x.shape
        ws = WINDOW_SIZE
        ph, pw = grid_h // ws, grid_w // ws
        windows = (
            x.view(b, ph, ws, pw, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b * ph * pw, ws * ws, c)
        )
        per_call = max(1, self.tokens_per_call // (ws * ws + 1))
        outs = [self._run(windows[i : i + per_call]) for i in range(0, windows.shape[0], per_call)]
        return torch.cat(outs).view(b, ph * pw, c), ph, pw

    def _run(self, windows: Tensor) -> Tensor:
        cls = self.w_cls.expand(windows.shape[0], -1, -1)
        t = torch.cat([cls, windows], dim=1) + self.local_pos_embed
        for blk in self.blocks[:-1]:
            t = blk(t)
        return self.blocks[-1].forward_first_token(t)


class Sapiens2Backbone(nn.Module):
    """Input: a normalized batch (B, 3, H, W), H and W multiples of 16 (64 with the tokenizer).
    Output: the feature map (B, C, H/16, W/16) (H/64, W/64 with the tokenizer)."""

    def __init__(self, spec: BackboneSpec) -> None:
        super().__init__()
        spec.validate()
        self.spec = spec
        c = spec.embed_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c))
        self.storage_tokens = nn.Parameter(torch.zeros(1, NUM_REGISTERS, c))
        self.patch_embed = PatchEmbed(c)
        self.tokenizer = (
            Tokenizer(c, spec.num_heads, spec.ffn_hidden, spec.tokenizer_depth)
            if spec.has_tokenizer
            else None
        )
        self.rope_embed = RopeEmbedding(spec.head_dim)
        self.blocks = nn.ModuleList(
            Block(c, spec.num_heads, kv, spec.ffn_hidden, main=True) for kv in spec.kv_heads
        )
        self.ln1 = nn.RMSNorm(c, eps=NORM_EPS)

    @property
    def embed_dim(self) -> int:
        return self.spec.embed_dim

    def forward(self, x: Tensor) -> Tensor:
        check_input(x, self.spec.input_multiple)
        b = x.shape[0]
        x = self.patch_embed.projection(x)
        grid_h, grid_w = x.shape[-2:]
        x = x.flatten(2).transpose(1, 2)
        if self.tokenizer is not None:
            x, grid_h, grid_w = self.tokenizer(x, grid_h, grid_w)
        prefix = torch.cat([self.cls_token, self.storage_tokens], dim=1).expand(b, -1, -1)
        x = torch.cat([prefix.to(x.dtype), x], dim=1)
        rope = self.rope_embed.tables(grid_h, grid_w)
        for blk in self.blocks:
            x = blk(x, rope)
        x = self.ln1(x[:, prefix.shape[1] :])
        return x.transpose(1, 2).reshape(b, self.spec.embed_dim, grid_h, grid_w)


def check_input(x: Tensor, multiple: int) -> None:
    """Fail with a plain message instead of a crash deep inside torch or a silent crop."""
    if x.ndim != 4 or x.shape[1] != 3:
        raise InputError(f"expected a batch (B, 3, H, W), got shape {tuple(x.shape)}")
    h, w = x.shape[-2:]
    if h < multiple or w < multiple:
        raise InputError(f"input {h}x{w} is smaller than one {multiple}x{multiple} patch")
    if h % multiple or w % multiple:
        raise InputError(
            f"input {h}x{w} is not a multiple of {multiple} px; pad it (the predictor does) "
            "rather than let the patch embedding crop it"
        )
    if x.is_meta or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        # a CUDA graph being captured cannot read a value back (the check waits for the
        # device): whoever replays the graph checks what it copies into the graph's input
        return
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise InputError(f"input has {bad} NaN or Inf values; the network would spread them")
