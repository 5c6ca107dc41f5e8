"""Running the platform: `svfx cluster` and `svfx worker` (Dask), `svfx serve` (the Prefect
deployments), `svfx api` (the catalog's web API and pages), `svfx demo` (a sample shot) and
`svfx models` (the checkpoints under the checkpoint root, verified)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.demo import DEMO_COLORSPACE, DEMO_FIRST_FRAME, write_demo_plate

from .console import (
    EXIT_FAILED,
    EXIT_OK,
    JsonOpt,
    console,
    err,
    fail,
    get_settings,
    interactive,
    print_json,
    table,
)
from .submit import run_submit

# Dask (cluster, worker), Prefect (serve), torch (models), the web app and uvicorn (api) take
# seconds to import on a busy machine: each is imported inside the command that needs it, so
# the other commands start without them.


# -- models ----------------------------------------------------------------------------------
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
    from tasks.checkpoint_verify import verify_checkpoint_once
    from tasks.checkpoints import CheckpointError, scan_checkpoints

    settings = get_settings()
    root = checkpoint_root or settings.checkpoint_root
    if not root:
        raise fail("no checkpoint root: pass --checkpoint-root or set SVFX_CHECKPOINT_ROOT")
    if not Path(root).is_dir():
        raise fail(f"checkpoint root {root} is not a directory")
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
        print_json(rows)
    elif not rows:
        console.print(f"no *.safetensors under {root}")
    else:
        table(rows, ["path", "arch", "task", "size", "sha256", "status"])
    raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


# -- cluster and workers ---------------------------------------------------------------------
def cluster(
    workers: Annotated[int, typer.Option(help="CPU worker processes (no GPUs)")] = 2,
    gpus: Annotated[int | None, typer.Option(help="GPUs to use (default: all visible)")] = None,
    dashboard: bool = True,
) -> None:
    """Start a local Dask cluster (one worker per GPU with GPU=1) and print its address."""
    from flows.cluster import start_local_cluster

    get_settings()
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


def worker(
    address: Annotated[str, typer.Argument(help="scheduler address, e.g. tcp://host:8786")],
    gpus: Annotated[str, typer.Option(help="auto, a count, or 0 for one CPU worker")] = "auto",
    nthreads: int = 1,
    memory_limit: str = "auto",
) -> None:
    """Start GPU workers for an existing scheduler: one process per GPU, each with GPU=1."""
    from flows.workers import run_workers

    get_settings()
    try:
        code = run_workers(address, gpus, nthreads=nthreads, memory_limit=memory_limit)
    except ValueError as exc:  # --gpus asks for more GPUs than there are, or is not a count
        raise fail(str(exc)) from None
    raise typer.Exit(code)


# -- serve and api ---------------------------------------------------------------------------
def serve() -> None:
    """Serve the deployments: process-shot on demand and, when SVFX_SCAN_PREFIXES is set,
    scan-plates on SVFX_SCAN_CRON or every SVFX_SCAN_INTERVAL_S seconds."""
    settings = get_settings()
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
