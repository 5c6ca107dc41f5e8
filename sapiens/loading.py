"""Load Sapiens2 and Sapiens v1 `.safetensors` files with no config, check them, save models.

The model is inferred from the file's tensors (`checkpoint_arch`), assembled on the meta device
by the same factory `build_model` uses (`model.make_model`), then the weights are loaded into
it. Loading is strict (every missing, unexpected or mis-shaped tensor is listed) and
tensor by tensor, each read into memory of its own and cast to the target dtype and device
before the next (`tensor_reading`), so a 5B model never needs a full fp32 copy in RAM and no
memory map of the file stays resident beside the weights. Pickled weights are refused.
`verify_checkpoint` makes the same checks without loading the weights (for the flow process,
before dispatch).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from .checkpoint_arch import checkpoint_info, mismatch_hint
from .errors import CheckpointError
from .finite import nonfinite_tensors
from .info import ModelInfo
from .model import SapiensModel, make_model
from .safetensors_format import (
    Shapes,
    TensorEntry,
    read_header,
    read_tensor_index,
    sha256_file,
    sort_metadata,
)
from .tensor_reading import read_tensors

FINITE_BLOCK = 1 << 20

__all__ = [
    "build_meta_model",
    "compare_shapes",
    "load_model",
    "read_header",
    "save_model",
    "sha256_file",
    "verify_checkpoint",
]


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
) -> SapiensModel:
    """Load a Sapiens2 or Sapiens v1 `.safetensors` file (pretrain backbone or task model).

    dtype defaults to bf16 on CUDA and fp32 elsewhere. `sha256`, when the caller already
    knows it (e.g. from the catalog), skips re-hashing; otherwise the file is hashed.
    `expect_task` makes a file of another task an error before any weights are read.
    """
    path = os.fspath(path)
    device = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    entries, metadata = read_tensor_index(path)
    shapes = {key: entry.shape for key, entry in entries.items()}
    model = build_meta_model(path, shapes, metadata, expect_task=expect_task)
    _load_tensors(path, entries, model, device, dtype)
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
) -> SapiensModel:
    """The model these tensor shapes describe, on the meta device (no weights), with its
    `info`; CheckpointError when the file's tensors do not match it exactly."""
    info = checkpoint_info(path, shapes, metadata)
    if expect_task is not None and info.task != expect_task:
        raise CheckpointError(
            path, f"this file holds a {info.task or 'pretrain backbone'} model, not {expect_task}"
        )
    model = make_model(info, torch.device("meta"))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = compare_shapes(expected, shapes)
    if problems:
        reason = "does not match the inferred model: " + "; ".join(problems)
        raise CheckpointError(path, reason + mismatch_hint(info, shapes))
    return model


def _load_tensors(
    path: str,
    entries: Mapping[str, TensorEntry],
    model: SapiensModel,
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Read each tensor into memory of its own, cast it, check it is finite and place it on
    the device, one at a time (`sapiens.tensor_reading`: no memory map of the file stays
    behind), then swap them into the meta model (`assign=True`)."""
    target = torch.device("cpu") if device.type == "meta" else device

    def dtype_for(key: str, file_dtype: torch.dtype) -> torch.dtype:
        if key.endswith("rope_embed.periods"):
            return torch.bfloat16  # upstream numerics: RoPE runs in bf16
        return dtype if file_dtype.is_floating_point else file_dtype

    state: dict[str, torch.Tensor] = {}
    bad: list[str] = []
    try:
        for key, t in read_tensors(path, entries, dtype_for):
            if t.is_floating_point() and not all_finite(t):
                bad.append(key)
            state[key] = t.to(target)
    except (OSError, ValueError) as exc:
        raise CheckpointError(path, f"could not read tensors: {exc}") from None
    if bad:
        raise CheckpointError(path, _nonfinite_reason(bad))
    model.load_state_dict(state, strict=True, assign=True)


def all_finite(t: torch.Tensor, block: int = FINITE_BLOCK) -> bool:
    """Whether a floating tensor holds no NaN or Inf, checked a block of elements at a time so
    the check's temporaries stay small (a whole-tensor mask is a quarter of an fp32 tensor)."""
    flat = t.reshape(-1)
    return all(bool(torch.isfinite(flat[i : i + block]).all()) for i in range(0, len(flat), block))


def _nonfinite_reason(bad: list[str]) -> str:
    return f"NaN or Inf values in {len(bad)} tensor(s), first: {bad[:10]}"


def save_model(model: SapiensModel, path: str | os.PathLike[str], *, trained: bool = False) -> str:
    """Save in the upstream layout (+ metadata: arch, task, input size, whether trained).

    Returns the file's sha256. Used by tests and the demo for random-weight models; the
    metadata marks them untrained so every output made with them says so. The same model
    saves to the same bytes in any process (`sort_metadata`).
    """
    from safetensors.torch import save_file

    info = model.info
    meta = {
        "format": "sapiens2",
        "arch": info.arch,
        "task": info.task or "pretrain",
        "input_hw": f"{info.input_hw[0]},{info.input_hw[1]}",
        "untrained": "false" if trained else "true",
    }
    if info.family != "sapiens2":
        # v1: what the tensors cannot say (heads of a fused qkv, the patch padding).
        meta["format"] = meta["family"] = info.family
        meta["num_heads"] = str(info.backbone.num_heads)
        meta["patch_padding"] = str(info.backbone.patch_padding)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, os.fspath(path), metadata=meta)
    sort_metadata(path)  # the same model saves to the same bytes, in any process
    return sha256_file(path)
