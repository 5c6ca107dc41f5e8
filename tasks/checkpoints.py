"""Which checkpoint file makes each pass: explicit files, a checkpoint root searched by the
files' own headers, or (with neither) small untrained models built once and saved, so every
run goes through the same loading code and every output can name its weights by sha256.

The model size may be `auto` (the default): the largest size whose checkpoints under the root
cover every pass asked for, or the configured size (SVFX_MODEL_SIZE) when it covers them too.
The tiny untrained models are used only when there is no root or the root holds no
`*.safetensors` at all; a root with real checkpoints that no single size completes is an
error that says which size has which pass, never a silent fall-back to random weights.

Two families (`PASS_FAMILIES`): Sapiens2, and Sapiens v1 (files made by `svfx models
convert`), told apart by their tensors. A pass both have (normal, seg, pose) runs on the
family the job asks for (`--family`, Sapiens2 by default); a pass only one has runs on that
one: relative depth on v1, pointmap, albedo and matte on Sapiens2. Each family's passes get
their own size (`auto`: the largest of that family covering them). An explicit file is used
for its pass whatever `--family` says, unless its family has no such pass (a v1 file for
pointmap, a Sapiens2 file for depth): that is refused, naming the pass and the file.

Checkpoints are local files (copy released weights to node-local disk once per node;
stack-notes.md section 7): the workers memory-map them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sapiens.arch import NATIVE_INPUT_HW, canonical_arch
from sapiens.checkpoint_arch import (
    describe_layout,
    infer_backbone,
    infer_head,
    looks_like_v1,
    v1_checkpoint_info,
)
from sapiens.errors import CheckpointError
from sapiens.loading import read_header, sha256_file
from sapiens.seg_classes import seg_classes_for
from sapiens.v1_arch import FAMILY as SAPIENS1
from sapiens.v1_arch import TASKS as V1_TASKS
from sapiens.v1_arch import canonical_v1
from schemas.passes import PASSES, families_of, first_of_kind, model_task

from .checkpoint_errors import CheckpointChoiceError

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
UNTRAINED_NOTE = "tiny UNTRAINED models with random weights"


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
class CheckpointChoice:
    """The checkpoint of each pass, the model size used and, for the user, why that size."""

    checkpoints: dict[str, CheckpointRef]
    size: str  # as asked, or what `auto` resolved to (e.g. "1b"); "mixed" for mixed files
    reason: str


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
    """The family a pass runs on when the job asks for `family` (see PASS_FAMILIES)."""
    have = PASS_FAMILIES[pass_name]
    return family if family in have else have[0]


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


# ---------------------------------------------------------------------------------------------
# Choosing


def resolve_checkpoints(
    passes: Sequence[str],
    model_size: str,
    *,
    explicit: dict[str, str] | None = None,
    root: str | None = None,
    untrained_dir: str | os.PathLike[str] | None = None,
    preferred: str | None = None,
    family: str = SAPIENS2,
) -> CheckpointChoice:
    """The checkpoint of every pass: its explicit file, else one of `model_size` under `root`,
    else (no root) an untrained model. Each pass runs on `pass_family(pass, family)`, and each
    family's passes get their own size: `model_size` 'auto' picks it (see `resolve_auto_size`);
    `preferred` is the configured size auto favours (SVFX_MODEL_SIZE). CheckpointChoiceError
    lists every pass without a checkpoint and every skipped file."""
    explicit = explicit or {}
    chosen, problems = _explicit_choices(passes, explicit)
    groups: dict[str, dict[str, str]] = {}
    for name in passes:
        if name not in explicit:
            groups.setdefault(pass_family(name, family), {})[name] = _task_of(name)
    scan = scan_root(root) if root else None
    auto = model_size.strip().lower() == AUTO_SIZE
    sizes: dict[str, tuple[str, str]] = {}  # family -> (size, reason)
    for fam, pass_tasks in groups.items():
        if auto:
            sizes[fam] = resolve_auto_size(pass_tasks, scan, preferred, fam)
        else:
            size = _size_in_family(model_size, fam)
            if size is None:
                problems += [_no_such_size(model_size, fam, p) for p in pass_tasks]
                continue
            sizes[fam] = size, "asked for"
        size = sizes[fam][0]
        if scan is None or (auto and scan.empty):
            if untrained_dir is None:
                raise ValueError("untrained_dir is needed when no checkpoints are given")
            chosen.update(
                {
                    p: untrained_checkpoint(size, t, untrained_dir, fam)
                    for p, t in pass_tasks.items()
                }
            )
        else:
            found, missing = _choices_under_root(pass_tasks, wanted_arch(size, fam), scan, fam)
            chosen.update(found)
            problems += missing
    if problems:
        lines = ["no usable checkpoint for:", *(f"  {p}" for p in problems)]
        if auto:
            lines += [f"(model size auto -> {reason})" for _size, reason in sizes.values()]
        if scan is not None:
            lines += _skipped_lines(scan.root, scan.skipped)
        raise CheckpointChoiceError("\n".join(lines))
    if not sizes:
        size, reason = _common_size(chosen.values()), "every pass has an explicit checkpoint"
    elif len(sizes) == 1:
        size, reason = next(iter(sizes.values()))
    else:  # both families: say which size each one got
        size = " + ".join(f"{FAMILY_NAMES[f]} {sz}" for f, (sz, _r) in sizes.items())
        reason = "; ".join(f"{FAMILY_NAMES[f]}: {r}" for f, (_s, r) in sizes.items())
    return CheckpointChoice({name: chosen[name] for name in passes}, size, reason)


def _size_in_family(model_size: str, family: str) -> str | None:
    """The --model-size label of `model_size` in `family`, None when the family has none."""
    try:
        label = size_label(wanted_arch(model_size, family))
    except ValueError:
        return None
    return label if label in FAMILY_SIZES[family] else None


def _no_such_size(model_size: str, family: str, pass_name: str) -> str:
    sizes = ", ".join(FAMILY_SIZES[family])
    return (
        f"{pass_name}: {FAMILY_NAMES[family]} has no size {model_size} (its sizes: {sizes}); "
        f"the {pass_name} pass runs on {FAMILY_NAMES[family]}"
        + ("" if len(PASS_FAMILIES[pass_name]) == 1 else " here (--family)")
        + ": ask for --model-size auto or one of those"
    )


def resolve_auto_size(
    pass_tasks: dict[str, str],
    scan: RootScan | None,
    preferred: str | None = None,
    family: str = SAPIENS2,
) -> tuple[str, str]:
    """(size, reason) for model size 'auto': tiny (untrained) with no root or an empty one,
    else `pick_model_size` over what the root holds of `family`."""
    wanted = preferred_size(preferred, family)
    if scan is None:
        reason = f"no checkpoint root was given: {UNTRAINED_NOTE}"
    elif scan.empty:
        reason = f"no *.safetensors under {scan.root}: {UNTRAINED_NOTE}"
    else:
        return pick_model_size(
            pass_tasks,
            scan.refs,
            preferred=preferred,
            root=scan.root,
            skipped=scan.skipped,
            family=family,
        )
    if wanted and wanted != "tiny":
        reason += f" (the configured size {wanted} needs its checkpoints under a root)"
    return "tiny", reason


def pick_model_size(
    pass_tasks: dict[str, str],
    refs: Sequence[CheckpointRef],
    *,
    preferred: str | None = None,
    root: str = "the checkpoint root",
    skipped: Sequence[CheckpointError] = (),
    family: str = SAPIENS2,
) -> tuple[str, str]:
    """(size, reason): among the sizes of `family` whose checkpoints in `refs` cover every
    pass of `pass_tasks` (pass -> task), `preferred` if it is one, else the largest in the
    family's size order (AUTO_SIZE_ORDER, V1_AUTO_SIZE_ORDER).

    Only trained files count when there are any (untrained-marked ones are for tests and
    demos). When one size alone is present it is returned even if incomplete, so the caller
    reports its missing passes one by one; otherwise CheckpointChoiceError says which size
    has which pass and what is missing.
    """
    preferred = preferred_size(preferred, family)
    order = SIZE_ORDER[family]
    usable = family_refs(refs, family)
    other_family = len(refs) - len(usable)
    trained = [ref for ref in usable if ref.trained]
    pool = trained or usable
    covered = passes_by_size(pass_tasks, pool, family)
    complete = [size for size, have in covered.items() if len(have) == len(pass_tasks)]
    note = "" if trained else " (UNTRAINED: the root holds no trained checkpoint)"
    where = root if family == SAPIENS2 else f"{root} ({FAMILY_NAMES[family]})"
    if preferred in complete:
        return preferred, f"{preferred}: the configured size, complete under {where}{note}"
    ranked = sorted((s for s in complete if s in order), key=order.index)
    if ranked:
        size = ranked[-1]
        which = "the largest size" if len(complete) > 1 else "the size"
        parts = [f"{size}: {which} with a checkpoint for every pass under {where}"]
        if preferred:
            lacks = [p for p in pass_tasks if p not in covered.get(preferred, [])]
            parts.append(f"the configured size {preferred} lacks {', '.join(lacks)}")
        others = [s for s in complete if s != size]
        if others:
            parts.append(f"also complete: {', '.join(others)}")
        return size, "; ".join(parts) + note
    autos = [size for size in covered if size in order]
    if len(covered) == 1 and autos:
        return autos[0], f"{autos[0]}: the only size under {where}{note}"
    raise CheckpointChoiceError(
        _no_single_size_message(
            pass_tasks, covered, root, len(pool) < len(usable), skipped, other_family, family
        )
    )


def passes_by_size(
    pass_tasks: dict[str, str], refs: Iterable[CheckpointRef], family: str = SAPIENS2
) -> dict[str, list[str]]:
    """Every size among `refs` -> the passes it has a checkpoint for (in `pass_tasks` order)."""
    tasks_by_size: dict[str, set[str]] = {}
    for ref in refs:
        tasks_by_size.setdefault(ref.size, set()).add(ref.task)
    return {
        size: [p for p, task in pass_tasks.items() if task in tasks]
        for size, tasks in sorted(tasks_by_size.items(), key=lambda item: _rank(item[0], family))
    }


def preferred_size(value: str | None, family: str = SAPIENS2) -> str | None:
    """The configured size as a --model-size label, None for unset or 'auto'; for Sapiens
    v1, also None when v1 has no such size (it configures the Sapiens2 passes)."""
    if value is None or value.strip().lower() in ("", AUTO_SIZE):
        return None
    if family != SAPIENS2:
        try:
            return size_label(wanted_arch(value, family))
        except ValueError:
            return None
    try:
        return size_label(wanted_arch(value))
    except ValueError:
        raise CheckpointChoiceError(
            f"unknown configured model size {value!r} (SVFX_MODEL_SIZE); "
            f"known: {', '.join((AUTO_SIZE, *KNOWN_SIZES))}"
        ) from None


def _rank(size: str, family: str = SAPIENS2) -> tuple[int, str]:
    order = SIZE_ORDER[family]
    return (order.index(size) if size in order else len(order)), size


def _no_single_size_message(
    pass_tasks: dict[str, str],
    covered: dict[str, list[str]],
    root: str,
    untrained_left_out: bool,
    skipped: Sequence[CheckpointError],
    other_family: int = 0,
    family: str = SAPIENS2,
) -> str:
    asked = ", ".join(pass_tasks)
    name = FAMILY_NAMES[family]
    if not covered:
        lines = [
            f"model size auto: no usable {name} checkpoint under {root} (passes asked: {asked})"
        ]
    else:
        lines = [
            f"model size auto: no {name} size under {root} has a checkpoint for every pass "
            f"({asked}):"
        ]
        lines += [
            f"  {size}: {_coverage_line(pass_tasks, have, size, family)}"
            for size, have in covered.items()
        ]
        nowhere = [p for p in pass_tasks if not any(p in have for have in covered.values())]
        if nowhere:
            lines.append(f"no size has: {', '.join(nowhere)}")
        lines.append(
            "Add the missing checkpoints, or pick a size with --model-size (or SVFX_MODEL_SIZE) "
            "and ask only for the passes it has (--passes)."
        )
    if untrained_left_out:
        lines.append("(files marked untrained were left out: the root holds trained ones)")
    if other_family:
        others = FAMILY_NAMES[SAPIENS1 if family == SAPIENS2 else SAPIENS2]
        lines.append(
            f"({other_family} {others} files were left out: these passes run {name}"
            + (
                ", --family sapiens1 runs normal, seg and pose on v1)"
                if family == SAPIENS2
                else ")"
            )
        )
    return "\n".join(lines + _skipped_lines(root, skipped))


def _coverage_line(
    pass_tasks: dict[str, str], have: list[str], size: str, family: str = SAPIENS2
) -> str:
    lacks = [p for p in pass_tasks if p not in have]
    text = f"has {', '.join(have) or 'none of these passes'}"
    if lacks:
        text += f"; lacks {', '.join(lacks)}"
    if size not in SIZE_ORDER[family]:
        text += f" (auto never picks {size}: ask for it with --model-size {size})"
    return text


def _skipped_lines(root: str, skipped: Sequence[CheckpointError]) -> list[str]:
    if not skipped:
        return []
    head = f"files skipped under {root} (unreadable or not Sapiens checkpoints):"
    return [head, *(f"  {exc.path}: {exc.reason}" for exc in skipped)]


def _task_of(pass_name: str) -> str:
    task = PASS_TASKS[pass_name]
    assert task is not None
    return task


def _explicit_choices(
    passes: Sequence[str], explicit: dict[str, str]
) -> tuple[dict[str, CheckpointRef], list[str]]:
    chosen: dict[str, CheckpointRef] = {}
    problems: list[str] = []
    for name in passes:
        if name not in explicit:
            continue
        task = _task_of(name)
        try:
            ref = describe_checkpoint(explicit[name])
        except CheckpointError as exc:
            problems.append(f"{name}: {exc}")
            continue
        if ref.family not in PASS_FAMILIES[name]:
            problems.append(f"{name}: {_family_refusal(name, task, explicit[name], ref)}")
            continue
        if ref.task != task:
            problems.append(
                f"{name}: {explicit[name]} holds a {ref.task} model, not {task} "
                f"(the {name} pass needs a {task} checkpoint)"
            )
            continue
        chosen[name] = ref
    return chosen, problems


def _family_refusal(name: str, task: str, path: str, ref: CheckpointRef) -> str:
    """Why a file of a family that has no pass `name` is refused for it."""
    if ref.family == SAPIENS1:
        return (
            f"{path} is a Sapiens v1 file ({ref.arch} {ref.task}): v1 has "
            f"{', '.join(V1_TASKS[:-1])} and {V1_TASKS[-1]} models only, no {name} pass; "
            f"give a Sapiens2 {task} checkpoint"
        )
    return (
        f"{path} is a Sapiens2 file ({ref.arch} {ref.task}): {name} (relative depth) is a "
        f"Sapiens v1 pass; give a v1 {task} checkpoint (convert a released .pth with "
        "`svfx models convert`)"
    )


def _choices_under_root(
    pass_tasks: dict[str, str], arch: str, scan: RootScan, family: str = SAPIENS2
) -> tuple[dict[str, CheckpointRef], list[str]]:
    """The file of `arch` for each pass (trained ones first), and a line per pass without."""
    chosen: dict[str, CheckpointRef] = {}
    problems: list[str] = []
    usable = family_refs(scan.refs, family)
    for name, task in pass_tasks.items():
        matches = [ref for ref in usable if ref.task == task and ref.arch == arch]
        if matches:
            chosen[name] = sorted(matches, key=lambda ref: not ref.trained)[0]
            continue
        have = sorted({f"{ref.arch}/{ref.task}" for ref in usable}) or ["none"]
        found = ", ".join(have)
        if others := len(scan.refs) - len(usable):
            other = FAMILY_NAMES[SAPIENS1 if family == SAPIENS2 else SAPIENS2]
            found += f"; {others} {other} files, not used by this pass"
        if scan.skipped:
            found += f"; {len(scan.skipped)} files skipped, listed below"
        problems.append(f"{name}: no {arch} {task} checkpoint under {scan.root} (found: {found})")
    return chosen, problems


def _common_size(refs: Iterable[CheckpointRef]) -> str:
    sizes = {ref.size for ref in refs}
    return sizes.pop() if len(sizes) == 1 else "mixed"


_BUILD_LOCK = threading.Lock()


def untrained_checkpoint(
    model_size: str, task: str, directory: str | os.PathLike[str], family: str = SAPIENS2
) -> CheckpointRef:
    """A random-weight model of this size, task and family, built once (fixed seed), saved."""
    from sapiens.loading import save_model
    from sapiens.model import build_model

    arch = wanted_arch(model_size, family)
    path = Path(directory) / f"{arch}_{task}_UNTRAINED.safetensors"
    with _BUILD_LOCK:
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            input_hw = UNTRAINED_INPUT_HW.get(arch, NATIVE_INPUT_HW)
            name = arch if family == SAPIENS1 else model_size
            model = build_model(name, task, seed=UNTRAINED_SEED, input_hw=input_hw)
            temp = path.with_suffix(f".{os.getpid()}.building")
            save_model(model, temp, trained=False)
            os.replace(temp, path)  # atomic: a concurrent reader never sees half a file
    return describe_checkpoint(path)


# ---------------------------------------------------------------------------------------------
# Per-file caches under $SVFX_HOME


class JsonFileCache:
    """A small str -> JSON map in a file under $SVFX_HOME (nothing is kept when it is unset),
    rewritten atomically. Two processes writing at once may drop each other's newest entry,
    which only costs recomputing it; a cache that cannot be written costs the same."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self._lock = threading.Lock()

    def file(self) -> Path | None:
        home = os.environ.get("SVFX_HOME")
        return Path(home) / self.filename if home else None

    def get(self, key: str) -> Any:
        with self._lock:
            return self._read().get(key)

    def put(self, key: str, value: Any) -> None:
        path = self.file()
        if path is None:
            return
        with self._lock:
            entries = self._read()
            entries[key] = value
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_text(json.dumps(entries))
                tmp.replace(path)
            except OSError:
                pass

    def _read(self) -> dict[str, Any]:
        path = self.file()
        if path is None or not path.is_file():
            return {}
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return {}


# sha256 of big checkpoints takes seconds to minutes; remember it per (path, size, mtime).
SHA256_CACHE = JsonFileCache("checkpoint-sha256.json")


def file_identity(path: str | os.PathLike[str]) -> str:
    """'resolved path|size|mtime_ns': changes whenever the file is replaced or rewritten."""
    stat = Path(path).stat()
    return f"{Path(path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}"


def cached_sha256(path: str | os.PathLike[str]) -> str:
    key = file_identity(path)
    digest = SHA256_CACHE.get(key)
    if isinstance(digest, str):
        return digest
    digest = sha256_file(path)
    SHA256_CACHE.put(key, digest)
    return digest
