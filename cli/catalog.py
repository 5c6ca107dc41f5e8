"""`svfx catalog`: shots, outputs, jobs, provenance and invalidated outputs, as tables or JSON;
and the jobs table that `svfx status` and a followed submission show too. Every query answers
without importing Prefect, Dask or torch."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from sqlalchemy.engine import Engine

from schemas.catalog import open_catalog, queries
from schemas.settings import Settings

from . import usage as usage_parts
from .console import (
    EXIT_FAILED,
    JsonOpt,
    console,
    err,
    fail,
    get_settings,
    print_json,
    refusing,
    rows_out,
    table,
)

catalog_app = typer.Typer(
    help="Query the catalog (add --json for scripts).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


LimitOpt = Annotated[int, typer.Option(min=1, help="rows at most")]
OffsetOpt = Annotated[int, typer.Option(min=0, help="rows to skip first")]


def engine(settings: Settings) -> Engine:
    return refusing(lambda: open_catalog(settings.catalog).engine)


def split_shot(shot: str | None) -> dict[str, str | None]:
    """SHOW[/SEQ[/SHOT]] as the filters of a query."""
    if not shot:
        return {"show": None, "sequence": None, "shot": None}
    parts: list[str | None] = [*shot.strip("/").split("/")]
    if len(parts) > 3:
        raise fail(f"shot must be SHOW[/SEQ[/SHOT]], got {shot!r}")
    parts += [None] * (3 - len(parts))
    return {"show": parts[0], "sequence": parts[1], "shot": parts[2]}


def read_jobs(job_id: int | None = None, **filters: Any) -> list[dict[str, Any]]:
    """One job (``job_id``) or a page of them, with the frames temporal QC flags at the
    configured threshold."""
    settings = get_settings()
    threshold = settings.qc_flicker_threshold
    if job_id is not None:
        found = queries.job(engine(settings), job_id, flicker_threshold=threshold)
        return [found] if found is not None else []
    return queries.jobs_page(engine(settings), **filters, flicker_threshold=threshold)[0]


def show_jobs(rows: list[dict[str, Any]], as_json: bool) -> None:
    """Jobs as JSON, or a table with each job's failed and flagged frames on stderr."""
    if as_json:
        print_json(rows)
        return
    columns = ["id", "shot", "status", "created_at", "frames"]
    view = []
    for row in rows:
        view.append(
            {
                **row,
                "shot": "/".join(str(row.get(k)) for k in ("show", "sequence", "shot")),
                "frames": frames_cell(row),
            }
        )
    table(view, columns)
    for row in rows:  # who and what, a sentence each: read whole, not folded in a cell
        console.print(
            f"job {row['id']} ({row.get('submitter')}): {row.get('message') or row.get('status')}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for row in rows:
        for failure in row.get("failed_frames", [])[:20]:
            err.print(
                f"job {row['id']} frame {failure['frame']}: {failure['error']}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        flagged: dict[str, list[str]] = {}
        for frame in row.get("flagged_frames", []):
            flagged.setdefault(frame["pass_name"], []).append(
                f"{frame['frame']} ({frame['flicker']:.1f})"
            )
        for pass_name, frames in flagged.items():
            err.print(
                f"job {row['id']} {pass_name} flickers (temporal QC) on frames "
                + ", ".join(frames),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


def frames_cell(job: dict[str, Any]) -> str:
    """'finished/total' (done now or already done), then the failed ones: '22/24, 2 failed'."""
    finished = int(job.get("frames_done") or 0) + int(job.get("frames_skipped") or 0)
    text = f"{finished}/{job.get('frames_total') or 0}"
    failed = int(job.get("frames_failed") or 0)
    return f"{text}, {failed} failed" if failed else text


@catalog_app.command("shots")
def catalog_shots(
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    limit: LimitOpt = 100,
    offset: OffsetOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Shots with their pass coverage (frames of each pass that exist), by name: a page of
    --limit from --offset."""
    rows, total = queries.shots_page(
        engine(get_settings()), show, sequence, shot, limit=limit, offset=offset
    )
    rows_out(rows, ["show", "sequence", "shot", "plate_frames", "passes", "job_status"], as_json)
    if not as_json and total > offset + len(rows):
        err.print(
            f"{len(rows)} of {total} shots from {offset}: --offset {offset + len(rows)} for more",
            markup=False,
            highlight=False,
        )


@catalog_app.command("outputs")
def catalog_outputs(
    shot: Annotated[str, typer.Argument(help="SHOW/SEQ/SHOT")],
    pass_name: Annotated[str | None, typer.Option("--pass")] = None,
    kind: Annotated[str | None, typer.Option(help="exr|zarr|preview|pose_json")] = None,
    limit: LimitOpt = 100,
    offset: OffsetOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """A shot's outputs, newest first."""
    where = split_shot(shot)
    if not where["shot"]:
        raise fail("give the full SHOW/SEQ/SHOT")
    rows, _ = queries.outputs_page(
        engine(get_settings()),
        where["show"],
        where["sequence"],
        where["shot"],
        pass_name=pass_name,
        kind=kind,
        limit=limit,
        offset=offset,
    )
    rows_out(rows, ["frame", "pass_name", "kind", "part", "uri", "created_at"], as_json)


@catalog_app.command("jobs")
def catalog_jobs(
    shot: Annotated[str | None, typer.Argument(help="SHOW[/SEQ[/SHOT]]")] = None,
    job_status: Annotated[str | None, typer.Option("--status")] = None,
    limit: int = 50,
    as_json: JsonOpt = False,
) -> None:
    """Jobs and their failed frames."""
    rows = read_jobs(**split_shot(shot), status=job_status, limit=limit)
    show_jobs(rows, as_json)


@catalog_app.command("publishes")
def catalog_publishes(
    shot: Annotated[str | None, typer.Argument(help="SHOW[/SEQ[/SHOT]]")] = None,
    publish_status: Annotated[
        str | None, typer.Option("--status", help="published|pending")
    ] = None,
    limit: int = 50,
    as_json: JsonOpt = False,
) -> None:
    """What was published to which tracker (entity ids, time), or why it is pending."""
    rows, _ = queries.publishes_page(
        engine(get_settings()), **split_shot(shot), status=publish_status, limit=limit
    )
    columns = ["job_id", "shot", "tracker", "status", "code", "updated_at", "reason"]
    if not as_json:
        for row in rows:
            row["shot"] = "/".join(str(row[k]) for k in ("show", "sequence", "shot"))
    rows_out(rows, columns, as_json)


@catalog_app.command("provenance")
def catalog_provenance(
    path: Annotated[str, typer.Argument(help="an output file (EXR, preview, ...)")],
    as_json: JsonOpt = False,
) -> None:
    """Everything about how one output file was made."""
    record = queries.output_provenance(engine(get_settings()), path)
    if record is None:
        raise fail(f"{path} is not in the catalog")
    if as_json:
        print_json(record)
        return
    console.print_json(json.dumps(record, default=str))


@catalog_app.command("invalidated")
def catalog_invalidated(
    plate_sha256: Annotated[str | None, typer.Option("--plate-sha256")] = None,
    checkpoint_sha256: Annotated[str | None, typer.Option("--checkpoint-sha256")] = None,
    limit: int = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Outputs made from a plate frame checksum or a checkpoint (what re-pulling it voids)."""
    if not plate_sha256 and not checkpoint_sha256:
        raise fail("give --plate-sha256 or --checkpoint-sha256")
    rows, _ = queries.invalidated_page(
        engine(get_settings()),
        plate_sha256=plate_sha256,
        checkpoint_sha256=checkpoint_sha256,
        limit=limit,
    )
    rows_out(rows, ["show", "sequence", "shot", "frame", "pass_name", "kind", "uri"], as_json)


@catalog_app.command("usage")
def catalog_usage(
    path: Annotated[str | None, typer.Argument(help="SHOW[/SEQ[/SHOT]]")] = None,
    by: Annotated[
        str | None,
        typer.Option(help="show|shot|version|pass (per version and pass); default by the path"),
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="compare each version folder with its storage")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Bytes and files the live outputs occupy per show, shot, version folder or pass; with
    --verify, each version folder's bytes on disk against the catalog's (exit 2 when one
    differs)."""
    settings = get_settings()
    where = usage_parts.scope(path)
    level, passes = usage_parts.level_of(by, where)
    bind = engine(settings)
    if where["show"] is not None and not queries.scope_exists(bind, **where):
        raise fail(f"usage: the catalog has no shot under {path}")
    rows = queries.usage(bind, **where, level="version" if verify else level, passes=passes)
    checks = usage_parts.verify(bind, settings, rows) if verify else []
    if as_json and not verify:
        print_json(rows)
    elif not verify:
        usage_parts.show_usage(rows, level, passes)
    elif as_json:
        print_json({"usage": rows, "verify": [c.as_dict() for c in checks]})
    else:
        usage_parts.show_usage(rows, "version", passes)
        usage_parts.show_checks(checks)
    if any(c.differs for c in checks):
        raise typer.Exit(EXIT_FAILED)
