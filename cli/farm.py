"""`svfx farm`: running shots from a farm manager. ``openjd`` writes an Open Job Description
template (AWS Deadline Cloud) that runs a shot on our Dask workers across farm nodes
(`cli.openjd_template`); ``run`` is what its shot step runs: a spec file on a given
scheduler. The Slurm recipe lives in infra/slurm."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from schemas.spec import ShotSpec, parse_spec

from .console import console, fail, get_settings, refusing
from .openjd_template import GPUS_PER_WORKER, job_template, template_yaml
from .spec_options import (
    DEFAULT_PASSES,
    SPEC_DEFAULTS,
    CheckpointRootOpt,
    ColourOpt,
    FamilyOpt,
    FramesOpt,
    ModelSizeOpt,
    OutputOpt,
    PassesOpt,
    VersionOpt,
    shot_names,
)

farm_app = typer.Typer(
    help="Run shots from a farm manager (OpenJD / Deadline Cloud; Slurm: infra/slurm).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


TemplateOpt = Annotated[
    Path, typer.Option("--template", "-o", help="where to write the template (YAML)")
]
WorkersOpt = Annotated[int, typer.Option(min=1, max=256, help="worker tasks")]
GpusPerWorkerOpt = Annotated[
    str, typer.Option(help="GPU processes per worker task: auto, 1, 2, 4, 8; 0 = CPU")
]
PythonOpt = Annotated[
    str | None,
    typer.Option(help="a shared venv's Python, same path on every node (default: this one)"),
]
SchedulerFileOpt = Annotated[
    str | None,
    typer.Option(help="where the shot's scheduler writes its address, on shared storage"),
]


@farm_app.command("openjd")
def openjd(
    pattern: Annotated[str, typer.Argument(help="plate.####.exr (as the farm nodes see it)")],
    shot: Annotated[str, typer.Option(help="SHOW/SEQ/SHOT")],
    template: TemplateOpt,
    frames: FramesOpt = None,
    colorspace: ColourOpt = None,
    passes: PassesOpt = DEFAULT_PASSES,
    family: FamilyOpt = SPEC_DEFAULTS["family"],
    model_size: ModelSizeOpt = SPEC_DEFAULTS["model_size"],
    checkpoint_root: CheckpointRootOpt = None,
    output: OutputOpt = None,
    version: VersionOpt = SPEC_DEFAULTS["version"],
    workers: WorkersOpt = 2,
    gpus_per_worker: GpusPerWorkerOpt = "1",
    python: PythonOpt = None,
    scheduler_file: SchedulerFileOpt = None,
) -> None:
    """Write an Open Job Description template that runs the shot on Dask workers across farm
    nodes: a Shot step (the scheduler and the run) and a Workers step (svfx worker tasks).
    Check it with `openjd check`, run it with `openjd run` or submit it to Deadline Cloud."""
    settings = get_settings()
    parts = shot_names(shot)
    if gpus_per_worker not in GPUS_PER_WORKER:
        raise fail(f"--gpus-per-worker takes auto, 0, 1, 2, 4 or 8, not {gpus_per_worker!r}")
    data: dict[str, Any] = {
        "plate": pattern,
        "show": parts[0],
        "sequence": parts[1],
        "shot": parts[2],
        "frames": frames,
        "colorspace": colorspace,
        "passes": passes,
        "family": family,
        "model_size": model_size,
        "checkpoint_root": checkpoint_root,
        "output_root": output,
        "version": version,
    }
    spec = refusing(lambda: parse_spec(data))
    where = scheduler_file or _scheduler_file(settings.home, spec)
    document = job_template(
        spec.model_dump(mode="json"),
        python=python or sys.executable,
        scheduler_file=where,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
    )
    _write_template(template, document, workers)


def _scheduler_file(home: Path, spec: ShotSpec) -> str:
    """Where the shot's scheduler writes its address when --scheduler-file is not given."""
    return str(home / "farm" / f"{spec.show}_{spec.sequence}_{spec.shot}_{spec.version}.json")


def _write_template(template: Path, document: dict[str, Any], workers: int) -> None:
    """Write the template as YAML and say how to check it."""
    template.parent.mkdir(parents=True, exist_ok=True)
    template.write_text(template_yaml(document))
    plain: dict[str, Any] = {"markup": False, "highlight": False, "soft_wrap": True}
    console.print(f"wrote {template}: steps Shot and Workers ({workers} tasks)", **plain)
    console.print(f"openjd check {template}", **plain)


@farm_app.command("run")
def run(
    spec_file: Annotated[Path, typer.Argument(help="a shot spec (JSON), as the template embeds")],
    cluster: Annotated[str, typer.Option(help="the Dask scheduler's address")],
) -> None:
    """Run one shot spec on the scheduler given (the OpenJD template's Shot step)."""
    from .submit import run_submit

    settings = get_settings()
    try:
        data = json.loads(spec_file.read_text())
    except (OSError, ValueError) as exc:
        raise fail(f"{spec_file}: not a readable spec ({exc})") from None
    raise typer.Exit(run_submit(data, settings, dask_address=cluster))
