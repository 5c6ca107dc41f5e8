"""The model a Sapiens2 checkpoint describes, read off its tensor shapes: there is no config.

Layouts (reference §1.9, §2.7): pretrain files hold backbone keys without a prefix; task
files hold `backbone.*` and `decode_head.*`. From the tensors we infer width, depth, heads
(from the q/k-norm size), K/V heads per block, the tokenizer and its depth, the head type and
its channel lists. No torch here: the flow process describes files from their header alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from . import arch as A
from .arch import ALBEDO, MATTING, NORMAL, POINTMAP, POSE, SEG
from .errors import CheckpointError, refuse_wrapped_keys
from .info import ModelInfo
from .safetensors_format import Shapes, count_blocks
from .v1_arch import identify_v1


def checkpoint_info(path: str, shapes: Shapes, metadata: Mapping[str, str]) -> ModelInfo:
    """What a file with these tensor shapes and metadata holds; CheckpointError naming the
    file when the shapes describe no Sapiens2 or Sapiens v1 model."""
    if looks_like_v1(shapes):
        return v1_checkpoint_info(path, shapes, metadata)
    kind, bb_shapes, head_shapes = describe_layout(path, shapes)
    try:
        spec = infer_backbone(bb_shapes)
        spec.validate()
    except ValueError as exc:
        raise CheckpointError(path, f"backbone: {exc}") from None
    head_spec = None
    input_hw = A.NATIVE_INPUT_HW
    if kind == "task":
        try:
            head_spec, input_hw = infer_head(head_shapes, spec.embed_dim)
        except ValueError as exc:
            if any(MATTING in k for k in head_shapes):
                raise CheckpointError(path, _matting_mismatch(head_shapes, str(exc))) from None
            raise CheckpointError(path, f"decode_head: {exc}") from None
    if "input_hw" in metadata:
        input_hw = _metadata_input_hw(path, metadata["input_hw"])
    return ModelInfo(
        arch=spec.arch_label,
        task=head_spec.task if head_spec else None,
        backbone=spec,
        head=head_spec,
        input_hw=input_hw,
        path=path,
        trained=metadata.get("untrained", "false").lower() != "true",
        metadata=dict(metadata),
    )


def looks_like_v1(shapes: Shapes) -> bool:
    """mmpretrain's ViT names (`pos_embed` and `layers.N.*`, bare or under `backbone.`) and no
    RoPE: the v1 layouts (`v1_arch.identify_v1`). Other ViTs (`blocks.N.*`) are not."""
    for prefix in ("", "backbone."):
        if f"{prefix}pos_embed" in shapes and any(k.startswith(f"{prefix}layers.") for k in shapes):
            return not any(k.endswith("rope_embed.periods") for k in shapes)
    return False


def v1_checkpoint_info(path: str, shapes: Shapes, metadata: Mapping[str, str]) -> ModelInfo:
    """`identify_v1` with what the file's metadata adds: `num_heads` (custom widths),
    `input_hw` (the grid the position embedding was stored for), `patch_padding` (overrides
    the per-task rule), `untrained`."""
    try:
        num_heads = int(metadata["num_heads"]) if "num_heads" in metadata else None
        padding = int(metadata["patch_padding"]) if "patch_padding" in metadata else None
    except ValueError:
        raise CheckpointError(
            path, "metadata num_heads / patch_padding is not an integer"
        ) from None
    input_hw = _metadata_input_hw(path, metadata["input_hw"]) if "input_hw" in metadata else None
    info = identify_v1(
        shapes, path=path, num_heads=num_heads, input_hw=input_hw, patch_padding=padding
    )
    info.path = path
    info.trained = metadata.get("untrained", "false").lower() != "true"
    info.metadata = dict(metadata)
    return info


def mismatch_hint(info: ModelInfo, shapes: Shapes) -> str:
    """What to add when a file's tensors do not fit the model inferred from them: the matting
    head's caveat (its upstream layout is unverified), else nothing."""
    if info.task != MATTING:
        return ""
    return " " + _matting_mismatch(_strip(shapes, "decode_head."), "")


def describe_layout(path: str, shapes: Shapes) -> tuple[str, Shapes, Shapes]:
    """('pretrain' | 'task', backbone shapes, head shapes) or a CheckpointError that says
    what the file looks like instead."""
    keys = list(shapes)
    if any(k.startswith("backbone.") for k in keys):
        other = [k for k in keys if not k.startswith(("backbone.", "decode_head."))]
        if other:
            raise CheckpointError(
                path, f"unexpected keys outside backbone./decode_head.: {other[:8]}"
            )
        return "task", _strip(shapes, "backbone."), _strip(shapes, "decode_head.")
    if "cls_token" in shapes and "storage_tokens" in shapes:
        return "pretrain", shapes, {}
    refuse_wrapped_keys(
        path,
        keys,
        "strip that prefix so keys read backbone.* / decode_head.* (or bare backbone keys)",
    )
    family = ""
    if any("pos_embed" in k for k in keys) and not any("rope_embed" in k for k in keys):
        family = " (it has an absolute position embedding: a ViT or Sapiens v1 checkpoint?)"
    raise CheckpointError(
        path, f"not a Sapiens2 checkpoint{family}: unknown key layout, e.g. {sorted(keys)[:6]}"
    )


def _strip(shapes: Shapes, prefix: str) -> Shapes:
    return {k[len(prefix) :]: v for k, v in shapes.items() if k.startswith(prefix)}


def infer_backbone(shapes: Shapes) -> A.BackboneSpec:
    """Backbone dimensions from un-prefixed backbone keys."""
    if "cls_token" not in shapes or "blocks.0.attn.q_norm.weight" not in shapes:
        raise ValueError("no Sapiens2 backbone keys (cls_token, blocks.0.attn.q_norm.weight)")
    c = shapes["cls_token"][-1]
    head_dim = shapes["blocks.0.attn.q_norm.weight"][0]
    if head_dim <= 0 or c % head_dim:
        raise ValueError(f"q_norm size {head_dim} does not divide the width {c}")
    heads = c // head_dim
    depth = count_blocks(shapes, r"blocks\.(\d+)\.")
    kv = tuple(shapes[f"blocks.{i}.attn.wk.weight"][0] // head_dim for i in range(depth))
    hidden = shapes["blocks.0.ffn.w3.weight"][1]
    tok_depth = count_blocks(shapes, r"tokenizer\.blocks\.(\d+)\.")
    name = A.name_for(c, depth, heads)
    return A.BackboneSpec(name, c, depth, heads, kv, hidden, tok_depth)


def infer_head(shapes: Shapes, in_channels: int) -> tuple[A.HeadSpec, tuple[int, int]]:
    """Head type and channel lists from un-prefixed head keys; also the input size it fixes."""
    outputs = {
        "conv_normal.weight": NORMAL,
        "conv_albedo.weight": ALBEDO,
        "conv_pointmap.weight": POINTMAP,
        "conv_matting.weight": MATTING,
        "conv_seg.weight": SEG,
        "conv_pose.weight": POSE,
    }
    tasks = [t for k, t in outputs.items() if k in shapes]
    if len(tasks) != 1:
        raise ValueError(
            "cannot tell the head type: expected exactly one of "
            + ", ".join(outputs)
            + f"; found {sorted(k for k in shapes if k.startswith('conv_'))}"
        )
    task = tasks[0]
    out_channels = shapes[next(k for k, t in outputs.items() if t == task)][0]
    input_hw = A.NATIVE_INPUT_HW
    if task in (SEG, POSE):
        deconv = tuple(s[1] for _, s in _indexed(shapes, "deconv_layers."))
        conv = tuple(s[0] for _, s in _indexed(shapes, "conv_layers."))
        spec = A.HeadSpec(
            task,
            in_channels,
            out_channels,
            deconv_channels=deconv,
            conv_channels=conv,
            conv_kernel=1,
        )
        return spec, input_hw
    n_up = count_blocks(shapes, r"upsample_blocks\.(\d+)\.")
    up = tuple(shapes[f"upsample_blocks.{i}.0.weight"][0] // 4 for i in range(n_up))
    convs = _indexed(shapes, "conv_layers.")
    conv = tuple(s[0] for _, s in convs if len(s) == 4)
    kernel = convs[0][1][-1] if convs else 3
    spec_kw: dict = {}
    if task == POINTMAP:
        scale_convs = tuple(s[0] for _, s in _indexed(shapes, "scale_conv_layers.") if len(s) == 4)
        linears = [s for _, s in _indexed(shapes, "scale_final_layer.")]
        if not scale_convs or not linears:
            raise ValueError("pointmap head without its scale branch")
        mlp = (linears[0][1], *(s[0] for s in linears))
        spec_kw = {"scale_conv_channels": scale_convs, "scale_mlp": mlp}
        input_hw = _pointmap_input_hw(mlp[0], scale_convs[-1])
    spec = A.HeadSpec(
        task,
        in_channels,
        out_channels,
        upsample_channels=up,
        conv_channels=conv,
        conv_kernel=kernel,
        **spec_kw,
    )
    return spec, input_hw


def _indexed(shapes: Shapes, prefix: str) -> list[tuple[int, tuple[int, ...]]]:
    rx = re.compile(re.escape(prefix) + r"(\d+)\.weight$")
    found = sorted((int(m.group(1)), s) for k, s in shapes.items() if (m := rx.match(k)))
    return found


def _pointmap_input_hw(features: int, channels: int) -> tuple[int, int]:
    """The scale MLP's input size fixes the input resolution (6144 = 128 x 8 x 6 <-> 1024x768).
    Other files are assumed to keep the 4:3 portrait aspect unless their metadata says."""
    cells = features // channels
    for gh in range(1, 256):
        gw = round(gh * 3 / 4) or 1
        if gh * gw == cells and cells * channels == features:
            return gh * 8 * A.PATCH_SIZE, gw * 8 * A.PATCH_SIZE
    raise ValueError(f"pointmap scale MLP takes {features} features: no 4:3 input size fits")


def _metadata_input_hw(path: str, text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.split(","))
    except ValueError:
        raise CheckpointError(path, f"metadata input_hw {text!r} is not 'height,width'") from None
    return h, w


def _matting_mismatch(head_shapes: Shapes, detail: str) -> str:
    return (
        "the matting head's upstream layout is unverified: this library assumes the normal-head "
        "topology (input_conv, upsample_blocks.N.0 with PixelShuffle, conv_layers, "
        "conv_matting with 1 or 4 channels, sigmoid) and this file does not match it. "
        f"{detail} Head keys in the file: {sorted(head_shapes)[:12]}"
    ).strip()
