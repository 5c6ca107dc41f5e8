"""`svfx scan`: find plate sequences under S3 prefixes and submit what is new or changed.
The scan itself is `flows.scan`; here are the report, the prompt and the exit code."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from core.errors import SvfxError
from flows.orchestrator import configured_api_url, prefect_api
from flows.scan import ScanDefaults, report_lines, scan_with_catalog
from flows.submission import DeploymentSubmitter, InlineSubmitter, Submitter

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


# -- scan ------------------------------------------------------------------------------------
def scan(
    prefixes: Annotated[list[str], typer.Argument(help="s3://BUCKET/PREFIX (one or more)")],
    template: Annotated[
        str | None,
        typer.Option(
            help="naming template, e.g. {show}/{seq}/{shot}/plates/{plate}/{name}.####.exr"
        ),
    ] = None,
    passes: Annotated[
        str | None,
        typer.Option(help=f"comma-separated (default SVFX_SCAN_PASSES, else {DEFAULT_PASSES})"),
    ] = None,
    model_size: Annotated[
        str | None,
        typer.Option(help=f"{spec_help('model_size')} (default SVFX_SCAN_MODEL_SIZE)"),
    ] = None,
    output: Annotated[str | None, typer.Option(help="output root, e.g. s3://bucket/out")] = None,
    colorspace: ColourOpt = None,
    exr_layout: Annotated[
        str | None,
        typer.Option(
            help=f"{spec_help('exr_layout')} (default SVFX_SCAN_EXR_LAYOUT, else "
            f"{SPEC_DEFAULTS['exr_layout']})"
        ),
    ] = None,
    tiles: Annotated[
        str | None,
        typer.Option(
            help=f"{spec_help('tiles')} (default SVFX_SCAN_TILES, else {SPEC_DEFAULTS['tiles']})"
        ),
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

    def run_with_progress(spec: dict[str, Any], address: str | None) -> dict[str, Any]:
        return run_here(spec, address, settings, as_json)

    if not queue and not dry_run:  # shots run here: their scheduler must answer first
        require_cluster(dask_address, settings)
    submitter: Submitter = (
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
    except SvfxError as exc:  # a bad template, no orchestrator, a refused catalog, ...
        raise refused(exc) from None
    for job in reaped:  # jobs whose flow died: their frames are submitted again
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
    results = getattr(submitter, "results", [])
    raise typer.Exit(exit_code(bool(report.errors or report.refused), results))
