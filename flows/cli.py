"""`svfx`: submit shots, watch them, query the catalog, run clusters and workers.

Thin: every command calls one function of `flows`, `tasks` or `schemas.catalog`. Prefect is
imported only by the commands that run flows, so catalog queries answer in a blink.
Exit codes: 0 complete / ok, 1 partial, 2 failed or invalid input.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from schemas.settings import Settings, load_settings

app = typer.Typer(
    help="Sapiens2 passes for VFX shots: submit, watch, query.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
catalog_app = typer.Typer(help="Query the catalog (add --json for scripts).", no_args_is_help=True)
app.add_typer(catalog_app, name="catalog")
console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_PARTIAL, EXIT_FAILED = 0, 1, 2
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def _settings() -> Settings:
    settings = load_settings()
    settings.home.mkdir(parents=True, exist_ok=True)
    # Prefect keeps its own state under our data dir unless told otherwise.
    os.environ.setdefault("PREFECT_HOME", str(settings.home / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Dask's INFO chatter (nannies starting and closing) would bury the progress bar.
    for name in ("distributed", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return settings


def _fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    # escape: "[...]" in a message is text, not markup; soft_wrap: never fold a path across
    # lines when stderr is a pipe or a farm log
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def _table(rows: list[dict[str, Any]], columns: list[str], title: str = "") -> None:
    table = Table(title=title or None, show_lines=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(escape(_cell(row.get(c))) for c in columns))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return str(value)


# -- submit ----------------------------------------------------------------------------------
@app.command()
def submit(
    pattern: Annotated[str, typer.Argument(help="plate.####.exr, plate.%04d.exr or s3://...")],
    shot: Annotated[str, typer.Option(help="SHOW/SEQ/SHOT")],
    frames: Annotated[str | None, typer.Option(help="frame range, e.g. 1001-1100")] = None,
    colorspace: Annotated[str | None, typer.Option(help="plate colour space")] = None,
    passes: Annotated[str, typer.Option(help="comma-separated")] = (
        "normal,pointmap,albedo,matte,seg,pose"
    ),
    model_size: Annotated[str, typer.Option(help="tiny|0.1b|0.4b|0.8b|1b|1b-4k|5b")] = "tiny",
    checkpoint_root: Annotated[str | None, typer.Option(help="dir of *.safetensors")] = None,
    output: Annotated[
        str | None, typer.Option(help="output root (default SVFX_OUTPUT_ROOT)")
    ] = None,
    version: Annotated[str, typer.Option(help="output version, e.g. v002")] = "v001",
    chunk_frames: Annotated[int, typer.Option(help="frames per chunk (and Zarr shard)")] = 8,
    batch_size: Annotated[int, typer.Option(help="tiles per model batch")] = 4,
    tile: Annotated[str | None, typer.Option(help="tile WxH (default: model input)")] = None,
    overlap: Annotated[int, typer.Option(help="tile overlap in pixels")] = 128,
    precision: Annotated[str, typer.Option(help="auto|fp32|bf16|fp16")] = "auto",
    dask_address: Annotated[str | None, typer.Option(help="scheduler (SVFX_DASK_ADDRESS)")] = None,
    no_previews: Annotated[bool, typer.Option("--no-previews")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a shot through every pass asked for; shows progress, then a summary."""
    settings = _settings()
    data: dict[str, Any] = {
        "plate": pattern,
        "frames": frames,
        "colorspace": colorspace,
        "passes": passes,
        "model_size": model_size,
        "checkpoint_root": checkpoint_root,
        "output_root": output,
        "version": version,
        "chunk_frames": chunk_frames,
        "batch_size": batch_size,
        "precision": precision,
        "previews": not no_previews,
        "review_clips": not no_previews,
        "tiling": {"overlap": overlap},
    }
    parts = shot.strip("/").split("/")
    if len(parts) != 3:
        raise _fail(f"--shot must be SHOW/SEQ/SHOT, got {shot!r}")
    data["show"], data["sequence"], data["shot"] = parts
    if tile:
        try:
            w, h = (int(v) for v in tile.lower().split("x"))
        except ValueError:
            raise _fail(f"--tile must be WxH, e.g. 768x1024, got {tile!r}") from None
        data["tiling"].update(tile_width=w, tile_height=h)
    code = run_submit(data, settings, dask_address=dask_address, as_json=as_json)
    raise typer.Exit(code)


def run_submit(
    data: dict[str, Any],
    settings: Settings,
    *,
    dask_address: str | None = None,
    as_json: bool = False,
) -> int:
    """Validate (no GPU time spent on bad input), run the flow with a progress bar, report."""
    spec, plan = preflight(data, settings)
    if plan.untrained:
        err.print(
            "[bold yellow]UNTRAINED MODELS:[/] [bold]no checkpoints were given, so "
            f"{', '.join(plan.untrained)} use random weights. The outputs prove the pipeline, "
            "they are not real passes.[/] Set SVFX_CHECKPOINT_ROOT or --checkpoint-root.",
            highlight=False,
        )
    if plan.plate.colorspace_guessed:
        err.print(f"[yellow]{plan.colour_note}[/]", highlight=False)
    result = _run_flow(spec.model_dump(mode="json"), dask_address, quiet=as_json)
    if as_json:
        _print_json(result)
    else:
        _print_result(result)
    return {"complete": EXIT_OK, "partial": EXIT_PARTIAL}.get(result["status"], EXIT_FAILED)


def preflight(data: dict[str, Any], settings: Settings) -> tuple[Any, Any]:
    from sapiens.checkpoint_errors import CheckpointError
    from schemas.spec import SpecError, parse_spec
    from storage.errors import StorageError
    from tasks.checkpoints import CheckpointChoiceError

    from .planning import plan_shot

    try:
        spec = parse_spec(data)
        plan = plan_shot(spec, settings)
    except (SpecError, StorageError, CheckpointChoiceError, CheckpointError) as exc:
        raise _fail(str(exc)) from None
    return spec, plan


def _run_flow(spec: dict[str, Any], dask_address: str | None, quiet: bool) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .process_shot import process_shot
    from .progress import Progress as ShotProgress
    from .progress import listening

    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=err, disable=quiet, transient=False) as bar:
        task = bar.add_task("starting", total=None, detail="")

        def update(p: ShotProgress) -> None:
            finished = p.done + p.failed + p.skipped
            detail = f"done {p.done}, failed {p.failed}, skipped {p.skipped}, left {p.left}"
            bar.update(task, description="frames", total=p.total, completed=finished, detail=detail)

        with listening(update):
            return process_shot(spec, dask_address)


def _print_result(result: dict[str, Any]) -> None:
    colour = {"complete": "green", "partial": "yellow"}.get(result["status"], "red")
    table = Table(title=f"job {result['job_id']}: [{colour}]{result['status']}[/]")
    table.add_column("")
    table.add_column("", overflow="fold")
    table.add_row("frames", str(result["total"]))
    table.add_row("done now", str(len(result["done"])))
    table.add_row("already done", str(len(result["skipped"])))
    table.add_row("failed", str(len(result["failed"])))
    table.add_row("EXR", result["exr_pattern"])
    table.add_row("Zarr", result["zarr"])
    for name, uri in result.get("extras", {}).items():
        table.add_row(name.replace("_", " "), uri)
    console.print(table)
    for frame, why in sorted(result["failed"].items(), key=lambda kv: int(kv[0])):
        err.print(f"[red]frame {frame}[/]: {escape(why)}", highlight=False, soft_wrap=True)
    if result.get("untrained"):
        err.print(f"[bold yellow]UNTRAINED weights for {', '.join(result['untrained'])}[/]")


# -- status and catalog ------------------------------------------------------------------------
def _engine(settings: Settings) -> Any:
    from schemas.catalog import open_catalog

    return open_catalog(settings.catalog).engine


def _split_shot(shot: str | None) -> dict[str, str | None]:
    if not shot:
        return {"show": None, "sequence": None, "shot": None}
    parts = shot.strip("/").split("/")
    if len(parts) > 3:
        raise _fail(f"shot must be SHOW[/SEQ[/SHOT]], got {shot!r}")
    parts += [None] * (3 - len(parts))  # type: ignore[list-item]
    return {"show": parts[0], "sequence": parts[1], "shot": parts[2]}


@app.command()
def status(
    job: Annotated[int | None, typer.Argument(help="job id (default: recent jobs)")] = None,
    limit: int = 20,
    as_json: JsonOpt = False,
) -> None:
    """A job's status and failed frames, or the most recent jobs."""
    from schemas.catalog import queries

    rows = queries.jobs(_engine(_settings()), job_id=job, limit=limit)
    if job is not None and not rows:
        raise _fail(f"no job {job} in the catalog")
    _show_jobs(rows, as_json)


def _show_jobs(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        _print_json(rows)
        return
    columns = ["id", "shot", "status", "submitter", "created_at", "frames", "message"]
    view = []
    for row in rows:
        view.append(
            {
                **row,
                "shot": "/".join(str(row.get(k)) for k in ("show", "sequence", "shot")),
                "frames": f"{row.get('frames_done', 0)} done, {row.get('frames_skipped', 0)} "
                f"skipped, {row.get('frames_failed', 0)} failed / {row.get('frames_total', 0)}",
            }
        )
    _table(view, columns)
    for row in rows:
        for failure in row.get("failed_frames", [])[:20]:
            err.print(
                f"job {row['id']} frame {failure['frame']}: {failure['error']}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )


@catalog_app.command("shots")
def catalog_shots(
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    as_json: JsonOpt = False,
) -> None:
    """Shots with their pass coverage (frames of each pass that exist)."""
    from schemas.catalog import queries

    rows = queries.shot_coverage(_engine(_settings()), show=show, sequence=sequence, shot=shot)
    if as_json:
        _print_json(rows)
        return
    _table(rows, ["show", "sequence", "shot", "plate_frames", "passes", "job_status"])


@catalog_app.command("outputs")
def catalog_outputs(
    shot: Annotated[str, typer.Argument(help="SHOW/SEQ/SHOT")],
    pass_name: Annotated[str | None, typer.Option("--pass")] = None,
    kind: Annotated[str | None, typer.Option(help="exr|zarr|preview|pose_json")] = None,
    limit: int = 100,
    offset: int = 0,
    as_json: JsonOpt = False,
) -> None:
    """A shot's outputs, newest first."""
    from schemas.catalog import queries

    where = _split_shot(shot)
    if not where["shot"]:
        raise _fail("give the full SHOW/SEQ/SHOT")
    rows = queries.shot_outputs(
        _engine(_settings()),
        where["show"],
        where["sequence"],
        where["shot"],
        pass_name=pass_name,
        kind=kind,
        limit=limit,
        offset=offset,
    )
    if as_json:
        _print_json(rows)
        return
    _table(rows, ["frame", "pass_name", "kind", "part", "uri", "created_at"])


@catalog_app.command("jobs")
def catalog_jobs(
    shot: Annotated[str | None, typer.Argument(help="SHOW[/SEQ[/SHOT]]")] = None,
    job_status: Annotated[str | None, typer.Option("--status")] = None,
    limit: int = 50,
    as_json: JsonOpt = False,
) -> None:
    """Jobs and their failed frames."""
    from schemas.catalog import queries

    rows = queries.jobs(_engine(_settings()), **_split_shot(shot), status=job_status, limit=limit)
    _show_jobs(rows, as_json)


@catalog_app.command("provenance")
def catalog_provenance(
    path: Annotated[str, typer.Argument(help="an output file (EXR, preview, ...)")],
    as_json: JsonOpt = False,
) -> None:
    """Everything about how one output file was made."""
    from schemas.catalog import queries

    record = queries.output_provenance(_engine(_settings()), path)
    if record is None:
        raise _fail(f"{path} is not in the catalog")
    if as_json:
        _print_json(record)
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
    from schemas.catalog import queries

    if not plate_sha256 and not checkpoint_sha256:
        raise _fail("give --plate-sha256 or --checkpoint-sha256")
    rows = queries.invalidated_by(
        _engine(_settings()),
        plate_sha256=plate_sha256,
        checkpoint_sha256=checkpoint_sha256,
        limit=limit,
    )
    if as_json:
        _print_json(rows)
        return
    _table(rows, ["show", "sequence", "shot", "frame", "pass_name", "kind", "uri"])


# -- models --------------------------------------------------------------------------------
@app.command()
def models(
    checkpoint_root: Annotated[
        str | None, typer.Option(help="default SVFX_CHECKPOINT_ROOT")
    ] = None,
    full: Annotated[bool, typer.Option(help="also load every tensor (strict, NaN check)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The checkpoints under the checkpoint root, with arch, task, size and sha256, verified."""
    from sapiens.checkpoint_errors import CheckpointError
    from sapiens.loading import load_model
    from tasks.checkpoints import scan_checkpoints

    settings = _settings()
    root = checkpoint_root or settings.checkpoint_root
    if not root:
        raise _fail("no checkpoint root: pass --checkpoint-root or set SVFX_CHECKPOINT_ROOT")
    if not Path(root).is_dir():
        raise _fail(f"checkpoint root {root} is not a directory")
    rows: list[dict[str, Any]] = []
    bad = 0
    for item in scan_checkpoints(root):
        if isinstance(item, CheckpointError):
            bad += 1
            rows.append({"path": item.path, "status": f"BAD: {item.reason}"})
            continue
        row = {**item.as_dict(), "size": f"{item.size_bytes / 2**20:.1f} MiB", "status": "ok"}
        if full:
            try:
                load_model(item.path, "cpu", sha256=item.sha256)
            except CheckpointError as exc:
                bad += 1
                row["status"] = f"BAD: {exc.reason}"
        if not item.trained:
            row["status"] += " (UNTRAINED)"
        rows.append(row)
    if as_json:
        _print_json(rows)
    elif not rows:
        console.print(f"no *.safetensors under {root}")
    else:
        _table(rows, ["path", "arch", "task", "size", "sha256", "status"])
    raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


# -- cluster and workers ---------------------------------------------------------------------
@app.command()
def cluster(
    workers: Annotated[int, typer.Option(help="CPU worker processes (no GPUs)")] = 2,
    gpus: Annotated[int | None, typer.Option(help="GPUs to use (default: all visible)")] = None,
    dashboard: bool = True,
) -> None:
    """Start a local Dask cluster (one worker per GPU with GPU=1) and print its address."""
    import time

    from .cluster import start_local_cluster

    _settings()
    local = start_local_cluster(workers, gpus=gpus, dashboard=dashboard)
    console.print(f"scheduler: [bold]{local.scheduler_address}[/]")
    console.print(f"export SVFX_DASK_ADDRESS={local.scheduler_address}")
    if dashboard:
        console.print(f"dashboard: {local.dashboard_link}")
    console.print("Ctrl-C to stop.")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        local.close()


@app.command()
def worker(
    address: Annotated[str, typer.Argument(help="scheduler address, e.g. tcp://host:8786")],
    gpus: Annotated[str, typer.Option(help="auto, a count, or 0 for one CPU worker")] = "auto",
    nthreads: int = 1,
    memory_limit: str = "auto",
) -> None:
    """Start GPU workers for an existing scheduler: one process per GPU, each with GPU=1."""
    from .workers import run_workers

    _settings()
    try:
        code = run_workers(address, gpus, nthreads=nthreads, memory_limit=memory_limit)
    except ValueError as exc:  # --gpus asks for more GPUs than there are, or is not a count
        raise _fail(str(exc)) from None
    raise typer.Exit(code)


# -- scan, serve, api ---------------------------------------------------------------------------
@app.command()
def scan(
    prefixes: Annotated[list[str], typer.Argument(help="s3://BUCKET/PREFIX (one or more)")],
    template: Annotated[
        str | None,
        typer.Option(
            help="naming template, e.g. {show}/{seq}/{shot}/plates/{plate}/{name}.####.exr"
        ),
    ] = None,
    passes: Annotated[str | None, typer.Option(help="comma-separated (default: all)")] = None,
    model_size: Annotated[str | None, typer.Option(help="tiny|0.1b|...|5b")] = None,
    output: Annotated[str | None, typer.Option(help="output root, e.g. s3://bucket/out")] = None,
    colorspace: Annotated[
        str | None, typer.Option(help="plate colour space (default: guessed per plate)")
    ] = None,
    settle: Annotated[
        float | None, typer.Option(help="seconds since an object's last write before use")
    ] = None,
    max_in_flight: Annotated[int | None, typer.Option(help="shots running at once")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="only print what it would submit")] = (
        False
    ),
    queue: Annotated[
        bool, typer.Option("--queue", help="queue runs of the served process-shot deployment")
    ] = False,
    dask_address: Annotated[str | None, typer.Option(help="scheduler (SVFX_DASK_ADDRESS)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Scan S3 prefixes once: new or changed plate sequences are processed (here, one shot
    after another; with --queue by the served deployment). Exit 2 when a prefix could not be
    listed or a shot failed."""
    from .plate_template import TemplateError
    from .scan import ScanDefaults, report_lines, scan_with_catalog
    from .submission import DeploymentSubmitter, InlineSubmitter

    settings = _settings()
    defaults = ScanDefaults(
        passes=tuple(p.strip() for p in passes.split(",") if p.strip())
        if passes
        else (tuple(settings.scan_passes) or None),
        model_size=model_size or settings.scan_model_size,
        output_root=output or settings.output_root,
        colorspace=colorspace,
        settle_seconds=settings.scan_settle_s if settle is None else settle,
        max_in_flight=max_in_flight or settings.scan_max_in_flight,
    )

    def run_with_progress(spec: dict[str, Any], address: str | None) -> dict[str, Any]:
        err.print(f"[bold]{spec['show']}/{spec['sequence']}/{spec['shot']}[/] {spec['plate']}")
        result = _run_flow(spec, address, quiet=as_json)
        if not as_json:
            _print_result(result)
        return result

    submitter: Any = (
        DeploymentSubmitter()
        if queue
        else InlineSubmitter(dask_address or settings.dask_address, run=run_with_progress)
    )
    try:
        report, reaped = scan_with_catalog(
            prefixes,
            template or settings.scan_template,
            settings=settings,
            submitter=submitter,
            defaults=defaults,
            dry_run=dry_run,
        )
    except TemplateError as exc:
        raise _fail(str(exc)) from None
    for job in reaped:  # jobs whose flow died: their frames are submitted again
        err.print(
            f"[yellow]job {job['job_id']} closed as {job['status']}[/]: {escape(job['message'])}",
            highlight=False,
            soft_wrap=True,
        )
    if as_json:
        _print_json(report.as_dict())
    else:
        for line in report_lines(report):
            console.print(escape(line), highlight=False, soft_wrap=True)
        for error in report.errors:
            err.print(f"[bold red]error:[/] {escape(error)}", highlight=False, soft_wrap=True)
    results = getattr(submitter, "results", [])
    failed = report.errors or any(r.get("status") == "failed" for r in results)
    partial = any(r.get("status") == "partial" for r in results)
    raise typer.Exit(EXIT_FAILED if failed else EXIT_PARTIAL if partial else EXIT_OK)


@app.command()
def serve() -> None:
    """Serve the deployments: process-shot on demand and, when SVFX_SCAN_PREFIXES is set,
    scan-plates on SVFX_SCAN_CRON or every SVFX_SCAN_INTERVAL_S seconds."""
    settings = _settings()
    from prefect import serve as prefect_serve

    from .scheduled import deployments

    served = deployments(settings)
    if not settings.scan_prefixes:
        err.print("[yellow]no SVFX_SCAN_PREFIXES: serving process-shot only, no scheduled scan[/]")
    prefect_serve(*served)


@app.command()
def api(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
) -> None:
    """Serve the catalog: JSON API under /api (OpenAPI at /docs) and web pages at /."""
    from api.app import run_api

    run_api(host, port, _settings())


# -- demo -----------------------------------------------------------------------------------
@app.command()
def demo(
    frames: int = 24,
    size: Annotated[str, typer.Option(help="WxH of the sample plate")] = "640x360",
    output: Annotated[str | None, typer.Option(help="output root")] = None,
    model_size: str = "tiny",
    checkpoint_root: str | None = None,
) -> None:
    """Write a sample shot (scikit-image's astronaut) and process it with every pass."""
    from .demo import DEMO_COLORSPACE, DEMO_FIRST_FRAME, write_demo_plate

    settings = _settings()
    w, h = (int(v) for v in size.lower().split("x"))
    plate_dir = settings.home / "demo" / "plates"
    pattern = write_demo_plate(plate_dir, frames, w, h)
    console.print(f"sample plate: {pattern} ({frames} frames, {w}x{h}, {DEMO_COLORSPACE})")
    data = {
        "plate": pattern,
        "show": "demo",
        "sequence": "sq010",
        "shot": "sh010",
        "frames": f"{DEMO_FIRST_FRAME}-{DEMO_FIRST_FRAME + frames - 1}",
        "colorspace": DEMO_COLORSPACE,
        "model_size": model_size,
        "checkpoint_root": checkpoint_root or settings.checkpoint_root,
        "output_root": output or str(settings.home / "demo" / "outputs"),
    }
    code = run_submit(data, settings)
    console.print(
        "Query it: [bold]svfx catalog shots[/], [bold]svfx catalog outputs demo/sq010/sh010[/], "
        "[bold]svfx status[/]"
    )
    raise typer.Exit(code)


if __name__ == "__main__":
    app()
