"""Which checkpoint file makes each pass: explicit files, a checkpoint root searched by the
files' own headers (``tasks.checkpoints``), or (with neither) small untrained models built
once and saved, so every run goes through the same loading code and every output can name its
weights by sha256.

The model size may be `auto` (the default): the largest size whose checkpoints under the root
cover every pass asked for, or the configured size (SVFX_MODEL_SIZE) when it covers them too.
The tiny untrained models are used only when there is no root or the root holds no
`*.safetensors` at all; a root with real checkpoints that no single size completes is an
error that says which size has which pass, never a silent fall-back to random weights.

A pass both families have runs on the family the job asks for (`--family`, Sapiens2 by
default), a pass only one has on that one (``tasks.checkpoints.PASS_FAMILIES``); each
family's passes get their own size (`auto`: the largest of that family covering them). An
explicit file is used for its pass whatever `--family` says, unless its family has no such
pass (a v1 file for pointmap, a Sapiens2 file for depth): that is refused, naming the pass and
the file. A pass run only for others (the person mask depth and pose need, the seg that parts
is made from) runs on the family they run on when it has the pass and none of them runs on the
job's: a depth-only job's seg runs on v1, beside its depth. Without a checkpoint for it, the
refusal says which pass needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sapiens.errors import CheckpointError
from sapiens.v1_arch import FAMILY as SAPIENS1
from sapiens.v1_arch import TASKS as V1_TASKS
from schemas.passes import BY_NAME, families_of, made_from, run_for

from .checkpoint_errors import CheckpointChoiceError
from .checkpoints import (
    AUTO_SIZE,
    FAMILY_NAMES,
    FAMILY_SIZES,
    KNOWN_SIZES,
    PASS_FAMILIES,
    PASS_TASKS,
    SAPIENS2,
    SIZE_ORDER,
    CheckpointRef,
    RootScan,
    describe_checkpoint,
    family_refs,
    pass_family,
    scan_root,
    size_label,
    untrained_checkpoint,
    wanted_arch,
)


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
    else (no root) an untrained model. Each pass runs on `pass_family(pass, family)`, or, when
    run only for passes of `asked` (the job's own; all of `passes` when None) that all run on
    another family, on theirs (`runs_on`); each family's passes get their own size:
    `model_size` 'auto' picks it (see `resolve_auto_size`); `preferred` is the configured size
    auto favours (SVFX_MODEL_SIZE). CheckpointChoiceError lists every pass without a
    checkpoint (and which pass needs it) and every skipped file."""
    explicit = explicit or {}
    chosen, problems = _explicit_choices(passes, explicit)
    users = run_for(passes if asked is None else asked)
    groups: dict[str, dict[str, str]] = {}
    for name in passes:
        if name not in explicit:
            fam = runs_on(name, family, users.get(name, ()), chosen)
            groups.setdefault(fam, {})[name] = _task_of(name)
    scan = scan_root(root) if root else None
    auto = model_size.strip().lower() == AUTO_SIZE
    sizes: dict[str, tuple[str, str]] = {}  # family -> (size, reason)
    for fam, pass_tasks in groups.items():
        if auto:
            sizes[fam] = resolve_auto_size(pass_tasks, scan, preferred, fam)
        else:
            size = _size_in_family(model_size, fam)
            if size is None:
                problems += [
                    _needed_for(p, users, _no_such_size(model_size, fam, p, p in users))
                    for p in pass_tasks
                ]
                continue
            sizes[fam] = size, "asked for" + ("" if scan else ", and no checkpoint root was given")
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
            problems += [_needed_for(p, users, line) for p, line in missing.items()]
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
        reasons = {r for _s, r in sizes.values()}
        reason = (
            reasons.pop()
            if len(reasons) == 1
            else "; ".join(f"{FAMILY_NAMES[f]}: {r}" for f, (_s, r) in sizes.items())
        )
    return CheckpointChoice({name: chosen[name] for name in passes}, size, reason)


def runs_on(
    name: str, family: str, users: Sequence[str], explicit: Mapping[str, CheckpointRef]
) -> str:
    """The family `name` runs on in a job asking for `family`: `pass_family`'s, unless it runs
    only for `users` (the passes that need it or are made from it) and none of them runs on
    that family: then the first of theirs that has it (a depth-only job's seg: v1). A user's
    family is its explicit file's, else `pass_family`'s."""
    own = pass_family(name, family)
    if not users:
        return own
    theirs = [
        explicit[user].family if user in explicit else pass_family(made_from(user), family)
        for user in users
    ]
    if own in theirs:
        return own
    return next((f for f in theirs if f in families_of(name)), own)


def _needed_for(name: str, users: Mapping[str, Sequence[str]], problem: str) -> str:
    """`problem` (a line about pass `name`), saying which asked pass runs it and why."""
    for user in users.get(name, ()):
        needs = BY_NAME[user].needs
        if name in needs:
            masks = all(BY_NAME[n].person_mask for n in needs)
            what = "a person mask" if masks else " or ".join(needs)
            return f"{user} needs {what} (from {' or '.join(needs)}): {problem}"
    return problem


def _size_in_family(model_size: str, family: str) -> str | None:
    """The --model-size label of `model_size` in `family`, None when the family has none."""
    try:
        label = size_label(wanted_arch(model_size, family))
    except ValueError:
        return None
    return label if label in FAMILY_SIZES[family] else None


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
        reason = "no checkpoint root was given"
    elif scan.empty:
        reason = f"no *.safetensors under {scan.root}"
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
    note = "" if trained else " (the root holds only untrained checkpoints)"
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
    return PASS_TASKS[pass_name]


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
) -> tuple[dict[str, CheckpointRef], dict[str, str]]:
    """The file of `arch` for each pass (trained ones first), and a line for each pass
    without."""
    chosen: dict[str, CheckpointRef] = {}
    problems: dict[str, str] = {}
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
        problems[name] = f"{name}: no {arch} {task} checkpoint under {scan.root} (found: {found})"
    return chosen, problems


def _common_size(refs: Iterable[CheckpointRef]) -> str:
    sizes = {ref.size for ref in refs}
    return sizes.pop() if len(sizes) == 1 else "mixed"
