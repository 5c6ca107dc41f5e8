"""Sapiens v1 (ECCV 2024): the size table and heads against the reference, `identify_v1` from
shapes alone, the patch-padding trap, loading and saving, numerics against a straightforward
implementation of upstream's maths, and the pose post-processing for 17/133/308 keypoints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import sapiens
from bench.reference_model_v1 import model_forward
from sapiens import v1_arch
from sapiens.errors import CheckpointError
from sapiens.keypoints import (
    COCO_FLIP_INDICES,
    COCO_KEYPOINT_NAMES,
    FLIP_INDICES,
    KEYPOINT_NAMES,
    WHOLEBODY_FLIP_INDICES,
    WHOLEBODY_KEYPOINT_NAMES,
    flip_indices_for,
    keypoint_names_for,
)
from sapiens.loading import verify_checkpoint
from sapiens.pose import estimate_pose, flip_back
from sapiens.preprocess import normalize
from sapiens.seg_classes import V1_SEG_CLASSES
from sapiens.v1_arch import identify_v1
from tests.model_helpers import SMALL_HW, rel_err, tiny_v1

TOL = 1e-3
SIZES = {  # reference §1: C, depth, heads, FFN, encoder params of a task model (billions)
    "sapiens_0.3b": (1024, 24, 16, 4096, 0.306),
    "sapiens_0.6b": (1280, 32, 16, 5120, 0.635),
    "sapiens_1b": (1536, 40, 24, 6144, 1.139),
    "sapiens_2b": (1920, 48, 32, 7680, 2.132),
}
TASKS = [(None, None), ("depth", None), ("normal", None), ("seg", None)]
TASKS += [("pose", 17), ("pose", 133), ("pose", 308)]


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _reference(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    spec = model.info.backbone
    return model_forward(
        model.state_dict(),
        x,
        num_heads=spec.num_heads,
        patch_padding=spec.patch_padding,
        pos_grid=spec.pos_grid,
    )


# ----------------------------------------------------------------------------- identify


@pytest.mark.parametrize("arch", list(SIZES))
@pytest.mark.parametrize(("task", "kpts"), TASKS)
def test_identify_v1_released_sizes_and_tasks(arch: str, task: str | None, kpts) -> None:
    model = sapiens.build_model(arch, task, num_keypoints=kpts, device="meta")
    shapes = _shapes(model)
    info = identify_v1(shapes)
    c, depth, heads, ffn, params = SIZES[arch]
    assert (info.family, info.arch, info.task) == ("sapiens1", arch, task)
    assert info.backbone == model.info.backbone and info.head == model.info.head
    spec = info.backbone
    assert (spec.embed_dim, spec.depth, spec.num_heads, spec.ffn_hidden) == (c, depth, heads, ffn)
    assert spec.patch_padding == (2 if task in ("pose", "normal") else 0)
    prefix = "" if task is None else "backbone."
    encoder = sum(np.prod(s) for k, s in shapes.items() if k.startswith(prefix))
    if task is None:
        assert shapes["pos_embed"] == (1, 4097, c) and shapes["cls_token"] == (1, 1, c)
        assert info.input_hw == (1024, 1024) and spec.pos_grid == (64, 64)
    else:
        assert shapes["backbone.pos_embed"] == (1, 3072, c)
        assert info.input_hw == (1024, 768) and spec.pos_grid == (64, 48)
        assert round(encoder / 1e9, 3) == params
    assert shapes[f"{prefix}layers.{depth - 1}.attn.qkv.weight"] == (3 * c, c)
    assert shapes[f"{prefix}layers.0.ffn.layers.0.0.weight"] == (ffn, c)
    assert shapes[f"{prefix}layers.0.ffn.layers.1.weight"] == (c, ffn)
    assert shapes[f"{prefix}ln1.bias"] == (c,)
    if task == "pose":
        assert info.head.out_channels == kpts
        assert v1_arch.keypoint_set(info) == {17: "coco", 133: "coco_wholebody"}.get(
            kpts, "goliath"
        )


def test_head_shapes_and_outputs_of_the_reference() -> None:
    """Reference §2 table: keys, shapes and raw output sizes at 1024x768 (meta device)."""
    x = torch.empty(1, 3, 1024, 768, device="meta")
    seg = sapiens.build_model("sapiens_1b", "seg", device="meta")
    s = _shapes(seg)
    assert s["decode_head.deconv_layers.0.weight"] == (1536, 768, 4, 4)
    assert s["decode_head.deconv_layers.6.weight"] == (768, 768, 4, 4)
    assert "decode_head.deconv_layers.0.bias" not in s
    assert s["decode_head.conv_layers.6.weight"] == (768, 768, 1, 1)
    assert s["decode_head.conv_seg.weight"] == (28, 768, 1, 1)
    assert seg(x).shape == (1, 28, 512, 384)
    depth = sapiens.build_model("sapiens_0.3b", task="depth", device="meta")
    d = _shapes(depth)
    assert d["decode_head.deconv_layers.9.weight"] == (384, 384, 4, 4)
    assert d["decode_head.conv_layers.3.weight"] == (384, 384, 1, 1)
    assert d["decode_head.conv_seg.weight"] == (1, 384, 1, 1)
    assert depth(x).shape == (1, 1, 1024, 768)
    assert sapiens.build_model("sapiens_0.6b", "normal", device="meta")(x).shape == (
        1,
        3,
        512,
        384,
    )
    pose = sapiens.build_model("sapiens_2b", "pose", num_keypoints=133, device="meta")
    p = _shapes(pose)
    assert sorted(k for k in p if not k.startswith("backbone.")) == [
        "head.conv_layers.0.bias",
        "head.conv_layers.0.weight",
        "head.conv_layers.3.bias",
        "head.conv_layers.3.weight",
        "head.deconv_layers.0.weight",
        "head.deconv_layers.3.weight",
        "head.final_layer.bias",
        "head.final_layer.weight",
    ]
    assert pose(x).shape == (1, 133, 256, 192)
    pretrain = sapiens.build_model("sapiens_0.3b", device="meta")
    assert pretrain(torch.empty(1, 3, 1024, 1024, device="meta")).shape == (1, 1024, 64, 64)
    assert pretrain(x).shape == (1, 1024, 64, 48)


def test_v1_arch_imports_no_torch() -> None:
    code = "import sys, sapiens.v1_arch; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_seg_classes_in_reference_order() -> None:
    assert len(V1_SEG_CLASSES) == 28 == v1_arch.SEG_NUM_CLASSES
    assert V1_SEG_CLASSES[:3] == ("Background", "Apparel", "Face_Neck")
    assert V1_SEG_CLASSES[12] == "Lower_Clothing" and V1_SEG_CLASSES[21] == "Torso"
    assert V1_SEG_CLASSES[22:] == (
        "Upper_Clothing",
        "Lower_Lip",
        "Upper_Lip",
        "Lower_Teeth",
        "Upper_Teeth",
        "Tongue",
    )


def _task_shapes(task: str = "seg") -> dict[str, tuple[int, ...]]:
    return _shapes(sapiens.build_model("sapiens_0.3b", task, device="meta"))


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda s: s.update({"backbone.layers.0.ffn.layers.0.0.weight": (999, 1024)}), "FFN 999"),
        (lambda s: [s.pop(k) for k in list(s) if ".layers.23." in k], "depth 23"),
        (lambda s: [s.pop(k) for k in list(s) if ".layers.5." in k], "blocks [5] are missing"),
        (lambda s: s.update({"decode_head.conv_seg.weight": (5, 768, 1, 1)}), "conv_seg has 5"),
        (lambda s: s.update({"backbone.pos_embed": (1, 3000, 1024)}), "3000 positions"),
        (lambda s: s.update({"extra.weight": (3,)}), "other keys: ['extra.weight']"),
        (lambda s: s.pop("backbone.patch_embed.projection.weight"), "missing patch_embed"),
        (lambda s: s.update({"backbone.layers.0.attn.qkv.weight": (1024, 1024)}), "fused"),
    ],
)
def test_identify_errors_name_what_did_not_match(edit, expected: str) -> None:
    shapes = _task_shapes()
    edit(shapes)
    with pytest.raises(CheckpointError) as err:
        identify_v1(shapes, path="model.safetensors")
    assert expected in str(err.value) and "model.safetensors" in str(err.value)


def test_identify_errors_for_other_layouts() -> None:
    pose = _task_shapes("pose")
    pose["head.final_layer.weight"] = (20, 768, 1, 1)
    with pytest.raises(CheckpointError, match="final_layer has 20 heatmaps"):
        identify_v1(pose)
    both = {**_task_shapes("seg"), "head.final_layer.weight": (17, 768, 1, 1)}
    with pytest.raises(CheckpointError, match=r"head prefixes: \['decode_head.', 'head.'\]"):
        identify_v1(both)
    v2 = _shapes(sapiens.build_model("0.1b", device="meta"))
    with pytest.raises(CheckpointError, match="a Sapiens2 checkpoint"):
        identify_v1(v2)
    wrapped = {f"state_dict.{k}": v for k, v in _task_shapes().items()}
    with pytest.raises(CheckpointError, match=r"every key starts with 'state_dict\.'"):
        identify_v1(wrapped)


def test_unknown_width_needs_num_heads() -> None:
    info = tiny_v1("seg").info
    shapes = _shapes(tiny_v1("seg"))
    with pytest.raises(CheckpointError, match="needs num_heads"):
        identify_v1(shapes)
    found = identify_v1(shapes, num_heads=4)
    assert found.backbone == info.backbone and found.head == info.head
    with pytest.raises(CheckpointError, match="num_heads 5 does not divide"):
        identify_v1(shapes, num_heads=5)


# ----------------------------------------------------------------------------- files


def _save_plain(model: torch.nn.Module, path: Path, **metadata: str) -> Path:
    """As a converter without our metadata would write it: tensors (plus num_heads, which a
    tiny width needs)."""
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"num_heads": "4", **metadata})
    return path


@pytest.mark.parametrize(("task", "padding"), [("pose", 2), ("normal", 2), ("seg", 0)])
@pytest.mark.parametrize("seed", [0])
def test_patch_padding_trap(task: str, padding: int, seed: int, tmp_path: Path) -> None:
    """Pose and normal files load with the patch conv padded by 2, seg and depth with 0; the
    shapes are the same either way and the outputs are not."""
    model = tiny_v1(task, seed=seed)
    assert model.info.backbone.patch_padding == padding
    loaded = sapiens.load_model(_save_plain(model, tmp_path / f"{task}.safetensors"))
    conv = loaded.backbone.patch_embed.projection
    assert loaded.info.backbone.patch_padding == padding and conv.padding == (padding, padding)
    other = tiny_v1(task, seed=seed, patch_padding=2 - padding)
    assert _shapes(other) == _shapes(model)
    x = torch.randn(1, 3, *SMALL_HW)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
        assert rel_err(other(x), model(x)) > 1e-2


def test_depth_file_loads_unpadded(tmp_path: Path) -> None:
    loaded = sapiens.load_model(_save_plain(tiny_v1("depth"), tmp_path / "d.safetensors"))
    assert loaded.backbone.patch_embed.projection.padding == (0, 0)
    assert loaded.info.task == "depth" and loaded.info.trained  # no `untrained` metadata


def test_metadata_padding_overrides_the_rule(tmp_path: Path) -> None:
    model = tiny_v1("seg", patch_padding=2)
    path = _save_plain(model, tmp_path / "seg.safetensors", patch_padding="2")
    assert sapiens.load_model(path).info.backbone.patch_padding == 2


@pytest.mark.parametrize(
    ("task", "kw"),
    [
        (None, {}),
        ("depth", {}),
        ("normal", {}),
        ("seg", {}),
        ("pose", {}),
        ("pose", {"num_keypoints": 133}),
    ],
)
def test_save_and_load_round_trip(task: str | None, kw: dict, tmp_path: Path) -> None:
    model = tiny_v1(task, seed=5, **kw)
    path = tmp_path / "v1.safetensors"
    sha = sapiens.save_model(model, path)
    loaded = sapiens.load_model(path)
    info = loaded.info
    assert (info.family, info.task, info.sha256) == ("sapiens1", task, sha)
    assert info.backbone == model.info.backbone and info.head == model.info.head
    assert info.input_hw == model.info.input_hw and info.trained is False
    assert info.metadata["format"] == "sapiens1" and info.metadata["num_heads"] == "4"
    assert list(loaded.state_dict()) == list(model.state_dict())
    assert verify_checkpoint(path).backbone == model.info.backbone
    x = torch.randn(2, 3, *model.info.input_hw)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
        y = torch.randn(1, 3, 320, 128)  # any multiple of 16
        assert torch.equal(loaded(y), model(y))


def test_unknown_architecture_file_is_refused_naming_it(tmp_path: Path) -> None:
    model = tiny_v1("seg")
    path = tmp_path / "odd.safetensors"
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path))  # no num_heads: width 64 is no released size
    with pytest.raises(CheckpointError, match="match no v1 size") as err:
        sapiens.load_model(path)
    assert str(path) in str(err.value)
    state["decode_head.conv_seg.weight"] = torch.zeros(7, 8, 1, 1)
    state["decode_head.conv_seg.bias"] = torch.zeros(7)
    save_file(state, str(path), metadata={"num_heads": "4"})
    with pytest.raises(CheckpointError, match="conv_seg has 7 outputs"):
        sapiens.load_model(path)


def test_mismatched_tensor_is_listed(tmp_path: Path) -> None:
    """Shapes that identify a model but do not fit it (a head conv of the wrong width)."""
    model = tiny_v1("depth")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["decode_head.conv_layers.0.weight"] = torch.zeros(8, 9, 1, 1)
    path = tmp_path / "bad.safetensors"
    save_file(state, str(path), metadata={"num_heads": "4"})
    with pytest.raises(CheckpointError, match=r"conv_layers\.0\.weight"):
        sapiens.load_model(path)


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("task", [None, "depth", "normal", "seg", "pose"])
@pytest.mark.parametrize("padding", [0, 2])
@pytest.mark.parametrize("native", [True, False])
def test_matches_reference_maths(task: str | None, padding: int, native: bool) -> None:
    model = tiny_v1(task, seed=7, patch_padding=padding)
    hw = model.info.input_hw if native else (320, 128)  # non-native: the pos-embed resize
    x = torch.randn(2, 3, *hw, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, ref = model(x), _reference(model, x)
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) < TOL


def test_position_embedding_resize_is_bicubic_from_stored_grid() -> None:
    """Bicubic, align_corners=False, from the stored 16x12 grid; the other usual choices
    would be far outside the tolerance."""
    model = tiny_v1("seg", seed=8)
    bb = model.backbone
    grid = bb.pos_embed.detach().reshape(1, 16, 12, 64).permute(0, 3, 1, 2)

    def resized(**kw) -> torch.Tensor:
        out = F.interpolate(grid, size=(20, 16), **kw)
        return out.flatten(2).transpose(1, 2)

    with torch.no_grad():
        ours = bb.pos_embed_for((20, 16))
        assert torch.equal(bb.pos_embed_for((16, 12)), bb.pos_embed)
    assert rel_err(ours, resized(mode="bicubic", align_corners=False)) < 1e-6
    assert rel_err(ours, resized(mode="bicubic", align_corners=True)) > 10 * TOL
    assert rel_err(ours, resized(mode="bilinear", align_corners=False)) > 10 * TOL


def test_resize_cache_follows_weight_changes() -> None:
    model = tiny_v1(None, seed=9)
    x = torch.randn(1, 3, 192, 320)
    with torch.no_grad():
        first = model(x)
        assert torch.equal(model(x), first)  # cached
        model.pos_embed.mul_(2.0)  # in place: bumps the version
        assert rel_err(model(x), _reference(model, x)) < TOL
        model.load_state_dict(tiny_v1(None, seed=10).state_dict())
        assert rel_err(model(x), _reference(model, x)) < TOL


def test_pretrain_cls_token_attends_and_is_dropped() -> None:
    model = tiny_v1(None, seed=11)
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        before = model(x)
        model.cls_token.add_(torch.randn(model.cls_token.shape))
        after = model(x)
    assert before.shape == (1, 64, 16, 16)
    assert rel_err(after, before) > 1e-6  # one token among 257: a small but real change


def test_bf16_stays_close_to_fp32() -> None:
    model = tiny_v1("normal", seed=12)
    x = torch.randn(1, 3, *SMALL_HW)
    with torch.no_grad():
        ref = model(x)
        low = model.to(torch.bfloat16)(x.to(torch.bfloat16)).float()
    assert F.cosine_similarity(low.flatten(), ref.flatten(), dim=0) > 0.99


# ----------------------------------------------------------------------------- pose


# Upstream `pose/configs/_base_/datasets/coco_wholebody.py`, each point's `swap`, as indices.
_WHOLEBODY_SWAP = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15, 20, 21, 22, 17, 18]
_WHOLEBODY_SWAP += [19, *range(39, 22, -1), *range(49, 39, -1), 50, 51, 52, 53]
_WHOLEBODY_SWAP += [58, 57, 56, 55, 54, 68, 67, 66, 65, 70, 69, 62, 61, 60, 59, 64, 63]
_WHOLEBODY_SWAP += [*range(77, 70, -1), *range(82, 77, -1), *range(87, 82, -1), 90, 89, 88]
_WHOLEBODY_SWAP += [*range(112, 133), *range(91, 112)]


def test_keypoint_sets() -> None:
    assert len(COCO_KEYPOINT_NAMES) == 17 and len(WHOLEBODY_KEYPOINT_NAMES) == 133
    assert COCO_FLIP_INDICES == (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15)
    assert list(WHOLEBODY_FLIP_INDICES) == _WHOLEBODY_SWAP
    assert WHOLEBODY_KEYPOINT_NAMES[:17] == COCO_KEYPOINT_NAMES
    assert WHOLEBODY_KEYPOINT_NAMES[91] == "left_hand_root"
    assert WHOLEBODY_KEYPOINT_NAMES[132] == "right_pinky_finger4"
    assert keypoint_names_for(308) == KEYPOINT_NAMES and flip_indices_for(308) == FLIP_INDICES
    assert keypoint_names_for(133) == WHOLEBODY_KEYPOINT_NAMES
    for flips in (COCO_FLIP_INDICES, WHOLEBODY_FLIP_INDICES):
        assert all(flips[f] == i for i, f in enumerate(flips))  # an involution
    with pytest.raises(ValueError, match="no keypoint set has 20"):
        flip_indices_for(20)


def test_flip_back_with_coco_indices() -> None:
    maps = torch.zeros(1, 17, 8, 6)
    maps[0, 1, 2, 0] = 1.0  # left_eye, first column of the mirrored crop
    restored = flip_back(maps, COCO_FLIP_INDICES)
    assert restored[0, 2, 2, 5] == 1.0 and restored.sum() == 1.0  # right_eye, last column


@pytest.mark.parametrize("kpts", [17, 133])
def test_v1_pose_model_through_udp_decoding_and_flip_test(kpts: int) -> None:
    model = tiny_v1("pose", seed=13, num_keypoints=kpts)
    image = torch.rand(3, 300, 200, generator=torch.Generator().manual_seed(4))
    calls: list[int] = []

    def model_fn(crops: torch.Tensor) -> torch.Tensor:
        calls.append(crops.shape[0])
        return model(normalize(crops))

    result = estimate_pose(
        model_fn,
        image,
        [[20, 30, 150, 280], [0, 0, 199, 299]],
        input_hw=SMALL_HW,
        num_keypoints=kpts,
    )
    assert result.keypoints.shape == (2, kpts, 2) and result.scores.shape == (2, kpts)
    assert calls == [4]  # two people and their mirrored crops in one call
    assert np.isfinite(result.keypoints).all()
    with pytest.raises(ValueError, match=f"expected \\(2, {308}, h, w\\)"):
        estimate_pose(model_fn, image, [[20, 30, 150, 280]], input_hw=SMALL_HW)


def test_predictor_runs_v1_models() -> None:
    """Dense v1 passes are stretched (not letterboxed) and brought back to the input size;
    pose takes the model's keypoint count."""
    predictor = sapiens.Predictor(
        {
            "seg": tiny_v1("seg", seed=14),
            "normal": tiny_v1("normal", seed=15),
            "pose": tiny_v1("pose", seed=16, num_keypoints=133),
            "depth": tiny_v1("depth", seed=17),
        },
        batch_size=2,
    )
    images = np.random.default_rng(0).random((3, 100, 90, 3), dtype=np.float32)
    out = predictor.predict(images, ["seg", "normal", "depth"])
    assert out["depth"].shape == (3, 100, 90, 1) and np.isfinite(out["depth"]).all()
    raw = predictor.models["depth"](
        sapiens.preprocess.normalize(
            sapiens.preprocess.stretch(torch.from_numpy(images[:1]).permute(0, 3, 1, 2), SMALL_HW)[
                0
            ]
        )
    )
    back = sapiens.preprocess.restore(
        raw, sapiens.preprocess.stretch(torch.zeros(1, 3, 100, 90), SMALL_HW)[1]
    )
    np.testing.assert_allclose(
        out["depth"][0, ..., 0], back[0, 0].detach().numpy(), rtol=1e-5, atol=1e-6
    )
    assert out["seg"].shape == (3, 100, 90, 28)
    np.testing.assert_allclose(out["seg"].sum(-1), 1.0, rtol=1e-5)
    assert out["normal"].shape == (3, 100, 90, 3)
    np.testing.assert_allclose(np.linalg.norm(out["normal"], axis=-1), 1.0, rtol=1e-4)
    pose = predictor.predict_pose(images[0], [[10, 10, 80, 90]])
    assert pose.keypoints.shape == (1, 133, 2)
