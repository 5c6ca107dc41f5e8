"""The fast modules against a straightforward implementation of upstream's maths (fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.reference_model import backbone_forward, model_forward
from sapiens.backbone import Attention
from tests.model_helpers import SMALL_HW, max_err, rel_err, tiny

TOL = 1e-4


@pytest.mark.parametrize("task", [None, "normal", "albedo", "pointmap", "seg", "pose", "matting"])
def test_task_models_match_reference(task: str | None) -> None:
    model = tiny(task, seed=3)
    x = torch.randn(2, 3, *SMALL_HW, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(x)
        ref = model_forward(model.state_dict(), x)
    if task == "pointmap":
        assert rel_err(ours[0], ref[0]) < TOL
        assert rel_err(ours[1], ref[1]) < TOL
    else:
        assert ours.shape == ref.shape
        assert rel_err(ours, ref) < TOL


@pytest.mark.parametrize("task", [None, "normal", "seg"])
def test_tokenizer_variant_matches_reference(task: str | None) -> None:
    model = tiny(task, tokenizer=True, seed=4)
    x = torch.randn(1, 3, 512, 384, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = model(x)
        ref = model_forward(model.state_dict(), x)
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) < TOL
    assert max_err(ours, ref) < 1e-3


def test_tokenizer_reduces_grid_by_four() -> None:
    model = tiny(None, tokenizer=True)
    with torch.no_grad():
        feats = model(torch.randn(2, 3, 256, 192))
    assert feats.shape == (2, 64, 4, 3)


def test_tokenizer_output_independent_of_chunking() -> None:
    model = tiny(None, tokenizer=True, seed=5)
    x = torch.randn(2, 3, 256, 384, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = model(x)
        model.tokenizer.tokens_per_call = 17 * 5  # 5 windows per call, uneven last chunk
        chunked = model(x)
        ref = backbone_forward(model.state_dict(), x, chunk_size=7)
    # Equal but for the order of fp32 sums, which other batch sizes change and which can flip
    # the bf16 rounding of q and k before RoPE (upstream's numerics): measured up to 1.6e-4
    # (max) and 1.0e-4 (relative) on torch 2.11, 8.9e-5 on 2.13, over input seeds. A window
    # given to the wrong call would be off by the size of the features.
    assert rel_err(chunked, whole) < 1e-3
    assert max_err(chunked, whole) < 1e-3
    assert rel_err(chunked, ref) < TOL
    assert max_err(chunked, ref) < 1e-3


@pytest.mark.parametrize("kv", [1, 2, 4])
def test_grouped_query_attention_equals_explicit_kv_repetition(kv: int) -> None:
    torch.manual_seed(0)
    attn = Attention(64, 4, kv, qk_norm=True, layer_scale=True).eval()
    x = torch.randn(2, 9 + 24, 64)
    with torch.no_grad():
        ours = attn(x)
        b, n, _ = x.shape
        q = attn.q_norm(attn.wq(x).view(b, n, 4, 16)).transpose(1, 2)
        k = attn.k_norm(attn.wk(x).view(b, n, kv, 16)).transpose(1, 2)
        v = attn.wv(x).view(b, n, kv, 16).transpose(1, 2)
        k, v = k.repeat_interleave(4 // kv, dim=1), v.repeat_interleave(4 // kv, dim=1)
        explicit = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, 64)
        explicit = attn.gamma(attn.proj(explicit))
    assert rel_err(ours, explicit) < 1e-5


def test_fp32_cast_does_not_change_rope_numerics() -> None:
    """Upstream's result depends on how the model is cast; ours keeps bf16 RoPE."""
    model = tiny(None, seed=6)
    x = torch.randn(1, 3, *SMALL_HW)
    with torch.no_grad():
        before = model(x)
        model.float()
        assert model.rope_embed.periods.dtype == torch.bfloat16
        after = model(x)
    assert torch.equal(before, after)


def test_bf16_stays_close_to_fp32() -> None:
    model = tiny("normal", seed=7)
    x = torch.randn(1, 3, *SMALL_HW)
    with torch.no_grad():
        ref = model(x)
        low = model.to(torch.bfloat16)(x.to(torch.bfloat16)).float()
    cos = F.cosine_similarity(low.flatten(), ref.flatten(), dim=0)
    assert cos > 0.99
