"""What a checkpoint file is (family, arch, task, sha256: read from its header, never from its
name) and what a checkpoint root holds.

Checkpoints are local files (copy released weights to node-local disk once per node;
stack-notes.md section 7): the workers memory-map them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sapiens.checkpoint_arch import (
    describe_layout,
    infer_backbone,
    infer_head,
    looks_like_v1,
    v1_checkpoint_info,
)
from sapiens.errors import CheckpointError
from sapiens.safetensors_format import read_header
from sapiens.seg_classes import seg_classes_for
from schemas.passes import first_of_kind

from .caches import cached_sha256
from .errors import CheckpointChoiceError
from .families import SAPIENS2, size_label


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint file as the flow hands it to workers (no weights, just the facts)."""

    path: str
    sha256: str
    arch: str  # e.g. sapiens2_0.4b, sapiens2_1b_4k, sapiens_0.3b (v1)
    task: str  # normal, albedo, pointmap, seg, pose, matting, pretrain (v1 also depth)
    trained: bool
    size_bytes: int
    family: str = SAPIENS2  # or "sapiens1" (Sapiens v1)
    outputs: int | None = None  # the head's output channels: classes (seg), keypoints (pose)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def size(self) -> str:
        return size_label(self.arch)


@dataclass(frozen=True)
class RootScan:
    """What a checkpoint root holds: the usable files and those skipped, with the reason."""

    root: str
    refs: list[CheckpointRef] = field(default_factory=list)
    skipped: list[CheckpointError] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.refs and not self.skipped


def describe_checkpoint(path: str | os.PathLike[str]) -> CheckpointRef:
    """Read a checkpoint's header (not its weights) and hash it; CheckpointError when bad.
    The family comes from the tensor names and shapes, never from the file name."""
    path = os.fspath(path)
    shapes, _dtypes, metadata = read_header(path)
    if looks_like_v1(shapes):
        info = v1_checkpoint_info(path, shapes, metadata)
        return CheckpointRef(
            path=str(Path(path).resolve()),
            sha256=cached_sha256(path),
            arch=info.arch,
            task=info.task or "pretrain",
            trained=info.trained,
            size_bytes=Path(path).stat().st_size,
            family=info.family,
            outputs=info.head.out_channels if info.head else None,
        )
    kind, backbone_shapes, head_shapes = describe_layout(path, shapes)
    try:
        spec = infer_backbone(backbone_shapes)
        task, outputs = "pretrain", None
        if kind == "task":
            head = infer_head(head_shapes, spec.embed_dim)[0]
            task, outputs = head.task, head.out_channels
    except ValueError as exc:
        raise CheckpointError(path, str(exc)) from None
    arch = f"{spec.name}_4k" if spec.has_tokenizer else spec.name
    return CheckpointRef(
        path=str(Path(path).resolve()),
        sha256=cached_sha256(path),
        arch=arch,
        task=task,
        trained=metadata.get("untrained", "false") != "true",
        size_bytes=Path(path).stat().st_size,
        outputs=outputs,
    )


def scan_checkpoints(root: str | os.PathLike[str]) -> list[CheckpointRef | CheckpointError]:
    """Every ``*.safetensors`` under ``root``, described, or the error that file gives."""
    found: list[CheckpointRef | CheckpointError] = []
    for path in sorted(Path(root).rglob("*.safetensors")):
        try:
            found.append(describe_checkpoint(path))
        except CheckpointError as exc:
            found.append(exc)
    return found


def scan_root(root: str | os.PathLike[str]) -> RootScan:
    """`scan_checkpoints` split into usable files and skipped ones; a root that is not a
    directory is an error (a typo must not turn into random weights)."""
    root = os.fspath(root)
    if not Path(root).is_dir():
        raise CheckpointChoiceError(f"checkpoint root {root} is not a directory")
    items = scan_checkpoints(root)
    refs = [item for item in items if isinstance(item, CheckpointRef)]
    skipped = [item for item in items if isinstance(item, CheckpointError)]
    return RootScan(root, refs, skipped)


def skipped_lines(root: str, skipped: Sequence[CheckpointError]) -> list[str]:
    """The lines a refusal ends with: each file under `root` skipped, and why."""
    if not skipped:
        return []
    head = f"files skipped under {root} (unreadable or not Sapiens checkpoints):"
    return [head, *(f"  {exc.path}: {exc.reason}" for exc in skipped)]


def seg_class_names(checkpoints: Mapping[str, CheckpointRef]) -> tuple[str, ...]:
    """The class names of the seg model among `checkpoints`, in output order (Sapiens2's
    when there is none)."""
    labelled = first_of_kind(checkpoints, "labels")
    seg = checkpoints[labelled] if labelled else None
    return seg_classes_for(seg.family if seg is not None else SAPIENS2)
