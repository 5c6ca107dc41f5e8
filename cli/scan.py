"""`svfx scan`: find plate sequences under S3 prefixes and submit what is new or changed.
The scan itself is `flows.scan`; here are the report, the prompt and the exit code."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from core.errors import SvfxError
from flows.orchestrator import configured_api_url, prefect_api
from flows.scan import ScanDefaults, ScanReport, report_lines, scan_with_catalog
from flows.submission import DeploymentSubmitter, InlineSubmitter, Submitter
from schemas.settings import Settings

from .console import (
    JsonOpt,
    console,
    err,
    exit_code,
    fail,
    get_settings,
    interactive,
    print_json,
    refused,
)
from .spec_options import DEFAULT_PASSES, SPEC_DEFAULTS, ColourOpt, spec_help
from .submit import ClusterOpt, require_cluster, run_here

TemplateOpt = Annotated[
    str | None,
    typer.Option(help="naming template, e.g. {show}/{seq}/{shot}/plates/{plate}/{name}.####.exr"),
]
ScanPassesOpt = Annotated[
    str | None,
    typer.Option(help=f"comma-separated (default SVFX_SCAN_PASSES, else {DEFAULT_PASSES})"),
]
ScanModelSizeOpt = Annotated[
    str | None, typer.Option(help=f"{spec_help('model_size')} (default SVFX_SCAN_MODEL_SIZE)")
]
ScanOutputOpt = Annotated[str | None, typer.Option(help="output root, e.g. s3://bucket/out")]
ScanExrLayoutOpt = Annotated[
    str | None,
    typer.Option(
        help=f"{spec_help('exr_layout')} (default SVFX_SCAN_EXR_LAYOUT, else "
        f"{SPEC_DEFAULTS['exr_layout']})"
    ),
]
ScanTilesOpt = Annotated[
    str | None,
    typer.Option(
        help=f"{spec_help('tiles')} (default SVFX_SCAN_TILES, else {SPEC_DEFAULTS['tiles']})"
    ),
]
SettleOpt = Annotated[
    float | None, typer.Option(help="seconds since an object's last write before use")
]
MaxInFlightOpt = Annotated[int | None, typer.Option(help="shots running at once")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="only print what it would submit")]
QueueOpt = Annotated[
    bool, typer.Option("--queue", help="queue runs of the served process-shot deployment")
]


# -- scan ------------------------------------------------------------------------------------
def scan(
    prefixes: Annotated[list[str], typer.Argument(help="s3://BUCKET/PREFIX (one or more)")],
    template: TemplateOpt = None,
    passes: ScanPassesOpt = None,
    model_size: ScanModelSizeOpt = None,
    output: ScanOutputOpt = None,
    colorspace: ColourOpt = None,
    exr_layout: ScanExrLayoutOpt = None,
    tiles: ScanTilesOpt = None,
    settle: SettleOpt = None,
    max_in_flight: MaxInFlightOpt = None,
    dry_run: DryRunOpt = False,
    queue: QueueOpt = False,
    dask_address: ClusterOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Scan S3 prefixes once: new or changed plate sequences are processed (here, one shot
    after another; with --queue by the served deployment). Exit 2 when a prefix could not be
    listed, a sequence was refused or a shot failed."""
    settings = get_settings()
    interactive()
    if queue and not configured_api_url():
        raise fail(
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
        exr_layout=exr_layout or settings.scan_exr_layout,
        tiles=tiles or settings.scan_tiles,
        settle_seconds=settings.scan_settle_s if settle is None else settle,
        max_in_flight=max_in_flight or settings.scan_max_in_flight,
    )
    submitter = _submitter(settings, dask_address, queue=queue, dry_run=dry_run, as_json=as_json)
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
    except SvfxError as exc:  # a bad template, no orchestrator, a refused catalog, ...
        raise refused(exc) from None
    _show_report(report, reaped, as_json)
    results = getattr(submitter, "results", [])
    raise typer.Exit(exit_code(bool(report.errors or report.refused), results))


def _submitter(
    settings: Settings, dask_address: str | None, *, queue: bool, dry_run: bool, as_json: bool
) -> Submitter:
    """Who runs the shots found: the served deployment (--queue), or this process on the
    scheduler named, which must answer first unless nothing runs (--dry-run)."""

    def run_with_progress(spec: dict[str, Any], address: str | None) -> dict[str, Any]:
        return run_here(spec, address, settings, as_json)

    if not queue and not dry_run:  # shots run here: their scheduler must answer first
        require_cluster(dask_address, settings)
    if queue:
        return DeploymentSubmitter()
    return InlineSubmitter(dask_address or settings.dask_address, run=run_with_progress)


def _show_report(report: ScanReport, reaped: list[dict[str, Any]], as_json: bool) -> None:
    """The jobs closed as dead (their frames are submitted again), then the scan's report as
    JSON or lines, and its errors."""
    for job in reaped:
        err.print(
            f"[yellow]job {job['job_id']} closed as {job['status']}[/]: {escape(job['message'])}",
            highlight=False,
            soft_wrap=True,
        )
    if as_json:
        print_json(report.as_dict())
    else:
        for line in report_lines(report):
            console.print(escape(line), highlight=False, soft_wrap=True)
        for error in report.errors:
            err.print(f"[bold red]error:[/] {escape(error)}", highlight=False, soft_wrap=True)
