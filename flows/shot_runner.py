"""Running one planned shot on a Dask cluster: register the job, create the shot's store,
take the work to do (`flows.planning.work_to_do`) and record what it found, dispatch chunks
in a bounded window, record each chunk's summary in the catalog as it lands, then the
shot-level files.

The job is never left `running` by a run that ends: every way out this process can catch
closes it (`complete`, `partial` or `failed`, with the reason); a heartbeat tells other
processes it is alive, so a run killed outright is closed by the next job on its outputs.
When the catalog's database is away longer than a short wait, chunk summaries are kept and
recorded once it is back (dispatch goes on meanwhile); the frames are also on disk with their
frame records, so even a run that ends before the database returns loses no work.

Plain functions with no Prefect in them, so the Prefect flow (`flows.process_shot`), the
benchmark and tests share one code path; the flow adds its logging and artifacts on top.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from distributed import Client, as_completed

from schemas.catalog.errors import CatalogError, CatalogUnavailable
from schemas.catalog.lease import HEARTBEAT_S, end_run, start_run
from schemas.catalog.writer import Catalog
from schemas.passes import zarr_arrays
from schemas.summaries import ChunkSummary, FrameSummary
from storage.errors import StorageError, writing
from storage.retry import RetryPolicy
from storage.zarr_store import create_shot_store
from tasks.chunk_worker import ChunkJob, process_chunk
from tasks.colour import working_space_for
from tasks.finalize import FinalizeJob, finalize_shot
from tasks.provenance import platform_version
from tasks.temporal_qc import QcJob, flagged_frames, qc_passes, shot_flicker

from .cluster import gpu_slots, worker_count
from .planning import work_to_do
from .progress import Progress, emit
from .shot_plan import ShotPlan, Work

log = logging.getLogger("svfx.flow")


@dataclass
class ShotResult:
    job_id: int
    status: str  # complete, partial, failed
    total: int
    done: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    adopted: list[int] = field(default_factory=list)  # found on disk, recorded, not recomputed
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
    # per worker (host:pid): [chunk wall s, model s], for the model's share of each one's time
    worker_time: dict[str, list[float]] = field(default_factory=dict)
    chunks: int = 0
    flagged: dict[str, list[int]] = field(default_factory=dict)  # temporal QC, per pass
    error: str = ""  # why the run stopped before the end (the catalog away, ...)

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


# While chunks keep landing, a catalog write waits this long before the summary is kept for
# later (the GPUs keep working); at the end of the shot the catalog's own, longer deadline.
DURING_SHOT_RETRY = RetryPolicy(attempts=10_000, first_wait_s=0.25, max_wait_s=2.0, deadline_s=10.0)


def run_planned_shot(
    plan: ShotPlan,
    catalog: Catalog,
    client: Client,
    *,
    flow_run_id: str | None = None,
    window: int = 0,
    on_chunk: Callable[[ChunkSummary], None] | None = None,
) -> ShotResult:
    """Run the plan to the end; the job is closed on every way out (see the module).
    Raises JobConflict before any work when a live job writes the same outputs, and
    CatalogError when the catalog cannot be used (named, with the reason)."""
    uris = {f: plan.sequence.uri_for(f) for f in plan.sequence.frames}
    owner = start_run()
    try:
        job_id = catalog.register_job(
            plan.spec,
            plan.plate,
            flow_run_id,
            uris=uris,
            output_root=plan.paths.root,
            owner=owner,
        )
        return _run_registered(plan, catalog, client, job_id, flow_run_id, window, on_chunk)
    finally:
        end_run(owner)


def _run_registered(
    plan: ShotPlan,
    catalog: Catalog,
    client: Client,
    job_id: int,
    flow_run_id: str | None,
    window: int,
    on_chunk: Callable[[ChunkSummary], None] | None,
) -> ShotResult:
    start = time.perf_counter()
    result = ShotResult(
        job_id=job_id,
        status="running",
        total=len(plan.sequence.all_frames),
        output_root=plan.paths.root,
        exr_pattern=plan.paths.exr_pattern,
        zarr=plan.paths.zarr,
        untrained=plan.untrained,
    )
    with _Heartbeat(catalog, job_id):
        try:
            _run(plan, catalog, client, result, flow_run_id, window, on_chunk)
        except BaseException as exc:
            _close_after(catalog, result, exc)
            raise
    result.wall_s = time.perf_counter() - start
    return result


def _run(
    plan: ShotPlan,
    catalog: Catalog,
    client: Client,
    result: ShotResult,
    flow_run_id: str | None,
    window: int,
    on_chunk: Callable[[ChunkSummary], None] | None,
) -> None:
    job_id = result.job_id
    provenance = store_provenance(plan, job_id, flow_run_id)
    create_store(plan, provenance)
    work = work_to_do(plan, catalog, provenance)
    _record_work(catalog, job_id, work, result)
    _emit(result, "planned", work.note)

    recorder = _Recorder(catalog, job_id)
    gpus = gpu_slots(client)
    resources = {"GPU": 1} if gpus else None
    slots = gpus or worker_count(client) or 1
    window = window or 2 * slots
    stopping = threading.Event()
    summaries = dispatch(client, list(work.jobs), window=window, resources=resources, stop=stopping)
    try:
        for summary in summaries:
            recorder.record(summary)
            _count(summary, result)
            if on_chunk is not None:
                on_chunk(summary)
            _emit(result, "frames")
        recorder.flush(final=True)  # raises CatalogUnavailable if the catalog never came back
    except Exception:
        # Submit nothing more, and let the chunks already running finish: their frames land
        # on disk with their records (the next run records them), and no chunk of this run
        # is still writing when the next one starts.
        stopping.set()
        for _ in summaries:
            pass
        raise

    finished = sorted(result.done + result.skipped + result.adopted)
    if finished:
        qc = _start_qc(plan, client, finished) if result.done else None
        result.extras = _finalize(plan, client, provenance, finished, bool(result.done))
        if qc is not None:
            _record_qc(plan, catalog, job_id, qc, result)
    result.status = _status(result)
    message = _message(result)
    catalog.finish_job(job_id, result.status, message)
    _emit(result, "finished", message)


def _record_work(catalog: Catalog, job_id: int, work: Work, result: ShotResult) -> None:
    """What the plan found before dispatch: frames already done, adopted, or holes."""
    if work.skipped:
        catalog.record_skipped(job_id, work.skipped)
    for summary in work.adopted.values():
        catalog.record_chunk(job_id, summary)
    if work.holes:
        catalog.record_chunk(job_id, _failed_chunk(-1, work.holes))
    result.skipped, result.adopted = list(work.skipped), list(work.adopted)
    result.failed.update(work.holes)


def create_store(plan: ShotPlan, provenance: dict[str, str]) -> bool:
    """Create the shot's Zarr arrays once. Returns True when an existing store had another
    layout and was replaced (its frames' commit marks are gone with it, so `flows.resume`
    redoes them)."""
    args = (
        plan.paths.zarr,
        plan.sequence.all_frames,
        plan.plate.height,
        plan.plate.width,
        zarr_arrays(plan.spec.passes),
        plan.spec.max_people,
        provenance,
        plan.frames_per_shard,
    )
    options = plan.storage_options or None
    sizes: dict[str, Any] = {"keypoints": plan.keypoints, "seg_classes": plan.seg_classes}
    with writing(plan.paths.zarr, None):
        try:
            create_shot_store(*args, storage_options=options, **sizes)
            return False
        except StorageError as exc:
            log.warning("%s; replacing it and redoing every frame", exc)
            create_shot_store(*args, storage_options=options, overwrite=True, **sizes)
            return True


def store_provenance(plan: ShotPlan, job_id: int, flow_run_id: str | None) -> dict[str, str]:
    prov = {
        "svfx/version": platform_version(),
        "svfx/job": str(job_id),
        "svfx/shot": plan.spec.shot_path,
        "svfx/plate": plan.spec.plate,
    }
    if flow_run_id:
        prov["svfx/flowRun"] = flow_run_id
    if plan.untrained:
        prov["sapiens2/UNTRAINED"] = f"random weights for {', '.join(plan.untrained)}"
    return prov


def _finalize(
    plan: ShotPlan, client: Client, provenance: dict[str, str], frames: list[int], new: bool
) -> dict[str, str]:
    finalize = FinalizeJob(
        paths=plan.paths,
        frames=tuple(frames),
        passes=plan.spec.passes,
        image_size=(plan.plate.width, plan.plate.height),
        data_window=plan.plate.data_window,
        pixel_aspect=plan.plate.pixel_aspect,
        provenance=provenance,
        previews=plan.spec.previews,
        review_clips=plan.spec.review_clips,
        fps=plan.fps,
        only_missing=not new,
        storage_options=plan.storage_options,
        albedo_colorspace=working_space_for(plan.plate.colorspace),
        keypoints=plan.keypoints,
    )
    try:
        if new:  # new previews to read: on a worker, not in the flow
            return dict(client.submit(finalize_shot, finalize, pure=False).result())
        return finalize_shot(finalize)  # only checks that the files exist
    except Exception as exc:  # the frames are safe; say what is missing
        log.error("shot-level files (pose JSON, contact sheets, clips) failed: %s", exc)
        return {"error": f"{type(exc).__name__}: {exc}"}


def _start_qc(plan: ShotPlan, client: Client, frames: list[int]) -> Any:
    """The flicker scores of every finished frame, on a worker (they read the store and the
    plate), beside the shot-level files; None when the shot has no dense pass to score."""
    if not qc_passes(plan.spec.passes) or len(frames) < 3:
        return None
    job = QcJob(
        zarr=plan.paths.zarr,
        frames=tuple(frames),
        plate_uris=tuple(plan.sequence.uri_for(f) for f in frames),
        plate_colorspace=plan.plate.colorspace,
        passes=tuple(plan.spec.passes),
        storage_options=dict(plan.storage_options or {}),
        plate_storage_options=dict(plan.sequence.storage_options or {}),
    )
    return client.submit(shot_flicker, job, pure=False)


def _record_qc(
    plan: ShotPlan, catalog: Catalog, job_id: int, future: Any, result: ShotResult
) -> None:
    """Scores are advice: one that cannot be made is logged and noted, the shot stands."""
    try:
        flicker = future.result()
        frames = {f for scores in flicker.values() for f in scores}
        uris = {f: (plan.paths.exr(f), plan.paths.zarr) for f in frames}
        catalog.record_flicker(job_id, flicker, uris)
    except CatalogUnavailable:
        raise
    except Exception as exc:
        log.error("temporal QC of %s failed: %s", plan.spec.shot_path, exc)
        result.extras["qc_error"] = f"{type(exc).__name__}: {exc}"
        return
    result.flagged = flagged_frames(flicker, plan.qc_threshold)


class _Recorder:
    """Writes chunk summaries into the catalog in order; while the catalog is away (past a
    short wait) keeps them and tries again with each later chunk, so dispatch goes on."""

    def __init__(self, catalog: Catalog, job_id: int) -> None:
        self.catalog = catalog
        self.job_id = job_id
        self.pending: list[ChunkSummary] = []
        self.during_shot = catalog.with_retry(DURING_SHOT_RETRY)

    def record(self, summary: ChunkSummary) -> None:
        self.pending.append(summary)
        self.flush(final=False)

    def flush(self, *, final: bool) -> None:
        catalog = self.catalog if final else self.during_shot
        while self.pending:
            try:
                catalog.record_chunk(self.job_id, self.pending[0])
            except CatalogUnavailable as exc:
                if final:
                    frames = sum(len(s.frames) for s in self.pending)
                    raise CatalogUnavailable(
                        exc.where, f"{exc.reason}; {frames} finished frames are not recorded"
                    ) from None
                log.warning("%s; keeping %d chunk summaries for later", exc, len(self.pending))
                return
            self.pending.pop(0)


class _Heartbeat:
    """Refreshes the job's heartbeat every HEARTBEAT_S seconds on a daemon thread."""

    def __init__(self, catalog: Catalog, job_id: int) -> None:
        self.catalog = catalog
        self.job_id = job_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="svfx-heartbeat", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            try:
                self.catalog.heartbeat(self.job_id)
            except Exception as exc:  # the database away: the next beat tries again
                log.debug("heartbeat of job %s failed: %s", self.job_id, exc)


def _close_after(catalog: Catalog, result: ShotResult, exc: BaseException) -> None:
    """Close the job of a run that stops on ``exc`` (an error, Ctrl-C, SIGTERM)."""
    recorded = result.done or result.skipped or result.adopted
    status = "partial" if recorded else "failed"
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        reason = "the run was interrupted"
    result.status, result.error = status, reason
    message = f"the run stopped before the end: {reason}; {_message(result)}"
    try:
        catalog.with_retry(DURING_SHOT_RETRY).finish_job(result.job_id, status, message)
    except (CatalogError, Exception) as close_error:
        log.error(
            "job %s could not be closed (%s); the next job on its outputs closes it",
            result.job_id,
            close_error,
        )


def dispatch(
    client: Client,
    jobs: list[ChunkJob],
    *,
    window: int,
    resources: dict[str, int] | None,
    stop: threading.Event | None = None,
) -> Iterator[ChunkSummary]:
    """Submit chunks keeping at most `window` in flight (resource-restricted tasks skip Dask's
    own queueing, stack-notes.md 3.2); yield each summary as it lands. A chunk whose worker
    died more often than Dask allows, or that raised, comes back as failed frames. Once
    ``stop`` is set nothing more is submitted and the chunks in flight are still yielded."""
    pending = iter(jobs)
    in_flight: dict[Any, ChunkJob] = {}
    run = uuid.uuid4().hex[:8]

    def submit_next(ac: as_completed | None) -> Any:
        job = None if stop is not None and stop.is_set() else next(pending, None)
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


def _count(summary: ChunkSummary, result: ShotResult) -> None:
    result.chunks += summary.chunk_index >= 0
    result.model_s += summary.model_s
    result.chunk_wall_s += summary.wall_s
    result.peak_worker_rss_mb = max(result.peak_worker_rss_mb, summary.peak_rss_mb)
    if summary.chunk_index >= 0:
        spent = result.worker_time.setdefault(summary.worker, [0.0, 0.0])
        spent[0] += summary.wall_s
        spent[1] += summary.model_s
    for frame in summary.frames:
        if frame.status == "done":
            result.done.append(frame.frame)
        else:
            result.failed[frame.frame] = frame.error or "failed"


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
    if not result.done and not result.skipped and not result.adopted:
        return "failed"
    return "partial" if result.failed else "complete"


def _message(result: ShotResult) -> str:
    parts = [f"{len(result.done)} done", f"{len(result.skipped)} already done"]
    if result.adopted:
        parts.append(f"{len(result.adopted)} found on disk")
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
            skipped=len(result.skipped) + len(result.adopted),
            message=message,
        )
    )
