"""The Sapiens v1 backbone: mmpretrain's vanilla ViT as the v1 configs build it.

Module and parameter names follow upstream (`pos_embed`, `patch_embed.projection`,
`layers.N.{ln1,attn.qkv,attn.proj,ln2,ffn.layers.0.0,ffn.layers.1}`, `ln1`), so a converted
file's keys load with `strict=True`. The maths is upstream's: patch conv (padded by 2 px for
pose and normal), absolute position embedding resized bicubically from its stored grid to
the input grid, pre-norm blocks of fused-qkv MHA and a GELU MLP, final LayerNorm, patch tokens
out as a feature map. The pretrain backbone (MAE) also carries `cls_token`, which attends
with the patches and is dropped from the output, as upstream's feature extractor does.

Speed-ups: attention through `scaled_dot_product_attention` (flash / memory-efficient kernels
where the device has them), and the resized position embedding cached per grid while no
gradient is wanted (upstream interpolates it on every call at a non-native size).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .arch import BackboneSpec
from .backbone import PatchEmbed, check_input
from .v1_arch import NORM_EPS, PATCH_SIZE


class V1Attention(nn.Module):
    """Multi-head self-attention with one fused `qkv` projection and `proj` (upstream ATT)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # scale hd^-0.5
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class V1FFN(nn.Module):
    """Linear C -> hidden, exact GELU, Linear hidden -> C; keys `layers.0.0.*`, `layers.1.*`
    as mmcv's FFN nests them (its dropouts are 0 and hold no weights)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Sequential(nn.Linear(dim, hidden), nn.GELU()), nn.Linear(hidden, dim)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class V1Block(nn.Module):
    """Pre-norm block: x + attn(ln1(x)), then x + ffn(ln2(x)). No LayerScale."""

    def __init__(self, dim: int, num_heads: int, hidden: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = V1Attention(dim, num_heads)
        self.ln2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.ffn = V1FFN(dim, hidden)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


def resize_pos_embed(
    pos_embed: Tensor, src: tuple[int, int], dst: tuple[int, int], extra: int
) -> Tensor:
    """Upstream's resize: the grid part bicubic (align_corners=False) in fp32, cast back;
    the `extra` leading (cls) slots unchanged; the tensor itself when the grids match."""
    if src == dst:
        return pos_embed
    c = pos_embed.shape[-1]
    grid = pos_embed[:, extra:].reshape(1, src[0], src[1], c).permute(0, 3, 1, 2)
    grid = F.interpolate(grid.float(), size=dst, mode="bicubic", align_corners=False)
    grid = grid.flatten(2).transpose(1, 2).to(pos_embed.dtype)
    return torch.cat([pos_embed[:, :extra], grid], dim=1)


class SapiensV1Backbone(nn.Module):
    """Input: a normalized batch (B, 3, H, W), H and W multiples of 16.
    Output: the final-norm feature map (B, C, H/16, W/16)."""

    def __init__(self, spec: BackboneSpec) -> None:
        super().__init__()
        if spec.family != "sapiens1":
            raise ValueError(f"{spec.name} is a {spec.family} backbone, not Sapiens v1")
        spec.validate()
        self.spec = spec
        c = spec.embed_dim
        gh, gw = spec.pos_grid
        self.extra_tokens = 1 if spec.cls_token else 0
        if spec.cls_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, c))
        else:
            self.cls_token = None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.extra_tokens + gh * gw, c))
        self.patch_embed = PatchEmbed(c, padding=spec.patch_padding)
        self.layers = nn.ModuleList(
            V1Block(c, spec.num_heads, spec.ffn_hidden) for _ in range(spec.depth)
        )
        self.ln1 = nn.LayerNorm(c, eps=NORM_EPS)
        self._pos_cache: dict[tuple, Tensor] = {}

    @property
    def embed_dim(self) -> int:
        return self.spec.embed_dim

    def _apply(self, fn, recurse: bool = True):  # type: ignore[override]
        self._pos_cache.clear()  # a cast or move makes cached embeddings stale
        return super()._apply(fn, recurse)

    def pos_embed_for(self, grid: tuple[int, int]) -> Tensor:
        """The position embedding (cls slot included) resized to `grid`."""
        stored = self.spec.pos_grid
        if grid == stored or torch.is_grad_enabled():
            return resize_pos_embed(self.pos_embed, stored, grid, self.extra_tokens)
        p = self.pos_embed
        try:
            version = p._version
        except RuntimeError:  # weights made under inference_mode track no version: no cache
            return resize_pos_embed(p, stored, grid, self.extra_tokens)
        key = (grid, p.dtype, p.device, p.data_ptr(), version)
        cached = self._pos_cache.get(key)
        if cached is None:
            self._pos_cache.clear()
            cached = resize_pos_embed(p.detach(), stored, grid, self.extra_tokens)
            self._pos_cache[key] = cached
        return cached

    def forward(self, x: Tensor) -> Tensor:
        check_input(x, PATCH_SIZE)
        b = x.shape[0]
        x = self.patch_embed.projection(x)
        grid = (x.shape[-2], x.shape[-1])
        x = x.flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.to(x.dtype).expand(b, -1, -1), x], dim=1)
        x = x + self.pos_embed_for(grid)
        for layer in self.layers:
            x = layer(x)
        x = self.ln1(x[:, self.extra_tokens :])
        return x.transpose(1, 2).reshape(b, self.spec.embed_dim, *grid)
