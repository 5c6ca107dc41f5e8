"""Running one planned shot on a Dask cluster: dispatch chunks in a bounded window, record
each chunk's summary in the catalog as it lands, then the shot-level files.

Plain functions with no Prefect in them, so the Prefect flow (`flows.process_shot`), the
benchmark and tests share one code path; the flow adds its logging and artifacts on top.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from distributed import Client, as_completed

from schemas.summaries import ChunkSummary, FrameSummary
from tasks.chunk_worker import ChunkJob, process_chunk
from tasks.finalize import FinalizeJob, finalize_shot

from .cluster import gpu_slots, worker_count
from .planning import ShotPlan, create_store, decide_work, store_provenance
from .progress import Progress, emit

log = logging.getLogger("svfx.flow")


@dataclass
class ShotResult:
    job_id: int
    status: str  # complete, partial, failed
    total: int
    done: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    output_root: str = ""
    exr_pattern: str = ""
    zarr: str = ""
    extras: dict[str, str] = field(default_factory=dict)  # contact sheets, clips, pose json
    untrained: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    model_s: float = 0.0
    chunk_wall_s: float = 0.0
    peak_worker_rss_mb: float = 0.0
    chunks: int = 0

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def run_planned_shot(
    plan: ShotPlan,
    catalog: Any,
    client: Client,
    *,
    flow_run_id: str | None = None,
    window: int = 0,
    on_chunk: Callable[[ChunkSummary], None] | None = None,
) -> ShotResult:
    start = time.perf_counter()
    uris = {f: plan.sequence.uri_for(f) for f in plan.sequence.frames}
    job_id = catalog.register_job(plan.spec, plan.plate, flow_run_id, uris=uris)
    provenance = store_provenance(plan, job_id, flow_run_id)
    decide_work(plan, catalog)
    if create_store(plan, provenance):
        plan.todo, plan.skipped = sorted(plan.todo + plan.skipped), []
    if plan.skipped:
        catalog.record_skipped(job_id, plan.skipped)
    result = ShotResult(
        job_id=job_id,
        status="running",
        total=len(plan.sequence.all_frames),
        skipped=list(plan.skipped),
        output_root=plan.layout.root,
        exr_pattern=plan.layout.exr_pattern,
        zarr=plan.layout.zarr,
        untrained=plan.untrained,
    )
    missing = _missing_frames(plan)
    if missing:
        _record(catalog, job_id, _failed_chunk(-1, missing), result)
    _emit(result, "planned", f"{len(plan.todo)} to do, {len(plan.skipped)} already done")

    jobs = plan.chunk_jobs(provenance)
    gpus = gpu_slots(client)
    resources = {"GPU": 1} if gpus else None
    slots = gpus or worker_count(client) or 1
    window = window or 2 * slots
    for summary in dispatch(client, jobs, window=window, resources=resources):
        _record(catalog, job_id, summary, result)
        if on_chunk is not None:
            on_chunk(summary)
        _emit(result, "frames")

    if result.done or result.skipped:
        finalize = FinalizeJob(
            layout=plan.layout,
            frames=tuple(sorted(result.done + result.skipped)),
            passes=plan.spec.passes,
            image_size=(plan.plate.width, plan.plate.height),
            data_window=plan.plate.data_window,
            pixel_aspect=plan.plate.pixel_aspect,
            provenance=provenance,
            previews=plan.spec.previews,
            review_clips=plan.spec.review_clips,
            fps=plan.fps,
            only_missing=not result.done,
            storage_options=plan.storage_options,
        )
        try:
            if result.done:  # new previews to read: on a worker, not in the flow
                result.extras = client.submit(finalize_shot, finalize, pure=False).result()
            else:  # only checks that the files exist
                result.extras = finalize_shot(finalize)
        except Exception as exc:  # the frames are safe; say what is missing
            log.error("shot-level files (pose JSON, contact sheets, clips) failed: %s", exc)
            result.extras = {"error": f"{type(exc).__name__}: {exc}"}
    status = _status(result)
    message = _message(result)
    catalog.finish_job(job_id, status, message)
    result.status = status
    result.wall_s = time.perf_counter() - start
    _emit(result, "finished", message)
    return result


def dispatch(
    client: Client,
    jobs: list[ChunkJob],
    *,
    window: int,
    resources: dict[str, int] | None,
) -> Iterator[ChunkSummary]:
    """Submit chunks keeping at most `window` in flight (resource-restricted tasks skip Dask's
    own queueing, stack-notes.md 3.2); yield each summary as it lands. A chunk whose worker
    died more often than Dask allows, or that raised, comes back as failed frames."""
    pending = iter(jobs)
    in_flight: dict[Any, ChunkJob] = {}
    run = uuid.uuid4().hex[:8]

    def submit_next(ac: as_completed | None) -> Any:
        job = next(pending, None)
        if job is None:
            return None
        future = client.submit(
            process_chunk,
            job,
            key=f"svfx-chunk-{run}-{job.index}",
            resources=resources,
            pure=False,
        )
        in_flight[future] = job
        if ac is not None:
            ac.add(future)
        return future

    first = [f for f in (submit_next(None) for _ in range(max(1, window))) if f is not None]
    if not first:
        return
    completed = as_completed(first)
    for future in completed:
        job = in_flight.pop(future)
        try:
            summary = future.result()
        except Exception as exc:
            reason = f"chunk {job.index} failed on the cluster: {type(exc).__name__}: {exc}"
            log.error(reason)
            summary = _failed_chunk(
                job.index,
                {f: reason for f in job.frames},
                uris=dict(zip(job.frames, job.plate_uris, strict=True)),
            )
        future.release()  # a dead worker must not make Dask recompute finished chunks
        submit_next(completed)
        yield summary


def _record(catalog: Any, job_id: int, summary: ChunkSummary, result: ShotResult) -> None:
    catalog.record_chunk(job_id, summary)
    result.chunks += summary.chunk_index >= 0
    result.model_s += summary.model_s
    result.chunk_wall_s += summary.wall_s
    result.peak_worker_rss_mb = max(result.peak_worker_rss_mb, summary.peak_rss_mb)
    for frame in summary.frames:
        if frame.status == "done":
            result.done.append(frame.frame)
        else:
            result.failed[frame.frame] = frame.error or "failed"


def _missing_frames(plan: ShotPlan) -> dict[int, str]:
    return {
        f: f"{plan.sequence.uri_for(f)}: frame {f}: missing from the sequence (a hole)"
        for f in plan.sequence.holes
    }


def _failed_chunk(
    index: int, reasons: dict[int, str], uris: dict[int, str] | None = None
) -> ChunkSummary:
    frames = [
        FrameSummary(frame=f, plate_uri=(uris or {}).get(f, ""), status="failed", error=why)
        for f, why in sorted(reasons.items())
    ]
    return ChunkSummary(
        chunk_index=index,
        frames=frames,
        worker="",
        environment={},
        checkpoints={},
        colour={},
        tiling={},
    )


def _status(result: ShotResult) -> str:
    if not result.done and not result.skipped:
        return "failed"
    return "partial" if result.failed else "complete"


def _message(result: ShotResult) -> str:
    parts = [f"{len(result.done)} done", f"{len(result.skipped)} already done"]
    if result.failed:
        parts.append(f"{len(result.failed)} failed")
    text = ", ".join(parts) + f" of {result.total} frames"
    if result.failed:
        first = sorted(result.failed.items())[:5]
        text += "; failed: " + "; ".join(why for _f, why in first)
        if len(result.failed) > 5:
            text += f"; ... and {len(result.failed) - 5} more"
    return text


def _emit(result: ShotResult, stage: str, message: str = "") -> None:
    emit(
        Progress(
            stage=stage,
            total=result.total,
            done=len(result.done),
            failed=len(result.failed),
            skipped=len(result.skipped),
            message=message,
        )
    )
