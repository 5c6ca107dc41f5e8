"""Which checkpoint file makes each pass: explicit files, a checkpoint root searched by the
files' own headers, or (with neither) small untrained models built once and saved, so every
run goes through the same loading code and every output can name its weights by sha256.

Checkpoints are local files (copy released weights to node-local disk once per node;
stack-notes.md section 7): the workers memory-map them.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from sapiens.arch import NATIVE_INPUT_HW, canonical_arch
from sapiens.checkpoint_errors import CheckpointError
from sapiens.loading import describe_layout, infer_backbone, infer_head, read_header, sha256_file
from sapiens.predictor import PASS_TASKS

UNTRAINED_SEED = 20260401
# The tiny test size is built with a small native input so CPU runs take seconds, not minutes.
UNTRAINED_INPUT_HW = {"sapiens2_tiny": (256, 192)}


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint file as the flow hands it to workers (no weights, just the facts)."""

    path: str
    sha256: str
    arch: str  # e.g. sapiens2_0.4b, sapiens2_1b_4k
    task: str  # normal, albedo, pointmap, seg, pose, matting
    trained: bool
    size_bytes: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class CheckpointChoiceError(ValueError):
    """No usable checkpoint for a pass; the message says what was looked for and found."""


def describe_checkpoint(path: str | os.PathLike[str]) -> CheckpointRef:
    """Read a checkpoint's header (not its weights) and hash it; CheckpointError when bad."""
    path = os.fspath(path)
    shapes, _dtypes, metadata = read_header(path)
    kind, backbone_shapes, head_shapes = describe_layout(path, shapes)
    try:
        spec = infer_backbone(backbone_shapes)
        task = "pretrain"
        if kind == "task":
            task = infer_head(head_shapes, spec.embed_dim)[0].task
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


def wanted_arch(model_size: str) -> str:
    name, tokenizer = canonical_arch(model_size)
    return f"{name}_4k" if tokenizer else name


def choose_checkpoints(
    passes: list[str] | tuple[str, ...],
    model_size: str,
    *,
    explicit: dict[str, str] | None = None,
    root: str | None = None,
    untrained_dir: str | os.PathLike[str] | None = None,
) -> dict[str, CheckpointRef]:
    """pass -> checkpoint, or CheckpointChoiceError listing every pass that has none."""
    explicit = explicit or {}
    arch = wanted_arch(model_size)
    catalogue = [c for c in scan_checkpoints(root) if isinstance(c, CheckpointRef)] if root else []
    chosen: dict[str, CheckpointRef] = {}
    problems: list[str] = []
    for name in passes:
        task = PASS_TASKS[name]
        assert task is not None
        if name in explicit:
            try:
                ref = describe_checkpoint(explicit[name])
            except CheckpointError as exc:
                problems.append(f"{name}: {exc}")
                continue
            if ref.task != task:
                problems.append(
                    f"{name}: {explicit[name]} holds a {ref.task} model, not {task} "
                    f"(the {name} pass needs a {task} checkpoint)"
                )
                continue
            chosen[name] = ref
        elif root:
            matches = [c for c in catalogue if c.task == task and c.arch == arch]
            if not matches:
                have = sorted({f"{c.arch}/{c.task}" for c in catalogue}) or ["none"]
                problems.append(
                    f"{name}: no {arch} {task} checkpoint under {root} (found: {', '.join(have)})"
                )
                continue
            chosen[name] = matches[0]
        else:
            if untrained_dir is None:
                raise ValueError("untrained_dir is needed when no checkpoints are given")
            chosen[name] = untrained_checkpoint(model_size, task, untrained_dir)
    if problems:
        raise CheckpointChoiceError("no usable checkpoint for:\n  " + "\n  ".join(problems))
    return chosen


_BUILD_LOCK = threading.Lock()


def untrained_checkpoint(
    model_size: str, task: str, directory: str | os.PathLike[str]
) -> CheckpointRef:
    """A random-weight model of this size and task, built once (fixed seed) and saved."""
    from sapiens.loading import save_model
    from sapiens.model import build_model

    arch = wanted_arch(model_size)
    path = Path(directory) / f"{arch}_{task}_UNTRAINED.safetensors"
    with _BUILD_LOCK:
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            input_hw = UNTRAINED_INPUT_HW.get(arch, NATIVE_INPUT_HW)
            model = build_model(model_size, task, seed=UNTRAINED_SEED, input_hw=input_hw)
            temp = path.with_suffix(f".{os.getpid()}.building")
            save_model(model, temp, trained=False)
            os.replace(temp, path)  # atomic: a concurrent reader never sees half a file
    return describe_checkpoint(path)


# sha256 of big checkpoints takes seconds to minutes; remember it per (path, size, mtime).
_SHA_LOCK = threading.Lock()


def cached_sha256(path: str | os.PathLike[str]) -> str:
    stat = Path(path).stat()
    key = f"{Path(path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    cache_file = _sha_cache_file()
    with _SHA_LOCK:
        cache = _read_cache(cache_file)
        if key in cache:
            return cache[key]
    digest = sha256_file(path)
    with _SHA_LOCK:
        cache = _read_cache(cache_file)
        cache[key] = digest
        if cache_file is not None:
            try:
                cache_file.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(cache))
                tmp.replace(cache_file)
            except OSError:
                pass  # a cache that cannot be written only costs a re-hash next time
    return digest


def _sha_cache_file() -> Path | None:
    home = os.environ.get("SVFX_HOME")
    return Path(home) / "checkpoint-sha256.json" if home else None


def _read_cache(path: Path | None) -> dict[str, str]:
    if path is None or not path.is_file():
        return {}
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}
