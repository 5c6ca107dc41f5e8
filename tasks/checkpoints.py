"""The checkpoint files: what a file is (family, arch, task, sha256; read from its header, never
from its name), what a checkpoint root holds, the sizes and the families, which family has
each pass, and the small untrained models built once and saved when there are no checkpoints.
Choosing the file of each pass is `tasks.checkpoint_choice`.

Two families (`PASS_FAMILIES`): Sapiens2, and Sapiens v1 (files made by `svfx models
convert`), told apart by their tensors. A pass both have (normal, seg, pose) runs on the
family the job asks for (`--family`, Sapiens2 by default); a pass only one has runs on that
one: relative depth on v1, pointmap, albedo and matte on Sapiens2.

Checkpoints are local files (copy released weights to node-local disk once per node;
stack-notes.md section 7): the workers memory-map them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sapiens.arch import NATIVE_INPUT_HW, canonical_arch
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
from sapiens.v1_arch import FAMILY as SAPIENS1
from sapiens.v1_arch import canonical_v1
from schemas.passes import PASSES, families_of, family_of, first_of_kind, model_task

from .checkpoint_errors import CheckpointChoiceError
from .file_caches import cached_sha256

UNTRAINED_SEED = 20260401
# The tiny test size is built with a small native input so CPU runs take seconds, not minutes.
UNTRAINED_INPUT_HW = {"sapiens2_tiny": (256, 192), "sapiens1_tiny": (256, 192)}

AUTO_SIZE = "auto"
SAPIENS2 = "sapiens2"
# The sizes `auto` may pick, smallest first; it takes the largest that covers every pass.
# The 4K variant (1b-4k) is left out: it tiles differently (whole 4K frames, padded to 64 px)
# and costs far more per frame, so it runs only when asked (--model-size or SVFX_MODEL_SIZE).
AUTO_SIZE_ORDER = ("tiny", "0.1b", "0.4b", "0.8b", "1b", "5b")
KNOWN_SIZES = (*AUTO_SIZE_ORDER, "1b-4k")
# Sapiens v1's sizes ("tiny": the untrained stand-in; the others are released).
V1_AUTO_SIZE_ORDER = ("tiny", "0.3b", "0.6b", "1b", "2b")
SIZE_ORDER = {SAPIENS2: AUTO_SIZE_ORDER, SAPIENS1: V1_AUTO_SIZE_ORDER}
FAMILY_SIZES = {SAPIENS2: KNOWN_SIZES, SAPIENS1: V1_AUTO_SIZE_ORDER}
FAMILY_NAMES = {SAPIENS2: "Sapiens2", SAPIENS1: "Sapiens v1"}
# Each pass with a model of its own: the families that have it, and its checkpoint task.
PASS_FAMILIES = {p.name: families_of(p.name) for p in PASSES if p.models}
PASS_TASKS = {name: model_task(name) for name in PASS_FAMILIES}


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint file as the flow hands it to workers (no weights, just the facts)."""

    path: str
    sha256: str
    arch: str  # e.g. sapiens2_0.4b, sapiens2_1b_4k, sapiens_0.3b (v1)
    task: str  # normal, albedo, pointmap, seg, pose, matting, pretrain (v1 also depth)
    trained: bool
    size_bytes: int
    family: str = SAPIENS2  # or "sapiens1" (v1, ECCV 2024)
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


def wanted_arch(model_size: str, family: str = SAPIENS2) -> str:
    """The arch name of a --model-size in a family: '1b' -> 'sapiens2_1b' or 'sapiens_1b'."""
    if family == SAPIENS1:
        return canonical_v1(model_size)
    name, tokenizer = canonical_arch(model_size)
    return f"{name}_4k" if tokenizer else name


def pass_family(pass_name: str, family: str = SAPIENS2) -> str:
    """The family a pass with a model of its own runs on when the job asks for `family`
    (`schemas.passes.family_of`)."""
    PASS_FAMILIES[pass_name]  # KeyError for a pass made from another's model
    return family_of(pass_name, family)


def seg_class_names(checkpoints: Mapping[str, CheckpointRef]) -> tuple[str, ...]:
    """The class names of the seg model among `checkpoints`, in output order (Sapiens2's
    when there is none)."""
    labelled = first_of_kind(checkpoints, "labels")
    seg = checkpoints[labelled] if labelled else None
    return seg_classes_for(seg.family if seg is not None else SAPIENS2)


def size_label(arch: str) -> str:
    """The --model-size spelling of an arch: 'sapiens2_1b_4k' -> '1b-4k'; v1 ones too,
    without their family ('sapiens_0.3b' -> '0.3b'; `CheckpointRef.family` tells which)."""
    for prefix in ("sapiens2_", "sapiens1_", "sapiens_"):
        if arch.startswith(prefix):
            return arch.removeprefix(prefix).replace("_4k", "-4k")
    return arch.replace("_4k", "-4k")


def family_refs(refs: Iterable[CheckpointRef], family: str) -> list[CheckpointRef]:
    """The files of one family."""
    return [ref for ref in refs if ref.family == family]


_BUILD_LOCK = threading.Lock()


def untrained_checkpoint(
    model_size: str, task: str, directory: str | os.PathLike[str], family: str = SAPIENS2
) -> CheckpointRef:
    """A random-weight model of this size, task and family, built once (fixed seed), saved.

    Built under a file lock next to it, so submits started together build it once: the others
    wait, then take the file as it is. A file already there is never rewritten (another
    process may have chosen it and be checking its sha256). Its bytes are the same whichever
    process builds it (`sapiens.loading.save_model`), so a lost home rebuilds the same files."""
    arch = wanted_arch(model_size, family)
    path = Path(directory) / f"{arch}_{task}_UNTRAINED.safetensors"
    if path.is_file():  # the common case, and no lock to create in a read-only folder
        return describe_checkpoint(path)
    from filelock import FileLock

    from sapiens.loading import save_model  # torch: only to build one
    from sapiens.model import build_model

    path.parent.mkdir(parents=True, exist_ok=True)
    with _BUILD_LOCK, FileLock(path.with_name(f"{path.name}.lock")):
        if not path.is_file():  # built while this process waited for the lock
            input_hw = UNTRAINED_INPUT_HW.get(arch, NATIVE_INPUT_HW)
            name = arch if family == SAPIENS1 else model_size
            model = build_model(name, task, seed=UNTRAINED_SEED, input_hw=input_hw)
            temp = path.with_suffix(f".{os.getpid()}.building")
            save_model(model, temp, trained=False)
            os.replace(temp, path)  # atomic: a concurrent reader never sees half a file
    return describe_checkpoint(path)
