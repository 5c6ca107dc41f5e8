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
)
from .submit import run_submit

# Dask (cluster, worker), Prefect (serve), the web app and uvicorn (api) take
# seconds to import on a busy machine: each is imported inside the command that needs it, so
# the other commands start without them.


# -- cluster and workers ---------------------------------------------------------------------
def cluster(
    workers: Annotated[int, typer.Option(help="CPU worker processes (no GPUs)")] = 2,
    gpus: Annotated[int | None, typer.Option(help="GPUs to use (default: all visible)")] = None,
    dashboard: bool = True,
) -> None:
    """Start a local Dask cluster (one worker per GPU with GPU=1) and print its address and
    where its dashboard is."""
    from flows.cluster import local_dashboard_missing, start_local_cluster

    get_settings()
    # without bokeh the scheduler would open :8787 on every interface for /health alone
    missing = local_dashboard_missing() if dashboard else "--no-dashboard"
    local = start_local_cluster(workers, gpus=gpus, dashboard=missing is None)
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
    gpus: Annotated[str, typer.Option(help="auto, a count, or 0 for one CPU worker")] = "auto",
    nthreads: int = 1,
    memory_limit: str = "auto",
) -> None:
    """Start GPU workers for an existing scheduler: one process per GPU, each with GPU=1;
    prints where the scheduler's dashboard is."""
    from flows.workers import about_scheduler, run_workers, visible_gpus

    settings = get_settings()
    try:
        visible_gpus(gpus)  # a bad --gpus is refused before the scheduler is asked
        lines = about_scheduler(address, settings.dask_connect_timeout_s)
        for line in lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        code = run_workers(address, gpus, nthreads=nthreads, memory_limit=memory_limit)
    except ValueError as exc:  # --gpus asks for more GPUs than there are, or is not a count
        raise fail(str(exc)) from None
    raise typer.Exit(code)


# -- serve and api ---------------------------------------------------------------------------
def serve() -> None:
    """Serve the deployments: process-shot on demand and, when SVFX_SCAN_PREFIXES is set,
    scan-plates on SVFX_SCAN_CRON or every SVFX_SCAN_INTERVAL_S seconds."""
    settings = get_settings()
    from flows.orchestrator import OrchestratorError, served_api_url

    try:  # a server that is down: one line naming it, before Prefect's retries and traceback
        served_api_url()
    except OrchestratorError as exc:
        raise refused(exc) from None
    from prefect import serve as prefect_serve

    from flows.scheduled import deployments

    served = deployments(settings)
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
    """Write a sample shot (scikit-image's astronaut) and process it with every pass."""
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
