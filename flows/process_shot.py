"""The Prefect flow: one shot from plate to catalogued passes.

Prefect orchestrates and Dask computes (stack-notes.md, "Recommended architecture choices"):
the flow plans in its own process, then submits one raw Dask task per chunk of frames
(aligned with the Zarr shards) with a share of the ``GPU`` resource where GPU workers exist
(`flows.cluster.chunk_dispatch_shape`), in a bounded window, and records each chunk's summary
in the catalog as it lands. There is no Prefect task per chunk: through DaskTaskRunner each
costs far more than a Dask future and turns a killed worker into a failed flow
(prefect#12968, #15442; docs/design/orchestration.md); raw Dask futures are rescheduled by
Dask and released once recorded, so finished chunks are never recomputed.
"""

from __future__ import annotations

import os
from typing import Any

from core.errors import SvfxError

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.runtime import flow_run

from schemas.catalog import open_catalog
from schemas.catalog.errors import JobConflict
from schemas.catalog.writer import Catalog
from schemas.settings import Settings, load_settings
from schemas.spec import ShotSpec, parse_spec

from .cluster import dask_client
from .planning import plan_shot
from .progress import Progress, listening
from .refusals import refusal
from .shot_plan import ShotPlan
from .shot_result import ShotResult
from .shot_runner import run_planned_shot
from .stabilise import stabilised_spec


@task(name="plan-shot", cache_policy=None)
def plan_task(spec: ShotSpec, settings: Settings) -> ShotPlan | str:
    """The plan, or why the input is refused (returned, not raised: a refusal is the user's
    to fix, and needs no traceback in the logs)."""
    try:
        plan = plan_shot(spec, settings)
    except SvfxError as exc:
        return str(exc)
    logger = get_run_logger()
    logger.info(
        "%s: %d frames (%d missing), %dx%d, %s",
        spec.shot_path,
        len(plan.sequence.frames),
        len(plan.sequence.holes),
        plan.plate.width,
        plan.plate.height,
        plan.colour_note,
    )
    if plan.untrained:
        logger.warning(
            "UNTRAINED models (random weights) for %s: the outputs show the pipeline works, "
            "they are not meaningful passes. Set SVFX_CHECKPOINT_ROOT for real ones.",
            ", ".join(plan.untrained),
        )
    return plan


@flow(name="process-shot", log_prints=True, validate_parameters=False)
def process_shot(spec: dict[str, Any], dask_address: str | None = None) -> dict[str, Any]:
    """Process one shot (a ShotSpec as a dict); returns the result summary.

    The run ends `complete`, `partial` (the failed frames are listed with their reasons) or
    `failed`; the status is in the result, the catalog and the flow's artifacts. Input the
    user must fix (a refused spec, a damaged catalog, a live job on the same outputs) ends
    `failed` with the reason in ``error`` (and the other job in ``conflict``), no traceback.
    """
    logger = get_run_logger()
    settings = load_settings()
    os.environ.setdefault("SVFX_HOME", str(settings.home))  # checkpoint caches live there
    try:
        shot_spec = parse_spec(spec)
        plan = plan_task(shot_spec, settings)
        if isinstance(plan, str):
            raise _Refused(plan)
        result = _run(shot_spec, plan, settings, dask_address)
    except _Refused as exc:
        logger.error("refused: %s", exc)
        return refusal(str(exc))
    except JobConflict as exc:
        logger.error("%s", exc)
        return refusal(str(exc), conflict=exc.job)
    except SvfxError as exc:
        logger.error("%s", exc)
        return refusal(str(exc))
    return result.as_dict()


class _Refused(Exception):
    pass


def _run(
    shot_spec: ShotSpec, plan: ShotPlan, settings: Settings, dask_address: str | None
) -> ShotResult:
    logger = get_run_logger()
    catalog = open_catalog(settings.catalog, retry_s=settings.catalog_retry_s)
    progress_id = create_progress_artifact(
        progress=0.0, key=_key("progress", shot_spec), description="frames finished"
    )

    def on_progress(p: Progress) -> None:
        if p.stage == "frames" and p.total:
            finished = p.done + p.failed + p.skipped
            update_progress_artifact(progress_id, progress=100.0 * finished / p.total)
            logger.info("%d/%d frames (%d failed)", finished, p.total, p.failed)

    with listening(on_progress), dask_client(settings, dask_address) as client:
        result = run_planned_shot(plan, catalog, client, flow_run_id=_flow_run_id())
        _report(shot_spec, result)
        if shot_spec.stabilises_after:
            stable = _stabilise(shot_spec, result, catalog, settings, client)
            if stable is not None:
                stable.extras["per_frame_job"] = str(result.job_id)
                return stable
    return result


def _report(spec: ShotSpec, result: ShotResult) -> None:
    logger = get_run_logger()
    _publish(spec, result)
    if result.status == "failed":
        logger.error("shot failed: no frame could be processed")
    elif result.status == "partial":
        logger.warning("shot partial: %d frames failed", len(result.failed))


def _stabilise(
    spec: ShotSpec, per_frame: ShotResult, catalog: Catalog, settings: Settings, client: Any
) -> ShotResult | None:
    """--temporal stabilize: the stabilised version of the per-frame one just run, on the
    same cluster (`flows.stabilise`); None, with the reason logged and in the per-frame
    result, when it cannot be made (the per-frame version stands)."""
    logger = get_run_logger()
    try:
        stable_spec = stabilised_spec(
            catalog,
            settings,
            spec.shot_path,
            spec.version,
            element=spec.element,
            radius=spec.temporal_radius,
        )
        plan = plan_task(stable_spec, settings)
        if isinstance(plan, str):
            raise _Refused(plan)
    except (SvfxError, _Refused) as exc:
        logger.warning("not stabilised: %s", exc)
        per_frame.extras["not_stabilised"] = str(exc)
        return None
    logger.info("stabilising %s %s into %s", spec.shot_path, spec.version, stable_spec.version)
    result = run_planned_shot(plan, catalog, client, flow_run_id=_flow_run_id())
    _report(stable_spec, result)
    return result


def _flow_run_id() -> str | None:
    try:
        return str(flow_run.id) if flow_run.id else None
    except Exception:
        return None


def _key(kind: str, spec: ShotSpec) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    raw = f"svfx-{kind}-{spec.show}-{spec.sequence}-{spec.shot}".lower()
    return "".join(c if c.isalnum() else "-" for c in raw)


def _publish(spec: ShotSpec, result: ShotResult) -> None:
    rows = [{"frame": f, "status": "done", "error": ""} for f in result.done]
    rows += [{"frame": f, "status": "already done", "error": ""} for f in result.skipped]
    rows += [{"frame": f, "status": "found on disk", "error": ""} for f in result.adopted]
    rows += [{"frame": f, "status": "failed", "error": why} for f, why in result.failed.items()]
    rows.sort(key=lambda r: int(r["frame"]))
    create_table_artifact(
        key=_key("frames", spec),
        table=rows[:2000],
        description=f"{spec.shot_path}: frames and their status; passes {', '.join(spec.passes)}",
    )
    lines = [
        f"# {spec.shot_path}: {result.status}",
        "",
        f"job {result.job_id}; {len(result.done)} done, {len(result.skipped)} already done, "
        f"{len(result.adopted)} found on disk, {len(result.failed)} failed of {result.total} "
        "frames",
        "",
        f"- EXR: `{result.exr_pattern}`",
        f"- Zarr: `{result.zarr}`",
    ]
    lines += [f"- {name.replace('_', ' ')}: `{uri}`" for name, uri in result.extras.items()]
    if result.untrained:
        lines += ["", f"**UNTRAINED models for {', '.join(result.untrained)}: not real passes.**"]
    if result.flagged:
        lines += ["", "## Temporal QC: flagged frames (flicker above the threshold)", ""]
        lines += [
            f"- {name}: {', '.join(map(str, frames))}" for name, frames in result.flagged.items()
        ]
    if result.failed:
        lines += ["", "## Failed frames", ""]
        lines += [f"- {f}: {why}" for f, why in sorted(result.failed.items())[:200]]
    create_markdown_artifact(
        key=_key("summary", spec), markdown="\n".join(lines), description="shot summary"
    )
