"""`svfx prune`: old, superseded or invalidated versions off the disk by rule, the plan always
printed, nothing deleted without --yes (`tasks.prune` says what matches and what is kept)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from schemas.catalog.queries.usage import human_bytes

from .console import JsonOpt, console, err, get_settings, print_json, refusing, table
from .delete import ForceOpt, delete_one, version_row

_COLUMNS = ["shot", "folder", "made_at", "size", "action", "why"]


def prune(
    keep: Annotated[
        int | None,
        typer.Option(help="keep the N newest complete versions of each shot (and any newer)"),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(help="versions last made longer ago than this: 90m, 12h, 30d, 2w"),
    ] = None,
    invalidated: Annotated[
        bool,
        typer.Option(
            "--invalidated",
            help="versions with a file made from a plate frame or checkpoint changed since",
        ),
    ] = False,
    show: Annotated[str | None, typer.Option(help="only this show")] = None,
    shot: Annotated[str | None, typer.Option(help="only this shot, SHOW/SEQ/SHOT")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="delete what the plan lists")] = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete versions by rule; a version must match every rule given (--keep, --older-than,
    --invalidated). Prints the plan (what goes, what is kept and why) and deletes only with
    --yes, each version as `svfx delete` does. Never deleted: a shot's newest complete
    version, a version a job still writes, and without --force a published version or one
    another version on disk was made from."""
    from schemas.catalog import open_catalog
    from tasks.prune import PruneRules, parse_duration, plan_prune

    settings = get_settings()
    rules = refusing(
        lambda: PruneRules(
            keep=keep,
            older_than=None if older_than is None else parse_duration(older_than),
            invalidated=invalidated,
            show=show,
            shot=shot,
        )
    )
    catalog = refusing(lambda: open_catalog(settings.catalog, retry_s=settings.catalog_retry_s))
    plan = refusing(lambda: plan_prune(catalog.engine, settings, rules, force=force))
    for why in plan.forced:
        err.print(f"--force: {why}", markup=False, highlight=False, soft_wrap=True)
    rows = [_row(i.version, "delete", i.why) for i in plan.delete]
    rows += [_row(i.version, "keep", i.why) for i in plan.kept]
    if not as_json:
        table([{**r, "size": human_bytes(r["size_bytes"])} for r in rows], _COLUMNS)
    freed = _delete_all(catalog, settings, plan) if yes else []
    if as_json:
        print_json({"rules": rules.describe(), "plan": rows, "deleted": freed})
    _summary(plan, freed, yes, err if as_json else console)


def _delete_all(catalog: Any, settings: Any, plan: Any) -> list[dict[str, Any]]:
    """Every version of the plan off the disk, in order."""
    done = []
    for item in plan.delete:
        gone = delete_one(catalog, settings, item.version, plan.reason)
        done.append({**_row(item.version, "deleted", item.why), "size_bytes": gone.size_bytes})
    return done


def _summary(plan: Any, freed: list[dict[str, Any]], yes: bool, out: Any) -> None:
    """One line on what was done (on stderr beside JSON)."""
    say: dict[str, Any] = {"markup": False, "highlight": False, "soft_wrap": True}
    if not plan.delete:
        out.print(f"nothing to prune ({len(plan.kept)} matched, kept)", **say)
    elif yes:
        size = human_bytes(sum(r["size_bytes"] for r in freed))
        out.print(f"deleted {len(freed)} version(s), {size} freed", **say)
    else:
        size = human_bytes(plan.size_bytes)
        out.print(
            f"nothing deleted: {len(plan.delete)} version(s), {size}; "
            f"run `svfx prune {plan.rules.describe()}"
            + (" --force" if plan.force else "")
            + " --yes` to delete them",
            **say,
        )


def _row(version: Any, action: str, why: str) -> dict[str, Any]:
    return {
        **version_row(version),
        "made_at": version.made_at.isoformat(),
        "size_bytes": version.size_bytes,
        "action": action,
        "why": why,
    }
