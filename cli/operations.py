"""Running the platform: `svfx cluster` and `svfx worker` (Dask), `svfx serve` (the Prefect
deployments), `svfx api` (the catalog's web API and pages) and `svfx demo` (a sample shot).
`svfx models` lives in `cli/models.py`."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from flows.demo import DEMO_COLORSPACE, DEMO_FIRST_FRAME, write_demo_plate

from .console import (
    console,
    err,
    fail,
    get_settings,
    interactive,
    refused,
    refusing,
)
from .submit import run_submit

# Dask (cluster, worker), Prefect (serve), the web app and uvicorn (api) take
# seconds to import on a busy machine: each is imported inside the command that needs it, so
# the other commands start without them.


# -- cluster and workers ---------------------------------------------------------------------
def cluster(
    workers: Annotated[
        int | None,
        typer.Option(help="CPU worker processes (no GPUs); default: the node's plan"),
    ] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs to use (default: all visible)")] = None,
    dashboard: bool = True,
) -> None:
    """Start a local Dask cluster (one worker per GPU with GPU=1, else the node's CPU workers)
    and print its address, where its dashboard is and, for CPU workers, their threads."""
    from flows.cluster import local_dashboard_missing, local_gpu_count, start_local_cluster
    from tasks.node_threads import node_plan

    get_settings()
    gpus = local_gpu_count() if gpus is None else gpus
    plan = None if gpus else refusing(lambda: node_plan(workers=workers))
    if plan is not None:
        console.print(plan.describe(), markup=False, highlight=False, soft_wrap=True)
    # without bokeh the scheduler would open :8787 on every interface for /health alone
    missing = local_dashboard_missing() if dashboard else "--no-dashboard"
    local = start_local_cluster(workers, gpus=gpus, dashboard=missing is None, plan=plan)
    console.print(f"scheduler: [bold]{local.scheduler_address}[/]")
    plain: dict[str, Any] = {"markup": False, "highlight": False, "soft_wrap": True}
    console.print(f"export SVFX_DASK_ADDRESS={local.scheduler_address}", **plain)
    console.print(f"svfx submit --cluster {local.scheduler_address} ...", **plain)
    if missing is None:
        console.print(f"dashboard: {local.dashboard_link}", **plain)
    else:
        console.print(f"no dashboard ({missing})", **plain)
    console.print("Ctrl-C to stop.")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        local.close()


def worker(
    address: Annotated[str, typer.Argument(help="scheduler address, e.g. tcp://host:8786")],
    gpus: Annotated[str, typer.Option(help="auto, a count, or 0 for CPU workers")] = "auto",
    nthreads: Annotated[
        int,
        typer.Option(help="Dask threads (chunks at once) per worker; a GPU worker runs at least 2"),
    ] = 1,
    memory_limit: Annotated[
        str, typer.Option(help="per worker; auto: the node's memory split among them")
    ] = "auto",
    workers: Annotated[
        int | None,
        typer.Option(help="CPU worker processes (--gpus 0); default: SVFX_CPU_WORKERS, the rule"),
    ] = None,
    torch_threads: Annotated[
        int | None,
        typer.Option(help="torch threads per CPU worker; default: SVFX_TORCH_THREADS, the rule"),
    ] = None,
    exr_threads: Annotated[
        int | None,
        typer.Option(help="OpenEXR threads per CPU worker; default: SVFX_EXR_THREADS, the rule"),
    ] = None,
) -> None:
    """Start workers for an existing scheduler: one process per GPU, each with GPU=1, or with
    --gpus 0 the node's CPU workers, whose plan (workers, torch threads, the cores left for
    reading and encoding, from the node's or Slurm's cores) it prints; prints where the
    scheduler's dashboard is. Threads above the node's cores are refused (exit 2)."""
    from flows.workers import about_scheduler, run_workers, visible_gpus
    from tasks.node_threads import node_plan

    settings = get_settings()
    try:
        # a bad --gpus or thread count is refused before the scheduler is asked
        devices = visible_gpus(gpus)
        cpu_options = (workers, torch_threads, exr_threads)
        if devices and any(option is not None for option in cpu_options):
            raise ValueError(
                "--workers, --torch-threads and --exr-threads are for CPU workers (--gpus 0); "
                "GPU workers are one per GPU"
            )
        plan = None
        if not devices:
            plan = refusing(
                lambda: node_plan(
                    workers=workers, torch_threads=torch_threads, exr_threads=exr_threads
                )
            )
            console.print(plan.describe(), markup=False, highlight=False, soft_wrap=True)
        lines = about_scheduler(address, settings.dask_connect_timeout_s)
        for line in lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        code = run_workers(address, gpus, plan=plan, nthreads=nthreads, memory_limit=memory_limit)
    except ValueError as exc:  # --gpus asks for more GPUs than there are, or is not a count
        raise fail(str(exc)) from None
    raise typer.Exit(code)


# -- serve and api ---------------------------------------------------------------------------
def serve() -> None:
    """Serve the deployments: process-shot on demand, when SVFX_SCAN_PREFIXES is set
    scan-plates on SVFX_SCAN_CRON or every SVFX_SCAN_INTERVAL_S seconds, and when
    SVFX_PRUNE_INTERVAL_S is set prune-versions (svfx prune --yes with SVFX_PRUNE_KEEP,
    SVFX_PRUNE_OLDER_THAN, SVFX_PRUNE_INVALIDATED) every that many seconds."""
    settings = get_settings()
    from flows.orchestrator import OrchestratorError, served_api_url

    try:  # a server that is down: one line naming it, before Prefect's retries and traceback
        served_api_url()
    except OrchestratorError as exc:
        raise refused(exc) from None
    from prefect import serve as prefect_serve

    from flows.scheduled import deployments

    served = refusing(lambda: deployments(settings))
    if not settings.scan_prefixes:
        err.print("[yellow]no SVFX_SCAN_PREFIXES: serving process-shot only, no scheduled scan[/]")
    prefect_serve(*served)


def api(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes")] = 1,
) -> None:
    """Serve the catalog: JSON API under /api (its OpenAPI description at /openapi.json) and
    web pages at /."""
    from api.app import run_api

    if workers == 1:  # the one-process call keeps run_api's three-argument form
        run_api(host, port, get_settings())
    else:
        run_api(host, port, get_settings(), workers=workers)


# -- demo ------------------------------------------------------------------------------------
def demo(
    frames: int = 24,
    size: Annotated[str, typer.Option(help="WxH of the sample plate")] = "640x360",
    output: Annotated[str | None, typer.Option(help="output root")] = None,
    model_size: str = "auto",
    checkpoint_root: str | None = None,
) -> None:
    """Write a sample shot (an astronaut's portrait) and process it with every pass."""
    settings = get_settings()
    interactive()
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
