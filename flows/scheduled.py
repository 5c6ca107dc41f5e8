"""The scheduled side: the ``scan-plates`` flow and the deployments ``svfx serve`` serves.

``svfx serve`` runs ``process-shot`` (on demand: the scan, the catalog API and ``prefect
deployment run`` create its runs; at most ``scan_max_in_flight`` run at once),
``scan-plates`` on ``scan_cron`` or every ``scan_interval_s`` seconds over ``scan_prefixes``
and, only when ``prune_interval_s`` is set, ``prune-versions`` (`flows.prune`).
``infra/prefect/prefect.yaml`` declares the first two deployments for a work pool.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from schemas.settings import Settings, load_settings
from schemas.spec import ShotSpec

from .process_shot import process_shot
from .prune import prune_deployment
from .scan import ScanDefaults, report_lines, scan_with_catalog
from .submission import PROCESS_SHOT_DEPLOYMENT, DeploymentSubmitter

SCAN_DEPLOYMENT = "scan-plates"


@flow(name="scan-plates", log_prints=True)
def scan_plates(
    prefixes: list[str],
    template: str,
    passes: list[str] | None = None,
    model_size: str = ShotSpec.model_fields["model_size"].default,
    exr_layout: str = ShotSpec.model_fields["exr_layout"].default,
    tiles: str = ShotSpec.model_fields["tiles"].default,
    output_root: str | None = None,
    colorspace: str | None = None,
    settle_s: float = 120.0,
    max_in_flight: int = 4,
    dry_run: bool = False,
) -> dict[str, Any]:
    """List the prefixes, compare with the catalog and queue ``process-shot`` runs for new and
    changed plate sequences. Returns the scan report."""
    logger = get_run_logger()
    report, reaped = scan_with_catalog(
        prefixes,
        template,
        settings=load_settings(),
        submitter=DeploymentSubmitter(PROCESS_SHOT_DEPLOYMENT),
        defaults=ScanDefaults(
            passes=tuple(passes) if passes else None,
            model_size=model_size,
            exr_layout=exr_layout,
            tiles=tiles,
            output_root=output_root,
            colorspace=colorspace,
            settle_seconds=settle_s,
            max_in_flight=max_in_flight,
        ),
        dry_run=dry_run,
    )
    for job in reaped:
        logger.warning("job %s closed as %s: %s", *job.values())
    lines = report_lines(report)
    for line in lines:
        logger.info(line)
    for error in report.errors:
        logger.error(error)
    create_markdown_artifact(key="svfx-scan-report", markdown="\n".join(lines), description="scan")
    return report.as_dict()


def deployments(settings: Settings) -> list[Any]:
    """The deployments ``svfx serve`` serves: process-shot, the scan only when prefixes are
    configured, the prune only when its interval is (a prune with no rule: PruneRefused)."""
    shot = process_shot.to_deployment(
        name="process-shot",
        tags=["svfx"],
        concurrency_limit=settings.scan_max_in_flight,
        description="Sapiens2 passes for one shot (a ShotSpec as the 'spec' parameter)",
    )
    scheduled = [scan_deployment(settings), prune_deployment(settings)]
    return [shot, *(d for d in scheduled if d is not None)]


def scan_deployment(settings: Settings) -> Any | None:
    """``scan-plates`` on ``scan_cron`` or every ``scan_interval_s`` seconds, or None when no
    prefixes are configured."""
    if not settings.scan_prefixes:
        return None
    schedule: dict[str, Any] = (
        {"cron": settings.scan_cron}
        if settings.scan_cron
        else {"interval": settings.scan_interval_s}
    )
    return scan_plates.to_deployment(
        name=SCAN_DEPLOYMENT,
        tags=["svfx", "scheduled"],
        concurrency_limit=1,  # never two scans at once
        parameters={
            "prefixes": list(settings.scan_prefixes),
            "template": settings.scan_template,
            "passes": list(settings.scan_passes) or None,
            "model_size": settings.scan_model_size,
            "exr_layout": settings.scan_exr_layout,
            "tiles": settings.scan_tiles,
            "output_root": settings.output_root,
            "settle_s": settings.scan_settle_s,
            "max_in_flight": settings.scan_max_in_flight,
        },
        **schedule,
    )
