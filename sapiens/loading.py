"""Load released Sapiens2 `.safetensors` files with no config: everything is read off the file.

Layouts (reference §1.9, §2.7): pretrain files hold backbone keys without a prefix; task
files hold `backbone.*` and `decode_head.*`. From the tensors we infer width, depth, heads
(from the q/k-norm size), K/V heads per block, the tokenizer and its depth, the head type and
its channel lists. Loading is strict (every missing, unexpected or mis-shaped tensor is
listed), memory-mapped and tensor by tensor straight to the target device and dtype, so a 5B
model never needs a full fp32 copy in RAM. Pickled weights are refused. `verify_checkpoint`
makes the same checks without loading the weights (for the flow process, before dispatch).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping

import torch
from safetensors import safe_open
from torch import nn

from . import arch as A
from .backbone import Sapiens2Backbone
from .checkpoint_errors import CheckpointError
from .finite import nonfinite_tensors
from .heads import build_head
from .model import ModelInfo, SapiensTaskModel
from .safetensors_format import Shapes, read_header, read_tensor_index


def sha256_file(path: str | os.PathLike[str], block: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Inference of the architecture from tensor shapes


def _count(shapes: Shapes, pattern: str) -> int:
    rx = re.compile(pattern)
    idx = {int(m.group(1)) for k in shapes if (m := rx.match(k))}
    if idx and idx != set(range(len(idx))):
        missing = sorted(set(range(max(idx) + 1)) - idx)
        raise ValueError(f"blocks {missing} are missing")
    return len(idx)


def infer_backbone(shapes: Shapes) -> A.BackboneSpec:
    """Backbone dimensions from un-prefixed backbone keys."""
    if "cls_token" not in shapes or "blocks.0.attn.q_norm.weight" not in shapes:
        raise ValueError("no Sapiens2 backbone keys (cls_token, blocks.0.attn.q_norm.weight)")
    c = shapes["cls_token"][-1]
    head_dim = shapes["blocks.0.attn.q_norm.weight"][0]
    if head_dim <= 0 or c % head_dim:
        raise ValueError(f"q_norm size {head_dim} does not divide the width {c}")
    heads = c // head_dim
    depth = _count(shapes, r"blocks\.(\d+)\.")
    kv = tuple(shapes[f"blocks.{i}.attn.wk.weight"][0] // head_dim for i in range(depth))
    hidden = shapes["blocks.0.ffn.w3.weight"][1]
    tok_depth = _count(shapes, r"tokenizer\.blocks\.(\d+)\.")
    name = A.name_for(c, depth, heads)
    return A.BackboneSpec(name, c, depth, heads, kv, hidden, tok_depth)


def _indexed(shapes: Shapes, prefix: str) -> list[tuple[int, tuple[int, ...]]]:
    rx = re.compile(re.escape(prefix) + r"(\d+)\.weight$")
    found = sorted((int(m.group(1)), s) for k, s in shapes.items() if (m := rx.match(k)))
    return found


def infer_head(shapes: Shapes, in_channels: int) -> tuple[A.HeadSpec, tuple[int, int]]:
    """Head type and channel lists from un-prefixed head keys; also the input size it fixes."""
    outputs = {
        "conv_normal.weight": "normal",
        "conv_albedo.weight": "albedo",
        "conv_pointmap.weight": "pointmap",
        "conv_matting.weight": "matting",
        "conv_seg.weight": "seg",
        "conv_pose.weight": "pose",
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
    if task in ("seg", "pose"):
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
    n_up = _count(shapes, r"upsample_blocks\.(\d+)\.")
    up = tuple(shapes[f"upsample_blocks.{i}.0.weight"][0] // 4 for i in range(n_up))
    convs = _indexed(shapes, "conv_layers.")
    conv = tuple(s[0] for _, s in convs if len(s) == 4)
    kernel = convs[0][1][-1] if convs else 3
    spec_kw: dict = {}
    if task == "pointmap":
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


def _pointmap_input_hw(features: int, channels: int) -> tuple[int, int]:
    """The scale MLP's input size fixes the input resolution (6144 = 128 x 8 x 6 <-> 1024x768).
    Other files are assumed to keep the 4:3 portrait aspect unless their metadata says."""
    cells = features // channels
    for gh in range(1, 256):
        gw = round(gh * 3 / 4) or 1
        if gh * gw == cells and cells * channels == features:
            return gh * 8 * A.PATCH_SIZE, gw * 8 * A.PATCH_SIZE
    raise ValueError(f"pointmap scale MLP takes {features} features: no 4:3 input size fits")


# ---------------------------------------------------------------------------------------------


def _strip(shapes: Shapes, prefix: str) -> Shapes:
    return {k[len(prefix) :]: v for k, v in shapes.items() if k.startswith(prefix)}


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
    for wrapper in ("module.", "model.", "state_dict.", "ema."):
        if keys and all(k.startswith(wrapper) for k in keys):
            raise CheckpointError(
                path,
                f"every key starts with {wrapper!r}: strip that prefix "
                "so keys read backbone.* / decode_head.* (or bare backbone keys)",
            )
    family = ""
    if any("pos_embed" in k for k in keys) and not any("rope_embed" in k for k in keys):
        family = " (it has an absolute position embedding: a ViT or Sapiens v1 checkpoint?)"
    raise CheckpointError(
        path, f"not a Sapiens2 checkpoint{family}: unknown key layout, e.g. {sorted(keys)[:6]}"
    )


def compare_shapes(expected: Shapes, found: Shapes) -> list[str]:
    """Human-readable differences between two key->shape maps (empty when equal)."""
    problems = []
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing:
        problems.append(f"missing {len(missing)} tensors: {missing[:10]}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)} tensors: {unexpected[:10]}")
    wrong = [
        f"{k}: file {found[k]} vs model {expected[k]}"
        for k in sorted(set(expected) & set(found))
        if tuple(found[k]) != tuple(expected[k])
    ]
    if wrong:
        problems.append(f"{len(wrong)} tensors with the wrong shape: {wrong[:10]}")
    return problems


def load_model(
    path: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    *,
    sha256: str | None = None,
    expect_task: str | None = None,
) -> nn.Module:
    """Load a Sapiens2 `.safetensors` file (pretrain backbone or task model).

    dtype defaults to bf16 on CUDA and fp32 elsewhere. `sha256`, when the caller already
    knows it (e.g. from the catalog), skips re-hashing; otherwise the file is hashed.
    `expect_task` makes a file of another task an error before any weights are read.
    """
    path = os.fspath(path)
    device = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes, _dtypes, metadata = read_header(path)
    model = build_meta_model(path, shapes, metadata, expect_task=expect_task)
    _load_tensors(path, model, device, dtype)
    model.info.sha256 = sha256 or sha256_file(path)
    return model.eval()


def verify_checkpoint(path: str | os.PathLike[str]) -> ModelInfo:
    """Every check `load_model` makes, without loading the weights: the header, the file's
    tensors against the model inferred from them (built on the meta device, so it costs no
    memory), and that every floating tensor is finite (streamed off disk as raw bits, see
    `sapiens.finite`). Returns what the file holds; CheckpointError naming the file and the
    first bad tensors otherwise."""
    path = os.fspath(path)
    entries, metadata = read_tensor_index(path)
    shapes = {key: entry.shape for key, entry in entries.items()}
    model = build_meta_model(path, shapes, metadata)
    bad = nonfinite_tensors(path, entries)
    if bad:
        raise CheckpointError(path, _nonfinite_reason(bad))
    return model.info


def build_meta_model(
    path: str,
    shapes: Shapes,
    metadata: Mapping[str, str],
    *,
    expect_task: str | None = None,
) -> nn.Module:
    """The model these tensor shapes describe, on the meta device (no weights), with its
    `info`; CheckpointError when the file's tensors do not match it exactly."""
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
            if any("matting" in k for k in head_shapes):
                raise CheckpointError(path, _matting_mismatch(head_shapes, str(exc))) from None
            raise CheckpointError(path, f"decode_head: {exc}") from None
    if "input_hw" in metadata:
        input_hw = _metadata_input_hw(path, metadata["input_hw"])
    task = head_spec.task if head_spec else None
    if expect_task is not None and task != expect_task:
        raise CheckpointError(
            path, f"this file holds a {task or 'pretrain backbone'} model, not {expect_task}"
        )

    with torch.device("meta"):
        backbone = Sapiens2Backbone(spec)
        head = build_head(head_spec) if head_spec else None
    arch_label = f"{spec.name}_4k" if spec.has_tokenizer and spec.name != "custom" else spec.name
    info = ModelInfo(
        arch=arch_label,
        task=task,
        backbone=spec,
        head=head_spec,
        input_hw=input_hw,
        path=path,
        trained=metadata.get("untrained", "false").lower() != "true",
        metadata=dict(metadata),
    )
    if head is not None:
        model: nn.Module = SapiensTaskModel(backbone, head, info)
    else:
        model = backbone
        backbone.info = info  # type: ignore[assignment]
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = compare_shapes(expected, shapes)
    if problems:
        hint = ""
        if task == "matting":
            hint = " " + _matting_mismatch(head_shapes, "")
        raise CheckpointError(
            path, "does not match the inferred model: " + "; ".join(problems) + hint
        )
    return model


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


def _load_tensors(path: str, model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Read each tensor from the memory-mapped file, cast it and place it on the device, one at
    a time, then swap it into the meta model (`assign=True`)."""
    state: dict[str, torch.Tensor] = {}
    load_device = "cpu" if device.type == "meta" else str(device)
    try:
        with safe_open(path, framework="pt", device=load_device) as fh:
            for key in fh.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                t = fh.get_tensor(key)
                if key.endswith("rope_embed.periods"):
                    t = t.to(torch.bfloat16)  # upstream numerics: RoPE runs in bf16
                elif t.is_floating_point():
                    t = t.to(dtype)
                state[key] = t
    except Exception as exc:  # safetensors raises its own error types for corrupt data
        raise CheckpointError(path, f"could not read tensors: {exc}") from None
    _check_finite(path, state)
    model.load_state_dict(state, strict=True, assign=True)


def _check_finite(path: str, state: Mapping[str, torch.Tensor]) -> None:
    bad = [k for k, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise CheckpointError(path, _nonfinite_reason(bad))


def _nonfinite_reason(bad: list[str]) -> str:
    return f"NaN or Inf values in {len(bad)} tensor(s), first: {bad[:10]}"


def save_model(model: nn.Module, path: str | os.PathLike[str], *, trained: bool = False) -> str:
    """Save in the upstream layout (+ metadata: arch, task, input size, whether trained).

    Returns the file's sha256. Used by tests and the demo for random-weight models; the
    metadata marks them untrained so every output made with them says so.
    """
    from safetensors.torch import save_file

    info: ModelInfo = model.info  # type: ignore[assignment]
    meta = {
        "format": "sapiens2",
        "arch": info.arch,
        "task": info.task or "pretrain",
        "input_hw": f"{info.input_hw[0]},{info.input_hw[1]}",
        "untrained": "false" if trained else "true",
    }
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, os.fspath(path), metadata=meta)
    return sha256_file(path)
