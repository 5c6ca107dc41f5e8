"""Running one planned shot on a Dask cluster: register the job, create the shot's store,
take the work to do (`flows.planning.work_to_do`) and record what it found, dispatch chunks
in a bounded window, record each chunk's summary in the catalog as it lands, then the
shot-level files; a job that completes is published to the production tracker when one is
configured (`publish.run.publish_completed`).

The job is never left `running` by a run that ends: every way out this process can catch
closes it (`complete`, `partial` or `failed`, with the reason); a heartbeat tells other
processes it is alive, so a run killed outright is closed by the next job on its outputs.
When the catalog's database is away longer than a short wait, chunk summaries are kept and
recorded once it is back (dispatch goes on meanwhile); the frames are also on disk with their
frame records, so even a run that ends before the database returns loses no work.

Plain functions with no Prefect in them, so the Prefect flow (`flows.process_shot`), the
benchmark and tests share one code path; the flow adds its logging and artifacts on top.
Its parts: `flows.chunk_dispatch` (chunks onto the cluster in a bounded window),
`flows.job_recording` (summaries into the catalog, the heartbeat, closing the job) and
`flows.shot_result` (what the run came to).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from core.errors import SvfxError
from publish.run import publish_completed
from schemas.catalog import queries
from schemas.catalog.errors import CatalogUnavailable
from schemas.catalog.lease import end_run, start_run
from schemas.catalog.writer import Catalog
from schemas.passes import zarr_arrays
from schemas.summaries import ChunkSummary
from storage.errors import StorageError, writing
from storage.zarr_store import create_shot_store
from tasks.colour import working_space_for
from tasks.finalize import FinalizeJob, finalize_shot
from tasks.provenance import platform_version
from tasks.temporal_qc import METHOD, QcJob, flagged_frames, qc_passes, shot_flicker

from .chunk_dispatch import dispatch, failed_chunk
from .job_recording import ChunkRecorder, Heartbeat, close_after
from .planning import work_to_do
from .progress import Progress, emit
from .shot_plan import ShotPlan, Work
from .shot_result import ShotResult, count_chunk, final_status, outcome_message

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger("svfx.flow")


class FramesChanged(SvfxError):
    """A run settled without a cluster found frames to compute after all."""


def run_planned_shot(
    plan: ShotPlan,
    catalog: Catalog,
    client: Client | None,
    *,
    flow_run_id: str | None = None,
    window: int = 0,
    on_chunk: Callable[[ChunkSummary], None] | None = None,
) -> ShotResult:
    """Run the plan to the end; the job is closed on every way out (see the module).
    Raises JobConflict before any work when a live job writes the same outputs, and
    CatalogError when the catalog cannot be used (named, with the reason). ``client`` may be
    None when nothing is to be computed (`flows.settled.settle_without_cluster`); should
    frames turn out to need computing after all, the job ends failed, saying so."""
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
    client: Client | None,
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
    with Heartbeat(catalog, job_id):
        try:
            _run(plan, catalog, client, result, flow_run_id, window, on_chunk)
        except BaseException as exc:
            close_after(catalog, result, exc)
            raise
    result.wall_s = time.perf_counter() - start
    return result


def _run(
    plan: ShotPlan,
    catalog: Catalog,
    client: Client | None,
    result: ShotResult,
    flow_run_id: str | None,
    window: int,
    on_chunk: Callable[[ChunkSummary], None] | None,
) -> None:
    """The registered job's run: its store, the work to do, the chunks, the shot-level files
    and QC, then the job closed (and published when complete)."""
    job_id = result.job_id
    provenance = store_provenance(plan, job_id, flow_run_id)
    create_store(plan, provenance)
    work = work_to_do(plan, catalog, provenance)
    _record_work(catalog, job_id, work, result)
    _emit(result, "planned", work.note)
    if work.jobs and client is None:  # frames changed since they were found all done
        raise FramesChanged(
            f"{len(work.todo)} frames of {plan.spec.shot_path} need computing after all (they "
            "changed while the run was being decided); submit again"
        )

    _run_chunks(catalog, client, work, result, window, on_chunk)
    finished = sorted(result.done + result.skipped + result.adopted)
    if finished:
        qc = None
        if client is not None and _qc_due(plan, catalog, job_id, result):
            qc = _start_qc(plan, client, finished)
        result.extras = _finalize(plan, client, provenance, finished, bool(result.done))
        if qc is not None:
            _record_qc(plan, catalog, job_id, qc, result)
    result.status = final_status(result)
    message = outcome_message(result)
    catalog.finish_job(job_id, result.status, message)
    if result.status == "complete":  # SVFX_PUBLISH: to the tracker; never fails the job
        result.extras.update(publish_completed(catalog, job_id))
    _emit(result, "finished", message)


def _run_chunks(
    catalog: Catalog,
    client: Client | None,
    work: Work,
    result: ShotResult,
    window: int,
    on_chunk: Callable[[ChunkSummary], None] | None,
) -> None:
    """Dispatch the work's chunks in a bounded window (none without a client) and record
    each chunk's summary in the catalog as it lands."""
    recorder = ChunkRecorder(catalog, result.job_id)
    stopping = threading.Event()
    summaries: Iterator[ChunkSummary] = iter(())
    if client is not None and work.jobs:
        from .cluster import chunk_dispatch_shape  # Dask only where chunks go out

        default_window, resources = chunk_dispatch_shape(client)
        summaries = dispatch(
            client, list(work.jobs), window=window or default_window, resources=resources,
            stop=stopping,
        )  # fmt: skip
    try:
        for summary in summaries:
            recorder.record(summary)
            count_chunk(summary, result)
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


def _record_work(catalog: Catalog, job_id: int, work: Work, result: ShotResult) -> None:
    """What the plan found before dispatch: frames already done, adopted, or holes."""
    if work.skipped:
        catalog.record_skipped(job_id, work.skipped)
    for summary in work.adopted.values():
        catalog.record_chunk(job_id, summary)
    if work.holes:
        catalog.record_chunk(job_id, failed_chunk(-1, work.holes))
    result.skipped, result.adopted = list(work.skipped), list(work.adopted)
    result.failed.update(work.holes)


def create_store(plan: ShotPlan, provenance: dict[str, str]) -> bool:
    """Create the shot's Zarr arrays once. Returns True when an existing store had another
    layout and was replaced (its frames' commit marks are gone with it, so `flows.resume`
    redoes them)."""
    args = (
        plan.paths.at(plan.paths.zarr),
        plan.sequence.all_frames,
        plan.plate.height,
        plan.plate.width,
        zarr_arrays(plan.spec.passes),
        plan.spec.max_people,
        provenance,
        plan.frames_per_shard,
    )
    sizes: dict[str, Any] = {"keypoints": plan.keypoints, "seg_classes": plan.seg_classes}
    with writing(plan.paths.zarr, None):
        try:
            create_shot_store(*args, **sizes)
            return False
        except StorageError as exc:
            log.warning("%s; replacing it and redoing every frame", exc)
            create_shot_store(*args, overwrite=True, **sizes)
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
    plan: ShotPlan,
    client: Client | None,
    provenance: dict[str, str],
    frames: list[int],
    new: bool,
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
        albedo_colorspace=working_space_for(plan.plate.colorspace),
        keypoints=plan.keypoints,
    )
    try:
        if new and client is not None:  # new previews to read: on a worker, not in the flow
            written = dict(client.submit(finalize_shot, finalize, pure=False).result())
        else:
            written = finalize_shot(finalize)  # only checks that the files exist
    except Exception as exc:  # the frames are safe; say what is missing
        log.error("shot-level files (pose JSON, contact sheets, clips) failed: %s", exc)
        return {"error": f"{type(exc).__name__}: {exc}"}
    if "review_clips_skipped" in written:  # a node without ffmpeg: said once, in the job's log
        log.warning(written["review_clips_skipped"])
    return written


def _qc_due(plan: ShotPlan, catalog: Catalog, job_id: int, result: ShotResult) -> bool:
    """The shot's QC runs when the run made frames, or when some frame of the version has no
    score of this QC's method (an earlier QC's, or none): submitting a version again, with
    nothing to remake, scores it anew."""
    if result.done:
        return True
    try:
        return queries.unscored(catalog.engine, job_id, qc_passes(plan.spec.passes), METHOD)
    except SQLAlchemyError as exc:  # scores are advice; the job's own records say if it is down
        log.warning("temporal QC not run: could not read whether job %s's scores are current "
                    "(%s: %s)", job_id, type(exc).__name__, exc)  # fmt: skip
        return False


def _start_qc(plan: ShotPlan, client: Client, frames: list[int]) -> Any:
    """The flicker scores of every finished frame, on a worker (they read the store and the
    plate), beside the shot-level files; None when the shot has no dense pass to score."""
    if not qc_passes(plan.spec.passes) or len(frames) < 3:
        return None
    job = QcJob(
        zarr=plan.paths.at(plan.paths.zarr),
        frames=tuple(frames),
        plate_uris=tuple(plan.sequence.uri_for(f) for f in frames),
        plate_colorspace=plan.plate.colorspace,
        passes=tuple(plan.spec.passes),
        plate=plan.plate_location,
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
        catalog.record_flicker(job_id, flicker, uris, METHOD)
    except CatalogUnavailable:
        raise
    except Exception as exc:
        log.error("temporal QC of %s failed: %s", plan.spec.shot_path, exc)
        result.extras["qc_error"] = f"{type(exc).__name__}: {exc}"
        return
    result.flagged = flagged_frames(flicker, plan.qc_threshold)


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
