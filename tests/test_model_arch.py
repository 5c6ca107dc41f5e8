"""Key names, shapes and counts against the reference tables, built on the meta device."""

from __future__ import annotations

import pytest
import torch

import sapiens
from sapiens.arch import backbone_spec, upstream_kv_schedule
from sapiens.rope import upstream_periods

# reference §1.1: (keys, parameters of the module definitions)
BACKBONES = {
    "0.1b": (210, 113_993_488),
    "0.4b": (414, 395_450_384),
    "0.8b": (550, 814_283_540),
    "1b": (686, 1_455_474_192),
    "5b": (958, 5_066_902_995),
    "1b-4k": (744, 1_606_588_944),
}


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("arch", list(BACKBONES))
def test_backbone_key_count_and_parameters(arch: str) -> None:
    model = sapiens.build_model(arch, device="meta")
    sd = model.state_dict()
    keys, params = BACKBONES[arch]
    assert len(sd) == keys
    assert sum(v.numel() for v in sd.values()) == params
    assert sd["rope_embed.periods"].dtype == torch.bfloat16


def test_0_1b_exact_state_dict() -> None:
    shapes = _shapes(sapiens.build_model("0.1b", device="meta"))
    assert list(shapes)[:5] == [
        "cls_token",
        "storage_tokens",
        "patch_embed.projection.weight",
        "patch_embed.projection.bias",
        "rope_embed.periods",
    ]
    assert list(shapes)[-1] == "ln1.weight"
    assert shapes["cls_token"] == (1, 1, 768)
    assert shapes["storage_tokens"] == (1, 8, 768)
    assert shapes["patch_embed.projection.weight"] == (768, 3, 16, 16)
    assert shapes["rope_embed.periods"] == (16,)
    block = {k[len("blocks.3.") :]: v for k, v in shapes.items() if k.startswith("blocks.3.")}
    assert block == {
        "ln1.weight": (768,),
        "attn.wq.weight": (768, 768),
        "attn.wq.bias": (768,),
        "attn.wk.weight": (768, 768),
        "attn.wk.bias": (768,),
        "attn.wv.weight": (768, 768),
        "attn.wv.bias": (768,),
        "attn.q_norm.weight": (64,),
        "attn.k_norm.weight": (64,),
        "attn.proj.weight": (768, 768),
        "attn.proj.bias": (768,),
        "attn.gamma.weight": (768,),
        "ln2.weight": (768,),
        "ffn.w12.weight": (6144, 768),
        "ffn.w12.bias": (6144,),
        "ffn.w3.weight": (768, 3072),
        "ffn.w3.bias": (768,),
    }


def test_0_4b_gqa_blocks() -> None:
    shapes = _shapes(sapiens.build_model("0.4b", device="meta"))
    for i in range(24):
        kv = 512 if 8 <= i <= 15 else 1024
        assert shapes[f"blocks.{i}.attn.wk.weight"] == (kv, 1024), i
        assert shapes[f"blocks.{i}.attn.wv.bias"] == (kv,), i
    assert shapes["blocks.0.ffn.w12.weight"] == (8192, 1024)
    assert shapes["blocks.0.ffn.w3.weight"] == (1024, 4096)


@pytest.mark.parametrize(
    ("arch", "gqa"),
    [("0.1b", []), ("0.8b", range(8, 24)), ("1b", range(8, 32)), ("5b", range(8, 48))],
)
def test_gqa_schedule(arch: str, gqa) -> None:
    spec = backbone_spec(arch)
    assert [i for i, kv in enumerate(spec.kv_heads) if kv != spec.num_heads] == list(gqa)
    assert all(kv == spec.num_heads // 2 for i, kv in enumerate(spec.kv_heads) if i in gqa)
    assert upstream_kv_schedule(12, 12) == (12,) * 12


def test_4k_tokenizer_keys() -> None:
    shapes = _shapes(sapiens.build_model("1b", tokenizer=True, device="meta"))
    tok = {k: v for k, v in shapes.items() if k.startswith("tokenizer.")}
    assert tok["tokenizer.local_pos_embed"] == (1, 17, 1536)
    assert tok["tokenizer.w_cls"] == (1, 1, 1536)
    assert len([k for k in tok if k.startswith("tokenizer.blocks.")]) == 4 * 14
    assert tok["tokenizer.blocks.3.ffn.w12.weight"] == (12288, 1536)
    assert not any(("q_norm" in k or "gamma" in k) for k in tok)


# reference §2.2-2.6 for 0.4b: (key count, parameters)
HEADS_0_4B = {
    "normal": (18, 57.9e6),
    "albedo": (26, 57.9e6),
    "pointmap": (30, 133.2e6),
    "seg": (10, 11.2e6),
    "pose": (10, 30.2e6),
}


@pytest.mark.parametrize("task", list(HEADS_0_4B))
def test_head_keys_0_4b(task: str) -> None:
    model = sapiens.build_model("0.4b", task, device="meta")
    head = {k: v for k, v in model.state_dict().items() if k.startswith("decode_head.")}
    count, params = HEADS_0_4B[task]
    assert len(head) == count
    assert sum(v.numel() for v in head.values()) == pytest.approx(
        params, rel=5e-3
    )  # table rounds to 0.1 M
    assert all(k.startswith(("backbone.", "decode_head.")) for k in model.state_dict())


def test_head_shapes_match_reference() -> None:
    normal = _shapes(sapiens.build_model("0.4b", "normal", device="meta"))
    assert normal["decode_head.input_conv.0.weight"] == (1024, 1024, 3, 3)
    assert normal["decode_head.upsample_blocks.0.0.weight"] == (3072, 1024, 3, 3)
    assert normal["decode_head.upsample_blocks.3.0.weight"] == (512, 256, 3, 3)
    assert normal["decode_head.conv_layers.6.weight"] == (16, 32, 3, 3)
    assert normal["decode_head.conv_normal.weight"] == (3, 16, 1, 1)
    seg = _shapes(sapiens.build_model("0.4b", "seg", device="meta"))
    assert seg["decode_head.deconv_layers.9.weight"] == (128, 64, 4, 4)
    assert seg["decode_head.conv_seg.weight"] == (29, 64, 1, 1)
    assert "decode_head.deconv_layers.0.bias" not in seg
    pose1b = _shapes(sapiens.build_model("1b", "pose", device="meta"))
    assert pose1b["decode_head.deconv_layers.0.weight"] == (1536, 1536, 4, 4)
    assert pose1b["decode_head.conv_pose.weight"] == (308, 256, 1, 1)
    point = _shapes(sapiens.build_model("0.4b", "pointmap", device="meta"))
    assert point["decode_head.scale_final_layer.1.weight"] == (512, 6144)
    assert point["decode_head.scale_conv_layers.6.weight"] == (128, 512, 1, 1)
    albedo = _shapes(sapiens.build_model("5b", "albedo", device="meta"))
    assert albedo["decode_head.conv_albedo.weight"] == (3, 16, 1, 1)
    assert albedo["decode_head.upsample_blocks.0.2.norm.weight"] == (1536,)


@pytest.mark.parametrize(
    ("head_dim", "expected"),
    [
        (
            64,
            [
                1,
                1.3359375,
                1.78125,
                2.375,
                3.15625,
                4.21875,
                5.625,
                7.5,
                10,
                13.3125,
                17.75,
                23.75,
                31.625,
                42.25,
                56.25,
                75,
            ],
        ),
        (
            80,
            [
                1,
                1.2578125,
                1.5859375,
                2,
                2.515625,
                3.15625,
                4,
                5,
                6.3125,
                7.90625,
                10,
                12.625,
                15.9375,
                19.75,
                25,
                31.625,
                40,
                50.5,
                62.75,
                79,
            ],
        ),
        (
            76,
            [
                1,
                1.2734375,
                1.625,
                2.078125,
                2.640625,
                3.375,
                4.28125,
                5.46875,
                6.96875,
                8.875,
                11.3125,
                14.3125,
                18.375,
                23.25,
                30,
                37.75,
                48.75,
                61.5,
                79,
            ],
        ),
    ],
)
def test_rope_periods_bf16(head_dim: int, expected: list[float]) -> None:
    assert upstream_periods(head_dim).float().tolist() == expected


def test_unknown_arch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown Sapiens2 arch"):
        sapiens.build_model("2b")
