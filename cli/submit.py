"""Submitting a shot: `svfx submit` (one shot, with a progress bar and a summary) and
`svfx status`; `run_here` runs a checked spec for `svfx scan` (`cli.scan`) and
`svfx submit-edit` (`cli.cuts`) too. Checks, plans and runs come from `flows`; here are the
prompts, progress bars, tables and exit codes."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Any

import fileseq
import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from core.errors import SvfxError
from flows.inputs import ShotInputs, check_inputs
from flows.live_jobs import follow_job, live_job, same_work
from flows.orchestrator import (
    HEALTH_TIMEOUT_S,
    OrchestratorError,
    check_answers,
    configured_api_url,
)
from flows.progress import Progress as ShotProgress
from flows.submission import run_shot_here
from schemas.catalog import Catalog, open_catalog
from schemas.catalog.errors import JobConflict
from schemas.settings import Settings
from schemas.spec import ShotSpec, SpecError, parse_spec
from storage.uri import split_scheme

from .catalog import read_jobs, show_jobs
from .console import (
    EXIT_CODES,
    EXIT_FAILED,
    JsonOpt,
    add_column,
    console,
    err,
    fail,
    get_settings,
    interactive,
    print_json,
    refused,
    refusing,
)
from .spec_options import (
    DEFAULT_PASSES,
    SPEC_DEFAULTS,
    TILING_DEFAULTS,
    BatchSizeOpt,
    CheckpointRootOpt,
    ChunkFramesOpt,
    ColourOpt,
    ExrLayoutOpt,
    FamilyOpt,
    FramesOpt,
    ModelSizeOpt,
    NonfiniteOpt,
    NoPreviewsOpt,
    OutputOpt,
    OverlapOpt,
    PassesOpt,
    PrecisionOpt,
    RadiusOpt,
    TemporalOpt,
    TilesOpt,
    VersionOpt,
    shot_names,
)

# Planning imports torch and running a shot imports Prefect and Dask (seconds each on a busy
# machine): both are imported inside the functions that need them, so bad input is refused,
# and the catalog answers, without them.
if TYPE_CHECKING:
    from flows.planning import ShotPlan

# The scheduler to run on; --dask-address is its older name, kept working.
ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        "--dask-address",
        help="Dask scheduler address, e.g. tcp://scheduler:8786 (default SVFX_DASK_ADDRESS; "
        "neither: a LocalCluster per run)",
    ),
]


CheckpointOpt = Annotated[
    list[str] | None, typer.Option(help="PASS=FILE: this checkpoint for this pass (repeatable)")
]
TileOpt = Annotated[str | None, typer.Option(help="tile WxH (default: model input)")]


# -- submit ----------------------------------------------------------------------------------
def submit(
    pattern: Annotated[str, typer.Argument(help="plate.####.exr, plate.%04d.exr or s3://...")],
    shot: Annotated[str, typer.Option(help="SHOW/SEQ/SHOT")],
    frames: FramesOpt = None,
    colorspace: ColourOpt = None,
    passes: PassesOpt = DEFAULT_PASSES,
    family: FamilyOpt = SPEC_DEFAULTS["family"],
    model_size: ModelSizeOpt = SPEC_DEFAULTS["model_size"],
    checkpoint_root: CheckpointRootOpt = None,
    checkpoint: CheckpointOpt = None,
    output: OutputOpt = None,
    version: VersionOpt = SPEC_DEFAULTS["version"],
    chunk_frames: ChunkFramesOpt = SPEC_DEFAULTS["chunk_frames"],
    batch_size: BatchSizeOpt = SPEC_DEFAULTS["batch_size"],
    tile: TileOpt = None,
    overlap: OverlapOpt = TILING_DEFAULTS["overlap"],
    precision: PrecisionOpt = SPEC_DEFAULTS["precision"],
    dask_address: ClusterOpt = None,
    no_previews: NoPreviewsOpt = False,
    nonfinite: NonfiniteOpt = SPEC_DEFAULTS["nonfinite"],
    exr_layout: ExrLayoutOpt = SPEC_DEFAULTS["exr_layout"],
    tiles: TilesOpt = SPEC_DEFAULTS["tiles"],
    temporal: TemporalOpt = SPEC_DEFAULTS["temporal"],
    temporal_radius: RadiusOpt = SPEC_DEFAULTS["temporal_radius"],
    as_json: JsonOpt = False,
) -> None:
    """Run a shot through every pass asked for; shows progress, then a summary."""
    settings = get_settings()
    interactive()
    data: dict[str, Any] = {
        "plate": pattern,
        "frames": frames,
        "colorspace": colorspace,
        "passes": passes,
        "family": family,
        "model_size": model_size,
        "checkpoint_root": checkpoint_root,
        "checkpoints": pass_files(checkpoint or []),
        "output_root": output,
        "version": version,
        "chunk_frames": chunk_frames,
        "batch_size": batch_size,
        "precision": precision,
        "previews": not no_previews,
        "review_clips": not no_previews,
        "tiling": {"overlap": overlap},
        "nonfinite": nonfinite,
        "exr_layout": exr_layout,
        "tiles": tiles,
        "temporal": temporal,
        "temporal_radius": temporal_radius,
    }
    data["show"], data["sequence"], data["shot"] = shot_names(shot)
    data["tiling"].update(tile_size(tile))
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
    spec = _parsed(data)
    inputs = refusing(lambda: check_inputs(spec, settings))
    require_cluster(dask_address, settings)
    require_orchestrator()
    catalog = refusing(lambda: open_catalog(settings.catalog, retry_s=settings.catalog_retry_s))
    live = refusing(lambda: live_job(catalog, inputs.paths.root))
    if live is not None:
        return _follow_or_refuse(live, spec, catalog, as_json)
    plan = refusing(lambda: _plan(spec, settings, inputs))
    _warn_before_run(plan, spec)
    from flows.settled import settle_without_cluster

    try:  # nothing to compute: answered here, without a cluster or the flow (a version
        # to stabilise after it goes to the flow, which does both)
        settled = None if spec.stabilises_after else settle_without_cluster(plan, catalog)
    except JobConflict as exc:  # a twin submitted in the same instant registered first
        return _follow_or_refuse(exc.job, spec, catalog, as_json)
    except SvfxError as exc:
        raise refused(exc) from None
    if settled is not None:
        result = settled.as_dict()
    else:
        result = _run_flow(spec.model_dump(mode="json"), dask_address, settings, quiet=as_json)
    if result.get("conflict"):  # a twin submitted in the same instant registered first
        return _follow_or_refuse(result["conflict"], spec, catalog, as_json)
    if result.get("job_id") is None:
        raise fail(result.get("error") or "the run was refused")
    if as_json:
        print_json(result)
    else:
        _print_result(result)
    return EXIT_CODES.get(result["status"], EXIT_FAILED)


def require_cluster(address: str | None, settings: Settings) -> None:
    """The scheduler named (--cluster, else SVFX_DASK_ADDRESS) answers, or one line naming it
    and exit 2 within SVFX_DASK_CONNECT_TIMEOUT_S: proven before anything is registered in the
    catalog, planned or handed to Prefect, so a dead address leaves nothing half-submitted.
    No address: each run starts its own LocalCluster, nothing to prove."""
    address = address or settings.dask_address
    if address:
        from flows.cluster import scheduler_identity

        refusing(lambda: scheduler_identity(address, settings.dask_connect_timeout_s))


def require_orchestrator() -> None:
    """A configured Prefect API (PREFECT_API_URL) answers, or one line naming it and exit 2
    before the plan is made (no untrained-model warning or progress bar for a run that cannot
    start). None configured: the run starts an embedded one."""
    url = configured_api_url()
    if url:
        try:
            check_answers(url, HEALTH_TIMEOUT_S)
        except OrchestratorError as exc:
            raise refused(exc) from None


def _parsed(data: dict[str, Any]) -> ShotSpec:
    try:
        return parse_spec(absolute_paths(data))
    except SpecError as exc:
        raise refused(exc) from None


def absolute_paths(data: dict[str, Any]) -> dict[str, Any]:
    """Local paths typed relative to here mean the same to the flow and to the catalog."""
    out = dict(data)
    for key in ("plate", "output_root", "checkpoint_root"):
        value = out.get(key)
        if isinstance(value, str) and value and split_scheme(value)[0] is None:
            out[key] = os.path.abspath(os.path.expanduser(value))
    if isinstance(out.get("checkpoints"), dict):
        out["checkpoints"] = {
            name: os.path.abspath(os.path.expanduser(path))
            for name, path in out["checkpoints"].items()
        }
    return out


def tile_size(tile: str | None) -> dict[str, int]:
    """The --tile option (WxH) as the tiling's fields (none without it); one line and exit 2
    when it is not WxH."""
    if not tile:
        return {}
    try:
        w, h = (int(v) for v in tile.lower().split("x"))
    except ValueError:
        raise fail(f"--tile must be WxH, e.g. 768x1024, got {tile!r}") from None
    return {"tile_width": w, "tile_height": h}


def pass_files(values: list[str]) -> dict[str, str]:
    """`--checkpoint PASS=FILE` options as {pass: file}; a malformed one is refused."""
    files: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise fail(
                f"--checkpoint {value!r}: expected PASS=FILE, e.g. depth=ckpt/depth.safetensors"
            )
        if name.strip() in files:
            raise fail(f"--checkpoint: two files for the {name.strip()} pass")
        files[name.strip()] = path.strip()
    return files


def _plan(spec: ShotSpec, settings: Settings, inputs: ShotInputs) -> ShotPlan:
    from flows.planning import plan_shot

    return plan_shot(spec, settings, inputs)


def _follow_or_refuse(job: dict[str, Any], spec: ShotSpec, catalog: Catalog, as_json: bool) -> int:
    """The same spec already runs: follow that job to its end rather than compute every frame
    twice. Another spec on the same outputs: refuse, naming the job."""
    job_id = int(job["id"])
    if not same_work(job.get("spec") or {}, spec.model_dump(mode="json")):
        raise fail(
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
        print_json(final)
    else:
        show_jobs([final], as_json=False)
    if final["status"] == "running":
        raise fail(f"job {job_id} stopped without finishing; submit again to finish it")
    return EXIT_CODES.get(final["status"], EXIT_FAILED)


def _follow(catalog: Catalog, job_id: int, output_root: str, quiet: bool) -> dict[str, Any]:
    """Follow the job (`flows.live_jobs.follow_job`) in a progress bar."""
    columns = [TextColumn("[bold]job {task.fields[job]}"), BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, console=err, disable=quiet) as bar:
        task = bar.add_task("", total=None, job=job_id)

        def update(job: dict[str, Any]) -> None:
            finished = job["frames_done"] + job["frames_failed"] + job["frames_skipped"]
            bar.update(task, total=job["frames_total"], completed=finished)

        return refusing(lambda: follow_job(catalog, job_id, output_root, update))


def _warn_before_run(plan: ShotPlan, spec: ShotSpec) -> None:
    if plan.untrained:
        err.print(untrained_warning(plan.untrained, plan.checkpoint_note), soft_wrap=True)
    elif spec.model_size == "auto":
        err.print(f"checkpoints: {escape(plan.checkpoint_note)}", highlight=False, soft_wrap=True)
    if plan.plate.colorspace_guessed:
        err.print(f"[yellow]{escape(plan.colour_note)}[/]", highlight=False, soft_wrap=True)


def in_folder(uri: str, folder: str) -> str:
    """`uri` relative to `folder` when it lies in it, else as it is."""
    prefix = folder.rstrip("/") + "/"
    return uri[len(prefix) :] if folder and uri.startswith(prefix) else uri


def untrained_warning(passes: list[str], why: str) -> Text:
    """The warning, said once, in bold, that `passes` run with random weights, and `why`
    (the checkpoint choice's reason: no root, an empty one, untrained files)."""
    return Text(
        f"UNTRAINED MODELS: {', '.join(passes)} run with random weights ({why}). The outputs "
        "prove the pipeline; they are not real passes. Put real checkpoints under "
        "SVFX_CHECKPOINT_ROOT or give --checkpoint-root.",
        style="bold yellow",
    )


def _run_flow(
    spec: dict[str, Any], dask_address: str | None, settings: Settings, quiet: bool
) -> dict[str, Any]:
    """Run the process-shot flow here (`flows.submission.run_shot_here`) in a progress bar."""
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

        try:
            return run_shot_here(spec, dask_address, settings, update)
        except OrchestratorError as exc:
            raise refused(exc) from None


def run_here(
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


def _print_result(result: dict[str, Any]) -> None:
    colour = {"complete": "green", "partial": "yellow"}.get(result["status"], "red")
    folder = str(result.get("output_root") or "")
    rows = [
        ("frames", str(result["total"])),
        ("done now", str(len(result["done"]))),
        ("already done", str(len(result["skipped"]))),
    ]
    if result.get("adopted"):
        rows.append(("found on disk", str(len(result["adopted"]))))
    rows.append(("failed", str(len(result["failed"]))))
    paths = [("EXR", result["exr_pattern"]), ("Zarr", result["zarr"])]
    paths += [
        (name.replace("_", " "), str(uri))
        for name, uri in result.get("extras", {}).items()
        if name != "not_stabilised"  # a reason, printed under the table
    ]
    rows += [(name, in_folder(uri, folder)) for name, uri in paths]
    rows += [
        (f"flickers: {n}", ", ".join(map(str, f))) for n, f in result.get("flagged", {}).items()
    ]
    tiles = result.get("tiles") or {}
    if tiles.get("skipped"):  # the person gate left some out
        rows.append(("tiles run / skipped", f"{tiles.get('run', 0)} / {tiles['skipped']}"))
    summary = Table(title=f"job {result['job_id']}: [{colour}]{result['status']}[/]")
    summary.add_column("")
    add_column(summary, "", [in_folder(uri, folder) for _name, uri in paths])
    for name, value in rows:
        summary.add_row(escape(name), escape(value))
    if folder:  # once, whole: the paths below are relative to it
        console.print(f"outputs in {escape(folder)}", highlight=False, soft_wrap=True)
    console.print(summary)
    for frame, why in sorted(result["failed"].items(), key=lambda kv: int(kv[0])):
        err.print(f"[red]frame {frame}[/]: {escape(why)}", highlight=False, soft_wrap=True)
    for note, frames in result.get("notes", {}).items():
        span = str(fileseq.FrameSet(sorted(frames)))
        console.print(f"frames {span}: {escape(note)}", highlight=False, soft_wrap=True)
    if result.get("error"):
        err.print(f"[bold red]error:[/] {escape(result['error'])}", highlight=False, soft_wrap=True)
    if result.get("untrained"):
        err.print(f"[bold yellow]UNTRAINED weights for {', '.join(result['untrained'])}[/]")
    for precision, workers in result.get("precisions", {}).items():
        who = f"{len(workers)} worker{'s' if len(workers) != 1 else ''}"
        console.print(f"precision on {who}: {escape(precision)}", highlight=False, soft_wrap=True)
    if result.get("extras", {}).get("not_stabilised"):
        why = result["extras"]["not_stabilised"]
        err.print(f"[yellow]not stabilised:[/] {escape(why)}", highlight=False, soft_wrap=True)


# -- status ----------------------------------------------------------------------------------
def status(
    job: Annotated[int | None, typer.Argument(help="job id (default: recent jobs)")] = None,
    limit: int = 20,
    as_json: JsonOpt = False,
) -> None:
    """A job's status, its failed frames and the frames temporal QC flags, or the most recent
    jobs."""

    rows = read_jobs(job_id=job, limit=limit)
    if job is not None and not rows:
        raise fail(f"no job {job} in the catalog")
    show_jobs(rows, as_json)
