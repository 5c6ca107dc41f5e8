"""`svfx publish`: a completed job to the production tracker (by job id, or shot and
version), or every pending publish again (``--pending``). What a publish makes and how it is
recorded: `publish/`."""

from __future__ import annotations

import logging
from typing import Annotated, Any

import typer

from publish.adapters import tracker_names

from .catalog import split_shot
from .console import EXIT_FAILED, EXIT_OK, console, fail, get_settings, print_json, refusing, table

TrackerOpt = Annotated[
    str | None,
    typer.Option(help=f"{' or '.join(tracker_names())} (default: SVFX_PUBLISH)"),
]


def publish(
    job: Annotated[int | None, typer.Argument(help="the job id (svfx catalog jobs)")] = None,
    shot: Annotated[
        str | None, typer.Option(help="SHOW/SEQ/SHOT: its newest job of --version")
    ] = None,
    version: Annotated[str, typer.Option(help="the output version, with --shot")] = "v001",
    pending: Annotated[
        bool, typer.Option("--pending", help="try every pending publish again")
    ] = False,
    tracker: TrackerOpt = None,
    again: Annotated[
        bool,
        typer.Option("--again", help="publish even if the catalog says it was (adds nothing)"),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Publish a completed job to the production tracker: a version with the review clip and
    the contact sheet, a comment naming passes, models and frames, and file records for the
    EXRs, the Zarr store and the Nuke script. A tracker that cannot take it (down, login
    refused, a shot it lacks) leaves it pending with the reason: --pending retries."""
    from publish.run import publish_job, publish_pending
    from schemas.catalog import open_catalog, queries

    settings = get_settings()
    logging.getLogger("svfx.publish").setLevel(logging.ERROR)  # the report below says it
    if tracker is not None:
        if tracker not in tracker_names():
            raise fail(f"--tracker must be {' or '.join(tracker_names())}, not {tracker!r}")
        settings = settings.model_copy(update={"publish": tracker})
    catalog = refusing(lambda: open_catalog(settings.catalog, retry_s=settings.catalog_retry_s))
    if pending:
        if job is not None or shot is not None:
            raise fail("--pending retries every pending publish: give no job nor --shot")
        outcomes = refusing(lambda: publish_pending(catalog, settings))
        if not outcomes:
            console.print("no pending publish", markup=False, highlight=False)
        _report([o.as_dict() for o in outcomes], as_json)
        return
    if (job is None) == (shot is None):
        raise fail("give a job id or --shot SHOW/SEQ/SHOT (with --version), one of them")
    if job is None:
        names = split_shot(shot)
        if None in names.values():
            raise fail(f"--shot must be SHOW/SEQ/SHOT, got {shot!r}")
        found = queries.newest_job_of_version(catalog.engine, *names.values(), version)  # type: ignore[arg-type]
        if found is None:
            raise fail(f"the catalog has no job of {shot} {version}")
        job = found
    chosen = job
    outcome = refusing(lambda: publish_job(catalog, chosen, settings, again=again))
    _report([outcome.as_dict()], as_json)


def _report(outcomes: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print_json(outcomes)
    else:
        for o in outcomes:
            ids = o["entity_ids"]
            o["version"] = (
                f"Version {ids['version']}" if "version" in ids
                else f"revision {ids['revision']}" if ids.get("revision") else ""
            )  # fmt: skip
        table(outcomes, ["job_id", "tracker", "status", "code", "version"])
        for o in outcomes:
            if o["status"] == "pending":
                console.print(
                    f"job {o['job_id']} pending on {o['tracker']}: {o['reason']}",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
    code = EXIT_FAILED if any(o["status"] == "pending" for o in outcomes) else EXIT_OK
    raise typer.Exit(code)
