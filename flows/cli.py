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

# Help texts are plain text: "SHOW[/SEQ[/SHOT]]" must not be read as rich markup.
app = typer.Typer(
    help="Sapiens2 passes for VFX shots: submit, watch, query.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_show_locals=False,
)
catalog_app = typer.Typer(
    help="Query the catalog (add --json for scripts).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(catalog_app, name="catalog")
console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_PARTIAL, EXIT_FAILED = 0, 1, 2
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def _settings() -> Settings:
    try:
        settings = load_settings()
    except ValueError as exc:  # pydantic's ValidationError: a bad SVFX_* value or svfx.toml
        raise _fail(f"configuration: {exc}") from None
    settings.home.mkdir(parents=True, exist_ok=True)
    # checkpoint checksums and verifications are remembered under the data dir
    os.environ.setdefault("SVFX_HOME", str(settings.home))
    # Prefect keeps its own state under our data dir unless told otherwise.
    os.environ.setdefault("PREFECT_HOME", str(settings.home / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    for name in ("distributed", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return settings


def _interactive() -> None:
    """Commands that draw a progress bar and a summary report everything themselves: the
    flow's own log lines stay in Prefect (its API), only errors reach the terminal; Dask's
    INFO chatter (nannies starting and closing) would bury the progress bar. Set before
    Prefect and distributed are imported: both apply their logging configuration then."""
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "ERROR")
    os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")


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
    model_size: Annotated[
        str,
        typer.Option(
            help="auto|tiny|0.1b|0.4b|0.8b|1b|1b-4k|5b; auto: the largest size with a checkpoint "
            "for every pass under the checkpoint root (SVFX_MODEL_SIZE first), tiny untrained "
            "models only without checkpoints"
        ),
    ] = "auto",
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
    nonfinite: Annotated[
        str, typer.Option(help="plate pixels that are NaN/Inf: error (fail the frame) or zero")
    ] = "error",
    as_json: JsonOpt = False,
) -> None:
    """Run a shot through every pass asked for; shows progress, then a summary."""
    settings = _settings()
    _interactive()
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
        "nonfinite": nonfinite,
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
    """Check (no GPU time, nor torch/Prefect/Dask imports, spent on bad input), make sure no
    live job writes the same outputs (follow it when it runs the same spec), plan, run the
    flow with a progress bar, report. Returns the exit code."""
    from .inputs import check_inputs

    spec = _parsed(data)
    inputs = _refusing(lambda: check_inputs(spec, settings))
    catalog = _refusing(lambda: _catalog(settings))
    live = _live_job(catalog, inputs.paths.root)
    if live is not None:
        return _follow_or_refuse(live, spec, catalog, as_json)
    plan = _refusing(lambda: _plan(spec, settings, inputs))
    _warn_before_run(plan, spec)
    result = _run_flow(spec.model_dump(mode="json"), dask_address, settings, quiet=as_json)
    if result.get("conflict"):  # a twin submitted in the same instant registered first
        return _follow_or_refuse(result["conflict"], spec, catalog, as_json)
    if result.get("job_id") is None:
        raise _fail(result.get("error") or "the run was refused")
    if as_json:
        _print_json(result)
    else:
        _print_result(result)
    return EXIT_CODES.get(result["status"], EXIT_FAILED)


EXIT_CODES = {"complete": EXIT_OK, "partial": EXIT_PARTIAL}


def _parsed(data: dict[str, Any]) -> Any:
    from schemas.spec import SpecError, parse_spec

    try:
        return parse_spec(_absolute_paths(data))
    except SpecError as exc:
        raise _fail(str(exc)) from None


def _absolute_paths(data: dict[str, Any]) -> dict[str, Any]:
    """Local paths typed relative to here mean the same to the flow and to the catalog."""
    out = dict(data)
    for key in ("plate", "output_root", "checkpoint_root"):
        value = out.get(key)
        if isinstance(value, str) and value and "://" not in value:
            out[key] = os.path.abspath(os.path.expanduser(value))
    return out


def _refusing(step: Any) -> Any:
    """Run a preflight step; a refusal becomes one line on stderr and exit 2."""
    from .refusals import REFUSALS

    try:
        return step()
    except REFUSALS as exc:
        raise _fail(str(exc)) from None


def _catalog(settings: Settings) -> Any:
    from schemas.catalog import open_catalog

    return open_catalog(settings.catalog, retry_s=settings.catalog_retry_s)


def _plan(spec: Any, settings: Settings, inputs: Any) -> Any:
    from .planning import plan_shot

    return plan_shot(spec, settings, inputs)


def _live_job(catalog: Any, output_root: str) -> dict[str, Any] | None:
    """A running job on ``output_root`` whose process is alive (see schemas.catalog.lease)."""
    from schemas.catalog.lease import owner_alive
    from schemas.catalog.models import utcnow

    now = utcnow()
    for job in _refusing(lambda: catalog.running_jobs(output_root)):
        if job["owner"] and owner_alive(job["owner"], job["heartbeat_at"], now):
            return job
    return None


def _follow_or_refuse(job: dict[str, Any], spec: Any, catalog: Any, as_json: bool) -> int:
    """The same spec already runs: follow that job to its end rather than compute every frame
    twice. Another spec on the same outputs: refuse, naming the job."""
    job_id = int(job["id"])
    if not _same_work(job.get("spec") or {}, spec.model_dump(mode="json")):
        raise _fail(
            f"job {job_id} ({job.get('submitter')}, {job.get('owner')}) is running another spec "
            f"into {job.get('output_root')}; wait for it (svfx status {job_id}) or write "
            "elsewhere (--version or --output)"
        )
    err.print(
        f"[yellow]job {job_id} is already running this shot with the same settings "
        f"({escape(str(job.get('owner')))}); following it instead of computing it twice[/]",
        highlight=False,
        soft_wrap=True,
    )
    final = _follow(catalog, job_id, str(job.get("output_root") or ""), quiet=as_json)
    if as_json:
        _print_json(final)
    else:
        _show_jobs([final], as_json=False)
    if final["status"] == "running":
        raise _fail(f"job {job_id} stopped without finishing; submit again to finish it")
    return EXIT_CODES.get(final["status"], EXIT_FAILED)


def _same_work(theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    ignore = ("submitter",)
    return {k: v for k, v in theirs.items() if k not in ignore} == {
        k: v for k, v in ours.items() if k not in ignore
    }


def _follow(
    catalog: Any, job_id: int, output_root: str, quiet: bool, poll_s: float = 1.0
) -> dict[str, Any]:
    """Poll the job's counters into a progress bar until it ends or its process dies."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from schemas.catalog.lease import owner_alive
    from schemas.catalog.models import utcnow

    columns = [TextColumn("[bold]job {task.fields[job]}"), BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, console=err, disable=quiet) as bar:
        task = bar.add_task("", total=None, job=job_id)
        while True:
            job = _refusing(lambda: catalog.job(job_id))
            finished = job["frames_done"] + job["frames_failed"] + job["frames_skipped"]
            bar.update(task, total=job["frames_total"], completed=finished)
            if job["status"] != "running":
                return job
            rows = [r for r in catalog.running_jobs(output_root) if r["id"] == job_id]
            owner = rows[0]["owner"] if rows else None
            if owner and not owner_alive(owner, rows[0]["heartbeat_at"], utcnow()):
                return job  # still 'running' with its process gone
            time.sleep(poll_s)


def _warn_before_run(plan: Any, spec: Any) -> None:
    if plan.untrained:
        err.print(
            f"[bold yellow]UNTRAINED MODELS:[/] [bold]{', '.join(plan.untrained)} use random "
            f"weights ({escape(plan.checkpoint_note)}). The outputs prove the pipeline, they are "
            "not real passes: put real checkpoints under SVFX_CHECKPOINT_ROOT or "
            "--checkpoint-root.[/]",
            highlight=False,
            soft_wrap=True,
        )
    elif spec.model_size == "auto":
        err.print(f"checkpoints: {escape(plan.checkpoint_note)}", highlight=False, soft_wrap=True)
    if plan.plate.colorspace_guessed:
        err.print(f"[yellow]{escape(plan.colour_note)}[/]", highlight=False, soft_wrap=True)


def _run_flow(
    spec: dict[str, Any], dask_address: str | None, settings: Settings, quiet: bool
) -> dict[str, Any]:
    """Run the process-shot flow here, against the configured Prefect API or an embedded
    one that lives as long as this command (`flows.orchestrator`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .orchestrator import OrchestratorError, prefect_api
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

        orchestrator = prefect_api(settings.home / "prefect", settings.prefect_start_timeout_s)
        try:
            with orchestrator, listening(update):
                return dict(process_shot(spec, dask_address))
        except OrchestratorError as exc:
            raise _fail(str(exc)) from None


def _run_here(
    spec: dict[str, Any], address: str | None, settings: Settings, as_json: bool
) -> dict[str, Any]:
    """One shot of a scan or a cut, run in this process: its name, progress bar and summary
    (or why the flow refused it); returns the flow's result."""
    if not as_json:
        shot = f"{spec['show']}/{spec['sequence']}/{spec['shot']}"
        frames = f" {spec['frames']}" if spec.get("frames") else ""
        err.print(f"[bold]{escape(shot)}[/] {escape(spec['plate'])}{frames}")
    result = _run_flow(spec, address, settings, quiet=as_json)
    if not as_json:
        if result.get("job_id") is None:  # refused by the flow: a live job, ...
            err.print(f"[bold red]refused:[/] {escape(str(result.get('error')))}")
        else:
            _print_result(result)
    return result


def _exit_code(refused: bool, results: list[dict[str, Any]]) -> int:
    """2 when anything was refused or a shot did not end complete or partial, else 1 when a
    shot is partial, else 0 (the README's codes, for commands that run several shots)."""
    statuses = [r.get("status") for r in results]
    if refused or any(s not in EXIT_CODES for s in statuses):
        return EXIT_FAILED
    return EXIT_PARTIAL if "partial" in statuses else EXIT_OK


def _print_result(result: dict[str, Any]) -> None:
    colour = {"complete": "green", "partial": "yellow"}.get(result["status"], "red")
    table = Table(title=f"job {result['job_id']}: [{colour}]{result['status']}[/]")
    table.add_column("")
    table.add_column("", overflow="fold")
    table.add_row("frames", str(result["total"]))
    table.add_row("done now", str(len(result["done"])))
    table.add_row("already done", str(len(result["skipped"])))
    if result.get("adopted"):
        table.add_row("found on disk", str(len(result["adopted"])))
    table.add_row("failed", str(len(result["failed"])))
    table.add_row("EXR", escape(result["exr_pattern"]))
    table.add_row("Zarr", escape(result["zarr"]))
    for name, uri in result.get("extras", {}).items():
        table.add_row(name.replace("_", " "), escape(str(uri)))
    for name, frames in result.get("flagged", {}).items():
        table.add_row(f"flickers: {name}", ", ".join(map(str, frames)))
    console.print(table)
    for frame, why in sorted(result["failed"].items(), key=lambda kv: int(kv[0])):
        err.print(f"[red]frame {frame}[/]: {escape(why)}", highlight=False, soft_wrap=True)
    if result.get("error"):
        err.print(f"[bold red]error:[/] {escape(result['error'])}", highlight=False, soft_wrap=True)
    if result.get("untrained"):
        err.print(f"[bold yellow]UNTRAINED weights for {', '.join(result['untrained'])}[/]")


# -- status and catalog ------------------------------------------------------------------------
def _engine(settings: Settings) -> Any:
    from schemas.catalog import open_catalog

    return _refusing(lambda: open_catalog(settings.catalog).engine)


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
    """A job's status, its failed frames and the frames temporal QC flags, or the most recent
    jobs."""

    rows = _jobs(job_id=job, limit=limit)
    if job is not None and not rows:
        raise _fail(f"no job {job} in the catalog")
    _show_jobs(rows, as_json)


def _jobs(**filters: Any) -> list[dict[str, Any]]:
    """``queries.jobs`` with the frames temporal QC flags at the configured threshold."""
    from schemas.catalog import queries

    settings = _settings()
    threshold = settings.qc_flicker_threshold
    return list(queries.jobs(_engine(settings), **filters, flicker_threshold=threshold))


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

    rows = _jobs(**_split_shot(shot), status=job_status, limit=limit)
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
    full: Annotated[
        bool, typer.Option(help="also check every tensor's shape and that every weight is finite")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The checkpoints under the checkpoint root, with arch, task, size and sha256, verified."""
    from sapiens.checkpoint_errors import CheckpointError
    from tasks.checkpoint_verify import verify_checkpoint_once
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
        if full:  # shapes against the model and every weight finite (remembered once passed)
            try:
                verify_checkpoint_once(item)
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
    model_size: Annotated[
        str | None, typer.Option(help="auto|tiny|0.1b|...|5b (default SVFX_SCAN_MODEL_SIZE: auto)")
    ] = None,
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
    listed, a sequence was refused or a shot failed."""
    from .orchestrator import OrchestratorError, configured_api_url, prefect_api
    from .plate_template import TemplateError
    from .scan import ScanDefaults, report_lines, scan_with_catalog
    from .submission import DeploymentSubmitter, InlineSubmitter

    settings = _settings()
    _interactive()
    if queue and not configured_api_url():
        raise _fail(
            "--queue hands shots to the served process-shot deployment: set PREFECT_API_URL "
            "to the Prefect server `svfx serve` runs against"
        )
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
        return _run_here(spec, address, settings, as_json)

    submitter: Any = (
        DeploymentSubmitter()
        if queue
        else InlineSubmitter(dask_address or settings.dask_address, run=run_with_progress)
    )
    try:
        with prefect_api(settings.home / "prefect", settings.prefect_start_timeout_s):
            report, reaped = scan_with_catalog(
                prefixes,
                template or settings.scan_template,
                settings=settings,
                submitter=submitter,
                defaults=defaults,
                dry_run=dry_run,
            )
    except (TemplateError, OrchestratorError) as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:
        from .refusals import REFUSALS

        if isinstance(exc, REFUSALS):
            raise _fail(str(exc)) from None
        raise
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
    raise typer.Exit(_exit_code(bool(report.errors or report.refused), results))


# -- cuts in ------------------------------------------------------------------------------------
@app.command("submit-edit")
def submit_edit(
    cut: Annotated[str, typer.Argument(help="the cut: .otio/.otioz, CMX3600 .edl, FCP 7 .xml")],
    show: Annotated[str, typer.Option(help="show of every shot")],
    seq: Annotated[str, typer.Option(help="sequence of every shot")],
    handles: Annotated[
        int, typer.Option(min=0, help="frames added before and after each clip's source range")
    ] = 0,
    shot_template: Annotated[
        str | None,
        typer.Option(
            help="the shot name from the clip's fields: {clip} (default), {marker} (e.g. an EDL "
            "* LOC: name), {reel}, {index} ({index:03d}), {track}, {show}, {seq}"
        ),
    ] = None,
    plates_root: Annotated[
        str | None, typer.Option(help="find every plate here by --plate-template, not the cut's")
    ] = None,
    plate_template: Annotated[
        str | None,
        typer.Option(help="plate under --plates-root; default {shot}/plate/{shot}_plate.####.exr"),
    ] = None,
    rate: Annotated[float, typer.Option(min=1.0, help="frame rate of an EDL (it has none)")] = 24.0,
    passes: Annotated[str, typer.Option(help="comma-separated")] = (
        "normal,pointmap,albedo,matte,seg,pose"
    ),
    model_size: Annotated[str, typer.Option(help="auto|tiny|0.1b|0.4b|0.8b|1b|1b-4k|5b")] = "auto",
    output: Annotated[
        str | None, typer.Option(help="output root (default SVFX_OUTPUT_ROOT)")
    ] = None,
    colorspace: Annotated[
        str | None, typer.Option(help="plate colour space (default: guessed per plate)")
    ] = None,
    checkpoint_root: Annotated[str | None, typer.Option(help="dir of *.safetensors")] = None,
    version: Annotated[str, typer.Option(help="output version, e.g. v002")] = "v001",
    no_previews: Annotated[bool, typer.Option("--no-previews")] = False,
    dask_address: Annotated[str | None, typer.Option(help="scheduler (SVFX_DASK_ADDRESS)")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="only print the clips, their shots and problems")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit one shot per clip of an editorial cut, one after another. Clips sharing a plate
    submit once; a clip that cannot run is named with the reason and the others go on. Exit 0
    all complete, 1 some partial, 2 a clip refused or a shot failed."""
    from .edit_cuts import DEFAULT_PLATE_TEMPLATE, DEFAULT_SHOT_TEMPLATE, CutOptions

    settings = _settings()
    _interactive()
    options = CutOptions(
        show=show,
        seq=seq,
        handles=handles,
        shot_template=shot_template or DEFAULT_SHOT_TEMPLATE,
        plates_root=_absolute_paths({"plate": plates_root})["plate"],
        plate_template=plate_template or DEFAULT_PLATE_TEMPLATE,
        rate=rate,
    )
    shared = _absolute_paths(
        {
            "passes": passes,
            "model_size": model_size,
            "output_root": output,
            "colorspace": colorspace,
            "checkpoint_root": checkpoint_root,
            "version": version,
            "previews": not no_previews,
            "review_clips": not no_previews,
        }
    )
    plan = _cut_plan(cut, options, shared, settings)
    if as_json and dry_run:
        _print_json(plan.as_dict())
    elif not as_json:
        _show_cut(plan)
    if dry_run:
        raise typer.Exit(EXIT_FAILED if plan.refused else EXIT_OK)
    results = _run_cut(plan, settings, dask_address, as_json)
    if as_json:
        shots = [{**s.as_dict(), "result": r} for s, r in zip(plan.shots, results, strict=True)]
        _print_json({**plan.as_dict(), "shots": shots})
    else:
        _show_cut_results(plan, results)
    raise typer.Exit(_exit_code(bool(plan.refused), results))


def _cut_plan(cut: str, options: Any, shared: dict[str, Any], settings: Settings) -> Any:
    """Read the cut and plan its shots; an unreadable cut or a bad template or shared option
    is one line and exit 2."""
    from storage.sequences import discover_sequence

    from .edit_cuts import CutError, load_cut, plan_cut
    from .plate_template import TemplateError

    def discover(pattern: str) -> Any:
        return discover_sequence(pattern, None, settings.storage_options_for(pattern))

    try:
        clips = load_cut(cut, options)
    except (CutError, TemplateError) as exc:
        raise _fail(str(exc)) from None
    return _refusing(
        lambda: plan_cut(
            clips,
            show=options.show,
            seq=options.seq,
            submit=shared,
            roots=settings.roots,
            output_root=settings.outputs,
            discover=discover,
            source=cut,
        )
    )


def _show_cut(plan: Any) -> None:
    """The clips -> shots -> frames -> plate table, what would be submitted, and each refused
    clip on stderr (named, with the reason)."""
    rows = [
        {
            "clip": f"{c.index} {c.name}" if c.name else f"{c.index} (no name)",
            "record": c.record,
            "shot": c.shot,
            "frames": c.frames,
            "plate": c.plate,
            "problem": "; ".join(c.problems),
        }
        for c in plan.clips
    ]
    _table(rows, ["clip", "record", "shot", "frames", "plate", "problem"], title=plan.source)
    shots = [{**s.as_dict(), "clips": len(s.clips)} for s in plan.shots]
    if shots:
        _table(shots, ["shot", "frames", "plate", "clips"], title=f"shots to submit: {len(shots)}")
    for clip in plan.refused:
        for problem in clip.problems:
            err.print(
                f"[bold red]refused:[/] {escape(clip.label)}: {escape(problem)}",
                highlight=False,
                soft_wrap=True,
            )


def _run_cut(
    plan: Any, settings: Settings, dask_address: str | None, as_json: bool
) -> list[dict[str, Any]]:
    """Run each shot here, one after another, against one Prefect API (as `svfx scan` does
    without --queue); each has its progress bar and summary."""
    from .orchestrator import OrchestratorError, prefect_api

    results: list[dict[str, Any]] = []
    if not plan.shots:
        return results
    try:
        with prefect_api(settings.home / "prefect", settings.prefect_start_timeout_s):
            for shot in plan.shots:
                spec = shot.spec.model_dump(mode="json")
                results.append(_run_here(spec, dask_address, settings, as_json))
    except OrchestratorError as exc:
        raise _fail(str(exc)) from None
    return results


def _show_cut_results(plan: Any, results: list[dict[str, Any]]) -> None:
    """One row per shot run and per clip refused."""
    rows = [
        {
            "shot": shot.shot,
            "clips": len(shot.clips),
            "frames": shot.frames,
            "status": result.get("status"),
            "job": result.get("job_id"),
            "note": result.get("error")
            or (f"{len(result['failed'])} frames failed" if result.get("failed") else ""),
        }
        for shot, result in zip(plan.shots, results, strict=True)
    ]
    rows += [
        {
            "shot": c.shot or c.label,
            "clips": 1,
            "frames": c.frames,
            "status": "refused",
            "note": f"{c.label}: {'; '.join(c.problems)}",
        }
        for c in plan.refused
    ]
    _table(rows, ["shot", "clips", "frames", "status", "job", "note"], title="submit-edit")


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
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes")] = 1,
) -> None:
    """Serve the catalog: JSON API under /api (its OpenAPI description at /openapi.json) and
    web pages at /."""
    from api.app import run_api

    if workers == 1:  # the one-process call keeps run_api's three-argument form
        run_api(host, port, _settings())
    else:
        run_api(host, port, _settings(), workers=workers)


# -- demo -----------------------------------------------------------------------------------
@app.command()
def demo(
    frames: int = 24,
    size: Annotated[str, typer.Option(help="WxH of the sample plate")] = "640x360",
    output: Annotated[str | None, typer.Option(help="output root")] = None,
    model_size: str = "auto",
    checkpoint_root: str | None = None,
) -> None:
    """Write a sample shot (scikit-image's astronaut) and process it with every pass."""
    from .demo import DEMO_COLORSPACE, DEMO_FIRST_FRAME, write_demo_plate

    settings = _settings()
    _interactive()
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


def main() -> None:
    """The `svfx` command: the app, with any refusal that escapes a command (a catalog that
    breaks in the middle of a query, ...) shown as one line and exit 2, not a traceback."""
    from .refusals import REFUSALS

    try:
        app()
    except REFUSALS as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_FAILED)


if __name__ == "__main__":
    main()
