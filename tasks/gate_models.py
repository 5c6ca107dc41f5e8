"""The bf16 accuracy gate's toy models: which model makes each pass, where their weights are,
how a trained model is stored there and how the gate loads them (``sapiens.loading.load_model``,
the loader every worker uses).

The weights (``precision_gate_weights/``, trained by ``bench/gate_training.py``) are toy models
trained briefly on synthetic figures, not Sapiens. The six Sapiens2 ``sapiens2_tiny`` models
share one backbone, stored once beside a file per head (what keeps the folder near 3 MB); to
load one, its backbone and head are joined into an ordinary task file in a scratch folder.
v1's ``sapiens1_tiny`` depth model is one whole file. Every tensor is stored as bf16, so fp32
and bf16 load the very same values (the loader casts to the dtype asked for).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch

from sapiens.loading import load_model
from sapiens.model import SapiensModel
from sapiens.safetensors_format import read_header, sort_metadata
from sapiens.v1_arch import FAMILY as V1_FAMILY
from schemas.passes import PASSES, families_of, made_by_model, model_task

WEIGHTS_DIR = Path(__file__).with_name("precision_gate_weights")
BACKBONE_FILE = "sapiens2_tiny_backbone.safetensors"
BACKBONE_PREFIX = "backbone."
# What every file's metadata says of itself.
NOTE = (
    "toy model trained on synthetic figures for the bf16 accuracy gate "
    "(bench/gate_training.py); not Sapiens, not for production use"
)
# Each model pass of the platform -> the family its gate model is of: the first family that
# has the pass (Sapiens2 for normal, seg and pose, v1 for its depth). Passes made from
# another's output (parts, from seg) have none of their own.
GATE_FAMILIES: Mapping[str, str] = {
    p.name: families_of(p.name)[0] for p in PASSES if made_by_model(p.name) and p.models
}
GATE_TASKS: Mapping[str, str] = {name: model_task(name) for name in GATE_FAMILIES}


def file_of(task: str, family: str) -> str:
    """The stored file of a task's model: a Sapiens2 head, or a whole v1 model."""
    if family == V1_FAMILY:
        return f"sapiens1_tiny_{task}.safetensors"
    return f"sapiens2_tiny_{task}_head.safetensors"


def store_model(whole: str | os.PathLike[str], out: str | os.PathLike[str], task: str) -> None:
    """Store a trained model saved whole (``sapiens.loading.save_model``) into ``out``, with
    ``NOTE`` in its metadata: a Sapiens2 model as its head's file and the shared backbone's
    (the same for every head: the last one stored is kept), a v1 model whole."""
    from safetensors.torch import load_file

    tensors = load_file(os.fspath(whole))
    metadata = {**_metadata(whole), "note": NOTE}
    out = Path(out)
    family = metadata.get("family", "sapiens2")
    if family == V1_FAMILY:
        _write(tensors, metadata, out / file_of(task, family))
        return
    backbone = {k: v for k, v in tensors.items() if k.startswith(BACKBONE_PREFIX)}
    head = {k: v for k, v in tensors.items() if not k.startswith(BACKBONE_PREFIX)}
    _write(backbone, {"note": NOTE, "arch": metadata.get("arch", "")}, out / BACKBONE_FILE)
    _write(head, metadata, out / file_of(task, family))


@contextmanager
def gate_model_files(weights: str | os.PathLike[str] = WEIGHTS_DIR) -> Iterator[dict[str, Path]]:
    """The task file of every gate model, by the pass it makes, for ``load_model``: a Sapiens2
    model's backbone and head joined in a scratch folder (removed on leaving), v1's as
    stored."""
    from safetensors.torch import load_file

    weights = Path(weights)
    with tempfile.TemporaryDirectory(prefix="svfx-gate-") as scratch:
        backbone = load_file(os.fspath(weights / BACKBONE_FILE))
        files: dict[str, Path] = {}
        for name, family in GATE_FAMILIES.items():
            task = GATE_TASKS[name]
            stored = weights / file_of(task, family)
            if family == V1_FAMILY:
                files[name] = stored
                continue
            joined = Path(scratch) / f"{task}.safetensors"
            _write({**backbone, **load_file(os.fspath(stored))}, _metadata(stored), joined)
            files[name] = joined
        yield files


def load_gate_models(
    files: Mapping[str, Path], device: torch.device, dtype: torch.dtype
) -> dict[str, SapiensModel]:
    """Every gate model, by the pass it makes, loaded by ``load_model`` on ``device`` in
    ``dtype`` from ``gate_model_files``."""
    return {
        name: load_model(path, device, dtype, expect_task=GATE_TASKS[name])
        for name, path in files.items()
    }


def _metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    return dict(read_header(path)[2])


def _write(tensors: Mapping[str, torch.Tensor], metadata: dict[str, str], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, os.fspath(path), metadata=metadata)
    sort_metadata(path)  # the same weights, the same bytes
    path.chmod(0o644)  # readable by all, as files a package ships are
