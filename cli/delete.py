"""`svfx delete`: a version of a shot off the disk, recorded in the catalog (`tasks.deletion`
says what is removed, what is refused, and why running it again finishes it)."""

from __future__ import annotations

import getpass
import socket
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from schemas.catalog.queries.usage import human_bytes

from .console import JsonOpt, console, err, get_settings, print_json, refusing, table

ForceOpt = Annotated[
    bool,
    typer.Option("--force", help="delete published versions, and versions another was made from"),
]


def requested_by() -> str:
    """Who asks, as the catalog records it: the user on this host."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def delete(
    shot: Annotated[str, typer.Argument(help="SHOW/SEQ/SHOT")],
    version: Annotated[str, typer.Option(help="the version to delete, e.g. v002")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="list what would go and its bytes; delete nothing")
    ] = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete a version of a shot: its EXRs, Zarr store, previews, review clips, pose JSON
    and Nuke script, on local disk or S3. The catalog keeps its rows, marked deleted (when,
    by whom), so provenance can still say what a later version was made from. A delete that
    was stopped half way is finished by running it again; resubmitting the version makes it
    again."""
    from schemas.catalog import open_catalog
    from tasks.deletion import files_of, plan_delete

    settings = get_settings()
    catalog = refusing(lambda: open_catalog(settings.catalog, retry_s=settings.catalog_retry_s))
    plan = refusing(lambda: plan_delete(catalog.engine, settings, shot, version, force=force))
    for why in plan.forced:
        err.print(f"--force: {why}", markup=False, highlight=False)
    for gone in plan.already_deleted:
        done = gone.deletion.finished_at if gone.deletion else None
        err.print(f"{gone.name} {gone.label} was deleted already ({done})", markup=False)
    rows: list[dict[str, Any]] = []
    for found in plan.versions:
        if dry_run:
            files = files_of(found, settings)
            size = sum(f.size_bytes for f in files)
            rows.append(_row(found, len(files), size, found.outputs, "would be deleted"))
            continue
        gone = delete_one(catalog, settings, found, "svfx delete" + (" --force" if force else ""))
        rows.append(_row(found, gone.files, gone.size_bytes, gone.outputs, "deleted"))
    if as_json:
        print_json(rows)
    elif rows:
        table([{**r, "size": human_bytes(r["size_bytes"])} for r in rows], _COLUMNS)
        if dry_run:
            console.print("nothing deleted (--dry-run)", markup=False, highlight=False)


def delete_one(catalog: Any, settings: Any, found: Any, reason: str) -> Any:
    """One version's folder off the disk through `tasks.deletion.delete`, with a progress
    bar of its files (`svfx delete` and `svfx prune`)."""
    from tasks.deletion import delete as delete_version

    with _bar(f"deleting {found.name} {found.label}") as progress:
        task = progress.add_task("files", total=None)
        return refusing(
            lambda: delete_version(
                catalog,
                settings,
                found,
                requested_by=requested_by(),
                reason=reason,
                progress=lambda n, total: progress.update(task, completed=n, total=total),
            )
        )


_COLUMNS = ["shot", "folder", "files", "size", "outputs", "status"]


def version_row(found: Any) -> dict[str, Any]:
    """The columns that name a version in the delete and prune tables."""
    return {
        "shot": found.name,
        "version": found.version,
        "folder": found.label,
        "uri": found.folder,
    }


def _row(found: Any, files: int, size: int, outputs: int, status: str) -> dict[str, Any]:
    return {
        **version_row(found),
        "files": files,
        "size_bytes": size,
        "outputs": outputs,
        "status": status,
    }


def _bar(description: str) -> Progress:
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
    )
