"""The Sapiens v1 family (ECCV 2024): size table, heads per task, the patch-padding rule, and
`identify_v1`, which tells a v1 model from its tensor names and shapes alone.

Facts from `docs/sapiens1-reference.md` (upstream `facebookresearch/sapiens`, the revision
docs/design/upstream-sources.md names). No torch here: a checkpoint converter imports this
module to label the files it writes.

v1 is a vanilla ViT (absolute position embedding, fused-qkv MHA, GELU MLP, LayerNorm) with
deconv heads. Heads cannot be counted from tensor shapes (the qkv projection is fused), so
they come from the size table, or from a file's `num_heads` metadata for other widths.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace

from .arch import DEPTH, NORMAL, PATCH_SIZE, POSE, SEG, BackboneSpec, HeadSpec
from .errors import CheckpointError, refuse_wrapped_keys
from .info import ModelInfo
from .keypoints import KEYPOINT_NAMES as GOLIATH_KEYPOINT_NAMES
from .safetensors_format import count_blocks
from .seg_classes import V1_SEG_CLASSES

FAMILY = "sapiens1"
NATIVE_INPUT_HW = (1024, 768)  # task models (H, W)
PRETRAIN_INPUT_HW = (1024, 1024)  # MAE pretraining
NORM_EPS = 1e-6  # LayerNorm (mmpretrain VisionTransformer)
TASKS = (DEPTH, NORMAL, SEG, POSE)
# Pose and normal configs set `patch_cfg=dict(padding=2)`; seg, depth and the pretrain
# backbone do not. Shapes are identical either way: this table is the only source.
PATCH_PADDING = {POSE: 2, NORMAL: 2, SEG: 0, DEPTH: 0, None: 0}
# Where each head lives in a task file (mmseg's `decode_head.`, mmpose's `head.`) and the
# name of its last 1x1 conv.
HEAD_PREFIX = {
    DEPTH: "decode_head.",
    NORMAL: "decode_head.",
    SEG: "decode_head.",
    POSE: "head.",
}
OUTPUT_LAYER = {DEPTH: "conv_seg", NORMAL: "conv_seg", SEG: "conv_seg", POSE: "final_layer"}
# Keypoint sets of the released pose models, by heatmap count.
KEYPOINT_SET_NAMES = {17: "coco", 133: "coco_wholebody", 308: "goliath"}
SEG_NUM_CLASSES = len(V1_SEG_CLASSES)  # 28: 27 body parts + background
CUSTOM_NAME = "sapiens1_custom"  # any width that is no released size


def _row(c: int, depth: int, heads: int) -> tuple[int, int, int, int]:
    return c, depth, heads, 4 * c


# name: (embed dim, depth, heads, FFN hidden); patch 16, LayerNorm eps 1e-6, qkv bias.
V1_SIZES: dict[str, tuple[int, int, int, int]] = {
    "sapiens_0.3b": _row(1024, 24, 16),
    "sapiens_0.6b": _row(1280, 32, 16),
    "sapiens_1b": _row(1536, 40, 24),
    "sapiens_2b": _row(1920, 48, 32),
}
V1_ARCH_NAMES = tuple(V1_SIZES)
# Not a released size: the small v1 the platform builds with random (untrained) weights when
# no checkpoint covers a v1 pass (the demo, the tests), as `sapiens2_tiny` is for Sapiens2.
# Its heads have the released number of deconvolutions per task (so its outputs come at the
# released resolutions) but few channels.
V1_TINY = "sapiens1_tiny"
V1_TINY_DIMS = _row(96, 3, 4)
V1_TINY_HEADS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    SEG: ((32, 16, 16), (16,)),
    DEPTH: ((32, 16, 16, 16), (16,)),
    NORMAL: ((32, 16, 16), (16, 16)),
    POSE: ((32, 16), (16,)),
}

# task: (deconv channels, conv channels (1x1), output channels) of the released heads.
V1_HEADS: dict[str, tuple[tuple[int, ...], tuple[int, ...], int]] = {
    SEG: ((768, 768, 768), (768, 768, 768), SEG_NUM_CLASSES),
    DEPTH: ((384, 384, 384, 384), (384, 384), 1),
    NORMAL: ((768, 768, 768), (768, 768, 768), 3),
    POSE: ((768, 768), (768, 768), len(GOLIATH_KEYPOINT_NAMES)),
}


def is_v1_name(arch: str) -> bool:
    """Whether an arch name means v1 ('sapiens_1b', 'sapiens1_1b'), not Sapiens2."""
    return arch.strip().lower().startswith(("sapiens_", "sapiens1_"))


def canonical_v1(arch: str) -> str:
    name = arch.strip().lower().replace("sapiens1_", "sapiens_", 1)
    if not name.startswith("sapiens_"):
        name = f"sapiens_{name}"
    if name == "sapiens_tiny":
        return V1_TINY
    if name not in V1_SIZES:
        raise ValueError(f"unknown Sapiens v1 arch {arch!r}; known: {', '.join(V1_SIZES)}")
    return name


def _dims(name: str) -> tuple[int, int, int, int]:
    return V1_TINY_DIMS if name == V1_TINY else V1_SIZES[name]


def pos_grid_for(input_hw: tuple[int, int]) -> tuple[int, int]:
    return input_hw[0] // PATCH_SIZE, input_hw[1] // PATCH_SIZE


def v1_backbone_spec(
    arch: str,
    task: str | None,
    *,
    input_hw: tuple[int, int] | None = None,
    patch_padding: int | None = None,
) -> BackboneSpec:
    """The backbone of a released v1 model. Task models store a 64x48 position grid; the
    pretrain backbone a 64x64 grid with a cls slot (and `cls_token`), as MAE saved it."""
    name = canonical_v1(arch)
    c, depth, heads, ffn = _dims(name)
    if task is not None and task not in TASKS:
        raise ValueError(f"unknown Sapiens v1 task {task!r}; known: {', '.join(TASKS)}")
    hw = input_hw or (NATIVE_INPUT_HW if task else PRETRAIN_INPUT_HW)
    return _v1_spec(
        name, c, depth, heads, ffn, pos_grid_for(hw), task is None,
        patch_padding=PATCH_PADDING[task] if patch_padding is None else patch_padding,
    )  # fmt: skip


def _v1_spec(
    name: str, c: int, depth: int, heads: int, ffn: int, pos_grid: tuple[int, int],
    cls_token: bool, patch_padding: int = 0,
) -> BackboneSpec:  # fmt: skip
    """A v1 backbone (the same heads in every block), validated."""
    spec = BackboneSpec(
        name, c, depth, heads, (heads,) * depth, ffn, family=FAMILY,
        patch_padding=patch_padding, pos_grid=pos_grid, cls_token=cls_token,
    )  # fmt: skip
    spec.validate()
    return spec


def v1_head_spec(
    task: str,
    in_channels: int,
    *,
    num_keypoints: int | None = None,
    deconv: tuple[int, ...] | None = None,
    conv: tuple[int, ...] | None = None,
    out_channels: int | None = None,
    conv_kernel: int = 1,
) -> HeadSpec:
    """A v1 head: the released stack for `task`, or the given channel lists (tests, files)."""
    if task not in V1_HEADS:
        raise ValueError(f"unknown Sapiens v1 task {task!r}; known: {', '.join(TASKS)}")
    d, c, out = V1_HEADS[task]
    if task == POSE and num_keypoints is not None:
        if num_keypoints not in KEYPOINT_SET_NAMES:
            raise ValueError(f"no v1 pose model has {num_keypoints} keypoints (17, 133 or 308)")
        out = num_keypoints
    return HeadSpec(
        task,
        in_channels,
        out if out_channels is None else out_channels,
        conv_channels=c if conv is None else conv,
        conv_kernel=conv_kernel,
        deconv_channels=d if deconv is None else deconv,
        family=FAMILY,
    )


def v1_info(
    arch: str,
    task: str | None = None,
    *,
    num_keypoints: int | None = None,
    input_hw: tuple[int, int] | None = None,
) -> ModelInfo:
    """The description `make_model` builds a released v1 model from."""
    spec = v1_backbone_spec(arch, task, input_hw=input_hw)
    head = None
    if task is not None:
        deconv, conv = V1_TINY_HEADS[task] if spec.name == V1_TINY else (None, None)
        head = v1_head_spec(
            task, spec.embed_dim, num_keypoints=num_keypoints, deconv=deconv, conv=conv
        )
    hw = input_hw or (NATIVE_INPUT_HW if task else PRETRAIN_INPUT_HW)
    return ModelInfo(spec.name, task, spec, head, input_hw=hw)


def keypoint_set(info: ModelInfo) -> str | None:
    """'coco', 'coco_wholebody' or 'goliath' for a v1 pose model, else None."""
    if info.task != POSE or info.head is None:
        return None
    return KEYPOINT_SET_NAMES.get(info.head.out_channels)


# ----------------------------------------------------------------------------- identify

Shapes = Mapping[str, tuple[int, ...]]


def identify_v1(
    shapes: Shapes,
    *,
    path: str = "<tensors>",
    num_heads: int | None = None,
    input_hw: tuple[int, int] | None = None,
    patch_padding: int | None = None,
) -> ModelInfo:
    """The v1 model these tensors describe (family 'sapiens1', size, task or None for a pretrain
    backbone, keypoint/class count in `head.out_channels`), from names and shapes only.

    Layouts: a pretrain backbone with bare keys (`pos_embed`, `cls_token`, `layers.N.*`), or a
    task model with `backbone.*` and `decode_head.*` (seg, depth, normal) or `head.*` (pose).
    The keyword arguments are what a file's metadata may add: `num_heads` for widths that are
    no released size, the input size the position grid was made for, the patch padding.
    Raises CheckpointError (naming `path`) saying what did not match.
    """
    shapes = {k: tuple(v) for k, v in shapes.items()}
    kind, bb, head_shapes = _v1_layout(path, shapes)
    try:
        spec = _v1_backbone(bb, num_heads, input_hw)
    except ValueError as exc:
        raise CheckpointError(path, f"Sapiens v1 backbone: {exc}") from None
    task: str | None = None
    head: HeadSpec | None = None
    if kind != "pretrain":
        try:
            head = _v1_head(head_shapes, kind, spec.embed_dim)
        except ValueError as exc:
            prefix = HEAD_PREFIX[POSE if kind == POSE else SEG]
            raise CheckpointError(path, f"Sapiens v1 {prefix}*: {exc}") from None
        task = head.task
    padding = PATCH_PADDING[task] if patch_padding is None else patch_padding
    spec = replace(spec, patch_padding=padding)
    hw = (spec.pos_grid[0] * PATCH_SIZE, spec.pos_grid[1] * PATCH_SIZE)
    return ModelInfo(spec.name, task, spec, head, input_hw=hw)


def _v1_layout(path: str, shapes: dict[str, tuple[int, ...]]) -> tuple[str, Shapes, Shapes]:
    """('pretrain' | 'dense' | 'pose', backbone shapes, head shapes)."""
    keys = list(shapes)
    if any(k.startswith("backbone.") for k in keys):
        heads = {p for p in ("decode_head.", "head.") if any(k.startswith(p) for k in keys)}
        other = [k for k in keys if not k.startswith(("backbone.", "decode_head.", "head."))]
        if other or len(heads) != 1:
            found = sorted(heads) or "none"
            raise CheckpointError(
                path,
                "not a Sapiens v1 task file: expected backbone.* with exactly one of "
                f"decode_head.* (seg, depth, normal) or head.* (pose); head prefixes: {found}"
                + (f"; other keys: {other[:8]}" if other else ""),
            )
        prefix = heads.pop()
        kind = POSE if prefix == "head." else "dense"
        return kind, _strip(shapes, "backbone."), _strip(shapes, prefix)
    if "pos_embed" in shapes and "patch_embed.projection.weight" in shapes:
        return "pretrain", shapes, {}
    refuse_wrapped_keys(
        path,
        keys,
        "keep only the state dict, so keys read backbone.* / decode_head.* / head.* "
        "(or bare pretrain keys)",
    )
    hint = ""
    if "rope_embed.periods" in shapes or "storage_tokens" in shapes:
        hint = " (it has RoPE periods / register tokens: a Sapiens2 checkpoint?)"
    raise CheckpointError(
        path,
        f"not a Sapiens v1 checkpoint{hint}: no pos_embed and patch_embed.projection.weight; "
        f"keys e.g. {sorted(keys)[:6]}",
    )


def _strip(shapes: Shapes, prefix: str) -> dict[str, tuple[int, ...]]:
    return {k[len(prefix) :]: v for k, v in shapes.items() if k.startswith(prefix)}


def _need(shapes: Shapes, key: str, ndim: int) -> tuple[int, ...]:
    shape = shapes.get(key)
    if shape is None:
        raise ValueError(f"missing {key}")
    if len(shape) != ndim:
        raise ValueError(f"{key} has shape {shape}, expected {ndim} dimensions")
    return shape


def _v1_backbone(
    bb: Shapes, num_heads: int | None, input_hw: tuple[int, int] | None
) -> BackboneSpec:
    c, cin, kh, kw = _need(bb, "patch_embed.projection.weight", 4)
    if (cin, kh, kw) != (3, PATCH_SIZE, PATCH_SIZE):
        raise ValueError(f"patch_embed.projection.weight {(c, cin, kh, kw)} is no 16x16 RGB patch")
    _, tokens, pc = _need(bb, "pos_embed", 3)
    if pc != c:
        raise ValueError(f"pos_embed width {pc} differs from the patch embedding's {c}")
    depth = count_blocks(bb, r"layers\.(\d+)\.")
    if depth == 0:
        raise ValueError("no layers.N.* transformer blocks")
    qkv = _need(bb, "layers.0.attn.qkv.weight", 2)
    if qkv != (3 * c, c):
        raise ValueError(f"layers.0.attn.qkv.weight {qkv} is not a fused (3C, C) for C = {c}")
    ffn = _need(bb, "layers.0.ffn.layers.0.0.weight", 2)[0]
    name, heads = _size_name(c, depth, ffn, num_heads)
    cls = "cls_token" in bb
    grid = _pos_grid(tokens - 1 if cls else tokens, square=cls, input_hw=input_hw)
    return _v1_spec(name, c, depth, heads, ffn, grid, cls)


def _size_name(c: int, depth: int, ffn: int, num_heads: int | None) -> tuple[str, int]:
    for name, (sc, sd, sh, sf) in {**V1_SIZES, V1_TINY: V1_TINY_DIMS}.items():
        if (sc, sd, sf) == (c, depth, ffn) and num_heads in (None, sh):
            return name, sh
    if num_heads is not None:
        if num_heads <= 0 or c % num_heads:
            raise ValueError(f"num_heads {num_heads} does not divide the width {c}")
        return CUSTOM_NAME, num_heads
    known = "; ".join(f"{n}: {sc}/{sd}/{sf}" for n, (sc, sd, _, sf) in V1_SIZES.items())
    raise ValueError(
        f"width {c}, depth {depth}, FFN {ffn} match no v1 size (width/depth/FFN {known}); "
        "heads cannot be read off a fused qkv, so a custom size needs num_heads metadata"
    )


def _pos_grid(tokens: int, *, square: bool, input_hw: tuple[int, int] | None) -> tuple[int, int]:
    """The stored position grid: the given input size's, else square (pretrain, with a cls
    slot) or 4:3 portrait (the 1024x768 task configs), whichever the token count fits."""
    if input_hw is not None:
        grid = pos_grid_for(input_hw)
        if grid[0] * grid[1] != tokens:
            raise ValueError(f"pos_embed has {tokens} positions, input {input_hw} needs {grid}")
        return grid
    side = math.isqrt(tokens)
    if square and side * side == tokens:
        return side, side
    gh = math.isqrt(tokens * 4 // 3)
    if gh > 0 and gh * 3 % 4 == 0 and gh * (gh * 3 // 4) == tokens:
        return gh, gh * 3 // 4
    if side * side == tokens:
        return side, side
    raise ValueError(f"pos_embed has {tokens} positions: neither a 4:3 nor a square grid")


def _indexed(shapes: Shapes, prefix: str) -> list[tuple[int, ...]]:
    rx = re.compile(re.escape(prefix) + r"(\d+)\.weight$")
    found = sorted((int(m.group(1)), s) for k, s in shapes.items() if (m := rx.match(k)))
    return [s for _, s in found]


def _v1_head(hs: Shapes, kind: str, in_channels: int) -> HeadSpec:
    """Head task and channel lists. Seg, depth and normal share one head class and differ
    only in their output count (28, 1, 3); pose is told by its prefix and `final_layer`."""
    out_key = "final_layer.weight" if kind == POSE else "conv_seg.weight"
    out_shape = _need(hs, out_key, 4)
    deconvs = _indexed(hs, "deconv_layers.")
    convs = _indexed(hs, "conv_layers.")
    if not deconvs:
        raise ValueError(f"no deconv_layers.N.weight (keys: {sorted(hs)[:8]})")
    if deconvs[0][0] != in_channels:
        raise ValueError(
            f"deconv_layers.0 takes {deconvs[0][0]} channels, the backbone gives {in_channels}"
        )
    out = out_shape[0]
    if kind == POSE:
        if out not in KEYPOINT_SET_NAMES:
            raise ValueError(f"final_layer has {out} heatmaps; v1 pose has 17, 133 or 308")
        task = POSE
    else:
        by_out = {SEG_NUM_CLASSES: SEG, 1: DEPTH, 3: NORMAL}
        if out not in by_out:
            raise ValueError(
                f"conv_seg has {out} outputs; v1 has seg ({SEG_NUM_CLASSES}), depth (1), normal (3)"
            )
        task = by_out[out]
    return HeadSpec(
        task,
        in_channels,
        out,
        conv_channels=tuple(s[0] for s in convs),
        conv_kernel=convs[0][-1] if convs else 1,
        deconv_channels=tuple(s[1] for s in deconvs),
        family=FAMILY,
    )
