"""Model size `auto` (the default): per family, the largest size whose checkpoints under the
root cover every pass asked for, or the configured size (SVFX_MODEL_SIZE) when it covers them
too. The tiny untrained models are used only when there is no root or the root holds no
`*.safetensors` at all; a root with real checkpoints that no single size completes is an
error that says which size has which pass, never a silent fall-back to random weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sapiens.errors import CheckpointError
from sapiens.v1_arch import FAMILY as SAPIENS1

from .errors import CheckpointChoiceError
from .families import (
    AUTO_SIZE,
    FAMILY_NAMES,
    KNOWN_SIZES,
    SAPIENS2,
    SIZE_ORDER,
    size_label,
    wanted_arch,
)
from .files import CheckpointRef, RootScan, skipped_lines


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
    usable = [ref for ref in refs if ref.family == family]
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
    """Every size among `refs` -> the passes it has a checkpoint for (in `pass_tasks` order),
    smallest size first."""
    order = SIZE_ORDER[family]
    tasks_by_size: dict[str, set[str]] = {}
    for ref in refs:
        tasks_by_size.setdefault(ref.size, set()).add(ref.task)
    ranked = sorted(
        tasks_by_size.items(),
        key=lambda item: ((order.index(item[0]) if item[0] in order else len(order)), item[0]),
    )
    return {size: [p for p, task in pass_tasks.items() if task in tasks] for size, tasks in ranked}


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
    return "\n".join(lines + skipped_lines(root, skipped))


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
