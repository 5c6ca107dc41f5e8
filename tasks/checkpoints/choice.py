"""Which checkpoint file makes each pass: `resolve_checkpoints`, what the flow calls.

In order: the explicit files (`--checkpoint PASS=FILE`, checked against their pass); the
family each other pass runs on; the checkpoint root, read by the files' own headers
(`files.scan_root`); per family, the model size (as asked, or `auto`: `auto_size`) and the
file of each pass of that size under the root, or, with no root, a small untrained model
built once and saved (`untrained`), so every run goes through the same loading code and every
output can name its weights by sha256. Every pass without a file is refused in one message.

A pass both families have runs on the family the job asks for (`--family`, Sapiens2 by
default), a pass only one has on that one (``families.PASS_FAMILIES``); each family's passes
get their own size. An explicit file is used for its pass whatever `--family` says, unless its
family has no such pass (a v1 file for pointmap, a Sapiens2 file for depth): that is refused,
naming the pass and the file. A pass run only for others (the person mask depth and pose need,
the seg that parts is made from) runs on the family they run on when it has the pass and none
of them runs on the job's: a depth-only job's seg runs on v1, beside its depth. Without a
checkpoint for it, the refusal says which pass needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sapiens.errors import CheckpointError
from sapiens.v1_arch import FAMILY as SAPIENS1
from sapiens.v1_arch import TASKS as V1_TASKS
from schemas.passes import BY_NAME, families_of, family_of, made_from, run_for

from .auto_size import resolve_auto_size
from .errors import CheckpointChoiceError
from .families import (
    AUTO_SIZE,
    FAMILY_NAMES,
    FAMILY_SIZES,
    PASS_FAMILIES,
    PASS_TASKS,
    SAPIENS2,
    size_label,
    wanted_arch,
)
from .files import CheckpointRef, RootScan, describe_checkpoint, scan_root, skipped_lines
from .untrained import untrained_checkpoint


@dataclass(frozen=True)
class CheckpointChoice:
    """The checkpoint of each pass, the model size used and, for the user, why that size."""

    checkpoints: dict[str, CheckpointRef]
    size: str  # as asked, or what `auto` resolved to (e.g. "1b"); "mixed" for mixed files
    reason: str


def resolve_checkpoints(
    passes: Sequence[str],
    model_size: str,
    *,
    explicit: dict[str, str] | None = None,
    root: str | None = None,
    untrained_dir: str | os.PathLike[str] | None = None,
    preferred: str | None = None,
    family: str = SAPIENS2,
    asked: Sequence[str] | None = None,
) -> CheckpointChoice:
    """The checkpoint of every pass: its explicit file, else one of `model_size` under `root`,
    else (no root) an untrained model. Each pass runs on the family `runs_on` says (`asked`:
    the job's own passes; all of `passes` when None); each family's passes get their own size:
    `model_size` 'auto' picks it (`resolve_auto_size`); `preferred` is the configured size
    auto favours (SVFX_MODEL_SIZE). CheckpointChoiceError lists every pass without a
    checkpoint (and which pass needs it) and every skipped file."""
    explicit = explicit or {}
    chosen, problems = _explicit_choices(passes, explicit)
    users = run_for(passes if asked is None else asked)
    groups: dict[str, dict[str, str]] = {}  # family -> {pass: checkpoint task}
    for name in passes:
        if name not in explicit:
            fam = runs_on(name, family, users.get(name, ()), chosen)
            groups.setdefault(fam, {})[name] = PASS_TASKS[name]
    scan = scan_root(root) if root else None
    auto = model_size.strip().lower() == AUTO_SIZE
    sizes: dict[str, tuple[str, str]] = {}  # family -> (size, reason)
    for fam, pass_tasks in groups.items():
        if auto:
            sizes[fam] = resolve_auto_size(pass_tasks, scan, preferred, fam)
        elif (size := _size_in_family(model_size, fam)) is not None:
            sizes[fam] = size, "asked for" + ("" if scan else ", and no checkpoint root was given")
        else:
            problems += [
                _needed_for(p, users, _no_such_size(model_size, fam, p, p in users))
                for p in pass_tasks
            ]
            continue
        found, missing = _files_of_size(pass_tasks, sizes[fam][0], fam, scan, auto, untrained_dir)
        chosen.update(found)
        problems += [_needed_for(p, users, line) for p, line in missing.items()]
    if problems:
        lines = ["no usable checkpoint for:", *(f"  {p}" for p in problems)]
        if auto:
            lines += [f"(model size auto -> {reason})" for _size, reason in sizes.values()]
        if scan is not None:
            lines += skipped_lines(scan.root, scan.skipped)
        raise CheckpointChoiceError("\n".join(lines))
    size, reason = _size_and_reason(sizes, chosen.values())
    return CheckpointChoice({name: chosen[name] for name in passes}, size, reason)


def runs_on(
    name: str, family: str, users: Sequence[str], explicit: Mapping[str, CheckpointRef]
) -> str:
    """The family `name` runs on in a job asking for `family`: `schemas.passes.family_of`'s,
    unless it runs only for `users` (the passes that need it or are made from it) and none of
    them runs on that family: then the first of theirs that has it (a depth-only job's seg:
    v1). A user's family is its explicit file's, else `family_of`'s."""
    own = family_of(name, family)
    if not users:
        return own
    theirs = [
        explicit[user].family if user in explicit else family_of(made_from(user), family)
        for user in users
    ]
    if own in theirs:
        return own
    return next((f for f in theirs if f in families_of(name)), own)


def _files_of_size(
    pass_tasks: dict[str, str],
    size: str,
    family: str,
    scan: RootScan | None,
    auto: bool,
    untrained_dir: str | os.PathLike[str] | None,
) -> tuple[dict[str, CheckpointRef], dict[str, str]]:
    """The file of each pass at `size` (untrained ones without a root, or with an empty root
    under `auto`), and a line for each pass without."""
    if scan is None or (auto and scan.empty):
        if untrained_dir is None:
            raise ValueError("untrained_dir is needed when no checkpoints are given")
        return {
            p: untrained_checkpoint(size, t, untrained_dir, family) for p, t in pass_tasks.items()
        }, {}
    return _choices_under_root(pass_tasks, wanted_arch(size, family), scan, family)


def _choices_under_root(
    pass_tasks: dict[str, str], arch: str, scan: RootScan, family: str
) -> tuple[dict[str, CheckpointRef], dict[str, str]]:
    """The file of `arch` for each pass (trained ones first), and a line for each pass
    without."""
    chosen: dict[str, CheckpointRef] = {}
    problems: dict[str, str] = {}
    usable = [ref for ref in scan.refs if ref.family == family]
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
        problems[name] = f"{name}: no {arch} {task} checkpoint under {scan.root} (found: {found})"
    return chosen, problems


def _explicit_choices(
    passes: Sequence[str], explicit: dict[str, str]
) -> tuple[dict[str, CheckpointRef], list[str]]:
    """The explicit file of each pass that has one, and a line for each one refused."""
    chosen: dict[str, CheckpointRef] = {}
    problems: list[str] = []
    for name in passes:
        if name not in explicit:
            continue
        task = PASS_TASKS[name]
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


def _size_and_reason(
    sizes: Mapping[str, tuple[str, str]], chosen: Iterable[CheckpointRef]
) -> tuple[str, str]:
    """The size a choice reports, and why: each family's when both ran, the files' own when
    every pass had an explicit file ("mixed" when they differ)."""
    if not sizes:
        found = {ref.size for ref in chosen}
        size = found.pop() if len(found) == 1 else "mixed"
        return size, "every pass has an explicit checkpoint"
    if len(sizes) == 1:
        return next(iter(sizes.values()))
    size = " + ".join(f"{FAMILY_NAMES[f]} {sz}" for f, (sz, _r) in sizes.items())
    reasons = {r for _s, r in sizes.values()}
    if len(reasons) == 1:
        return size, reasons.pop()
    return size, "; ".join(f"{FAMILY_NAMES[f]}: {r}" for f, (_s, r) in sizes.items())


def _size_in_family(model_size: str, family: str) -> str | None:
    """The --model-size label of `model_size` in `family`, None when the family has none."""
    try:
        label = size_label(wanted_arch(model_size, family))
    except ValueError:
        return None
    return label if label in FAMILY_SIZES[family] else None


# -- what a refusal says ------------------------------------------------------------------------
def _needed_for(name: str, users: Mapping[str, Sequence[str]], problem: str) -> str:
    """`problem` (a line about pass `name`), saying which asked pass runs it and why."""
    for user in users.get(name, ()):
        needs = BY_NAME[user].needs
        if name in needs:
            masks = all(BY_NAME[n].person_mask for n in needs)
            what = "a person mask" if masks else " or ".join(needs)
            return f"{user} needs {what} (from {' or '.join(needs)}): {problem}"
    return problem


def _no_such_size(model_size: str, family: str, pass_name: str, run_for: bool = False) -> str:
    """Why `family` cannot run `pass_name` at `model_size`; `run_for`: the pass runs only for
    others (its family follows theirs when it has a choice)."""
    sizes = ", ".join(FAMILY_SIZES[family])
    if len(PASS_FAMILIES[pass_name]) == 1:
        why = ""
    else:
        why = " here (with the passes it runs for)" if run_for else " here (--family)"
    return (
        f"{pass_name}: {FAMILY_NAMES[family]} has no size {model_size} (its sizes: {sizes}); "
        f"the {pass_name} pass runs on {FAMILY_NAMES[family]}{why}"
        ": ask for --model-size auto or one of those"
    )


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
