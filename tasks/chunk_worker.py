"""The per-chunk worker routine: a chunk of frames in, passes written, a small summary out.

Runs inside a Dask worker (one call per chunk; the flow gives it URIs and settings, never
pixels). Three stages overlap so the model's device never waits on the host:

    reader thread   read the plate frame (bytes -> sha256 -> decode), convert its colour
                    into pinned memory (``tasks.frame_reading``); with motion, the optical
                    flow to its neighbours in the plate too, one frame held back for it
                    (``tasks.frame_motion``); at most `READ_AHEAD` frames wait for the model
    this thread     upload, tiles, model batches, blending and every per-pixel step after
                    the model on the device, then the non-blocking copy of each frame's
                    final arrays to the host (``tasks.frame_inference``); pose
    writer threads  EXR per frame (OpenEXR's thread pool: ``size_encoder_threads``), the
                    frame's Zarr region, previews, pose fragment, frame record
                    (``tasks.frame_writing``); at most `WRITE_BEHIND` frames queued

so frame N+1's inference runs while frame N is encoded. A GPU worker runs two chunks at once
(`flows.cluster`) and their model stages take the device in turn, each whole under one lock
per process (`DEVICE_STAGE`): while one chunk's model stage runs, the other sets up and reads
its first frames, or writes its last, so the device does not idle at chunk boundaries. Each
chunk's ``model_s`` is the device time of its own stage. Every queue is bounded: memory is
flat in the chunk's (and the shot's) length. Everything written is idempotent (atomic files,
whole Zarr chunks), so a chunk rerun after a worker dies rewrites the same bytes. A frame that
fails is recorded with the file, frame and reason (the output that could not be written, when
writing failed; the pass, when the model made NaN or Inf; the pass and size, when one input
does not fit in the device's memory); the other frames go on.
"""

from __future__ import annotations

import functools
import logging
import queue
import resource
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from sapiens.keypoints import KEYPOINT_NAMES
from sapiens.predictor import Predictor, release_cached_memory
from schemas import passes as pass_table
from schemas.spec import TILES_KEY, ShotSpec
from schemas.summaries import ChunkContext, ChunkSummary, FrameSummary
from storage.zarr_writer import ShotStoreWriter
from tasks.checkpoints.files import seg_class_names
from tasks.chunk_job import ChunkJob
from tasks.colour import ColourConversion
from tasks.frame_inference import FrameInference, InferredFrame, default_focal
from tasks.frame_motion import read_with_motion
from tasks.frame_passes import MOTION
from tasks.frame_reading import FrameReader, ReadFrame, failed
from tasks.frame_writing import FrameWriter
from tasks.model_cache import compile_note, get_predictor, worker_precision
from tasks.node_threads import worker_exr_threads
from tasks.plate_flow import DEFAULT_FLOW
from tasks.provenance import chunk_context, environment

log = logging.getLogger("svfx.worker")

READ_AHEAD = 2
WRITE_BEHIND = 2
FRAMES_PER_BATCH = 2  # frames whose tiles share model batches
# One chunk's model stage at a time in this process (one device per worker process): taken
# before its first frame is inferred and given back after its last, so two chunks of one
# worker never interleave on the device (nor hold two chunks' tensors there).
DEVICE_STAGE = threading.Lock()
_ENCODER_LOCK = threading.Lock()
_ENCODER_THREADS: int | None = None
_PRECISIONS_SAID: set[object] = set()


def process_chunk(job: ChunkJob, *, predictor: Predictor | None = None) -> ChunkSummary:
    """Run every frame of the chunk; never raises for a bad frame (it is recorded).

    ``predictor`` replaces the resident models of ``job.checkpoints`` (benchmarks' stand-ins).
    """
    if job.source is not None:  # a stabilised version: no model runs
        from tasks.stabilise.worker import stabilising

        with DEVICE_STAGE:  # the whole chunk: its fusion runs on the device throughout
            start = time.perf_counter()
            stabiliser = stabilising(job)
            return summarise(stabiliser, stabiliser.context, job.index, start)
    start = time.perf_counter()
    spec = ShotSpec.model_validate(job.spec)
    load_s = 0.0
    if predictor is None:
        predictor, load_s = get_predictor(
            job.checkpoints, precision=spec.precision, batch_size=spec.batch_size
        )
    size_encoder_threads(on_cpu=predictor.device.type == "cpu")
    colour = ColourConversion(job.plate_colorspace)
    context = chunk_context(
        job,
        colour,
        environment(
            predictor.device,
            predictor.dtype,
            precision_reason(spec, predictor),
            compile_note(predictor, job.checkpoints),
        ),
        {**spec.tiling.model_dump(), "device": str(predictor.device)},
    )
    runner = _ChunkRunner(job, spec, predictor, colour, context)
    summary = summarise(runner, context, job.index, start)
    summary.model_s = runner.model_s
    summary.load_s = load_s
    return summary


class _Runner(Protocol):
    store: ShotStoreWriter

    def run(self) -> list[FrameSummary]: ...


def summarise(runner: _Runner, context: ChunkContext, index: int, start: float) -> ChunkSummary:
    """A chunk's frames run into its summary (a model's chunk or a stabilised one), the
    chunk's Zarr store closed whatever happens; with its wall time since ``start`` and the
    worker's peak memory."""
    try:
        summary = context.summary(runner.run(), index)
    finally:
        runner.store.close()
    summary.wall_s = time.perf_counter() - start
    summary.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return summary


def precision_reason(spec: ShotSpec, predictor: Predictor) -> str:
    """Why the models run in their precision, said once per worker and per choice in its log
    (the provenance of every output holds it too)."""
    choice = worker_precision(spec.precision)
    if choice.dtype != predictor.dtype:
        return "the caller's own predictor"  # benchmarks' stand-ins
    if choice not in _PRECISIONS_SAID:
        _PRECISIONS_SAID.add(choice)
        log.warning("%s", choice.line())
    return choice.reason


def size_encoder_threads(on_cpu: bool) -> int:
    """Size OpenEXR's global thread pool (it encodes a part's scanline blocks in parallel)
    once per process: a CPU worker's to its node plan (`tasks.node_threads`: the core kept
    for reading and encoding, or 0 when they share the torch threads' cores), a GPU
    worker's to every core it may use; ``SVFX_EXR_THREADS`` overrides. At 0 every EXR is
    encoded on its writer thread alone. Returns the size."""
    global _ENCODER_THREADS
    with _ENCODER_LOCK:
        if _ENCODER_THREADS is None:
            import OpenEXR

            _ENCODER_THREADS = worker_exr_threads(on_cpu)
            OpenEXR.set_global_thread_count(_ENCODER_THREADS)
        return _ENCODER_THREADS


class _ChunkRunner:
    def __init__(
        self,
        job: ChunkJob,
        spec: ShotSpec,
        predictor: Predictor,
        colour: ColourConversion,
        context: ChunkContext,
    ) -> None:
        self.job = job
        self.spec = spec
        self.predictor = predictor
        self.model_s = 0.0  # device time of this chunk's model stage
        self.colour = colour
        self.precision_reason = str(context.environment.get("precision_reason", ""))
        self.compiled = str(context.environment.get("compiled", ""))
        self.store = ShotStoreWriter(job.paths.at(job.paths.zarr))
        shas = [ref.sha256 for ref in job.checkpoints.values()]
        self.reader = FrameReader(
            spec,
            colour,
            job.frame_hw,
            shas,
            plate=job.plate,
            pinned=predictor.device.type == "cuda",
        )
        infos = predictor.infos
        classes = seg_class_names(job.checkpoints)  # as the flow's Zarr store names them
        posed = [n for n in infos if pass_table.BY_NAME[n].values == "keypoints"]
        pose_head = infos[posed[0]].head if posed else None
        self.inference = FrameInference(spec, predictor, classes)
        self.writer = FrameWriter(
            spec,
            job.paths,
            self.store,
            colour,
            context,
            self._provenance(),
            classes,
            store_index=dict(zip(job.frames, job.store_indices, strict=True)),
            keypoints=pose_head.out_channels if pose_head else len(KEYPOINT_NAMES),
        )

    # -- the three stages -----------------------------------------------------------------
    def run(self) -> list[FrameSummary]:
        frames: queue.Queue[ReadFrame | FrameSummary | None] = queue.Queue(READ_AHEAD)
        work = [
            (number, uri, self.job.fingerprints.get(number))
            for number, uri in zip(self.job.frames, self.job.plate_uris, strict=True)
        ]
        if MOTION in self.spec.passes:  # flow to the neighbours, outside the chunk too
            read = functools.partial(read_with_motion, self.reader, neighbours=self.job.neighbours)
        else:
            read = self.reader.read_all
        reader = threading.Thread(target=read, args=(work, frames), daemon=True)
        reader.start()
        done: list[FrameSummary] = []
        pending: list[Future[FrameSummary]] = []
        with ThreadPoolExecutor(WRITE_BEHIND, thread_name_prefix="svfx-write") as writers:
            with DEVICE_STAGE:  # the reader reads ahead while another chunk has the device
                timer_before = self.predictor.timer.seconds()
                self._model_stage(frames, done, pending, writers)
                # waits for this stage's device work: the next stage's time is its own
                self.model_s = self.predictor.timer.seconds() - timer_before
            done.extend(f.result() for f in pending)  # the writers drain meanwhile
        reader.join()
        return sorted(done, key=lambda s: s.frame)

    def _model_stage(
        self,
        frames: queue.Queue[ReadFrame | FrameSummary | None],
        done: list[FrameSummary],
        pending: list[Future[FrameSummary]],
        writers: ThreadPoolExecutor,
    ) -> None:
        """Every read frame through the models in groups, each inferred frame handed to the
        writers (at most `WRITE_BEHIND` waiting)."""
        finished = False
        while not finished:
            group: list[ReadFrame] = []
            item = frames.get()
            while True:
                if item is None:
                    finished = True
                    break
                if isinstance(item, FrameSummary):
                    done.append(item)  # failed while reading
                else:
                    group.append(item)
                if len(group) >= FRAMES_PER_BATCH:
                    break
                # wait for the next frame rather than taking what is ready: groups (and so
                # model batches) are then the same on every run, and so are the bytes
                item = frames.get()
            if not group:
                continue
            for inferred in self._infer_group(group, done):
                # bound the frames held by the writers: wait for the oldest
                while sum(not f.done() for f in pending) >= WRITE_BEHIND:
                    next(f for f in pending if not f.done()).result()
                pending.append(writers.submit(self.writer.write, inferred))

    def _infer_group(self, group: list[ReadFrame], done: list[FrameSummary]) -> list[InferredFrame]:
        """Run the models on several frames at once; on error, frame by frame, so one bad
        frame (or one that does not fit in the device's memory) fails alone."""
        try:
            return self.inference.run(group)
        except Exception as exc:
            release_cached_memory(self.predictor.device)
            if len(group) == 1:
                done.append(failed(group[0].summary, exc, group[0].uri))
                return []
        results: list[InferredFrame] = []
        for read in group:
            try:
                results.extend(self.inference.run([read]))
            except Exception as exc:
                release_cached_memory(self.predictor.device)
                done.append(failed(read.summary, exc, read.uri))
        return results

    # -- helpers -------------------------------------------------------------------------
    def _provenance(self) -> dict[str, str]:
        provenance = dict(self.job.provenance)
        untrained = []
        for name, ref in self.job.checkpoints.items():
            info = self.predictor.infos[name]
            provenance[f"sapiens2/{name}/model"] = info.label
            provenance[f"sapiens2/{name}/checkpointSha256"] = ref.sha256
            provenance[f"svfx/{name}/family"] = info.family
            if not ref.trained:
                untrained.append(name)
        if untrained:
            provenance["sapiens2/UNTRAINED"] = (
                f"random weights for {', '.join(untrained)}: outputs are not meaningful"
            )
        provenance["svfx/colourTransform"] = self.colour.to_model_info.description
        provenance["svfx/ocioConfig"] = self.colour.to_model_info.config_name
        tiles = sorted(
            {
                "{1}x{0}".format(*self.spec.tiling.tile_hw(info.input_hw))
                for info in self.predictor.infos.values()
            }
        )
        provenance["svfx/tiling"] = (
            f"{'/'.join(tiles)} tiles (w x h), {self.spec.tiling.overlap} px overlap, feathered; "
            "pointmap on the whole frame, letterboxed"
            + (
                "; relative depth on the whole frame, stretched"
                if any(pass_table.BY_NAME[n].values == "relative_depth" for n in self.spec.passes)
                else ""
            )
        )
        provenance[TILES_KEY] = self.spec.tiles
        provenance["svfx/precision"] = str(self.predictor.dtype).removeprefix("torch.")
        provenance["svfx/precisionReason"] = self.precision_reason
        if self.compiled:
            provenance["svfx/compiled"] = self.compiled
        if MOTION in self.spec.passes:
            flow = DEFAULT_FLOW
            provenance[f"svfx/{MOTION}"] = (
                f"OpenCV DIS optical flow ({flow.preset}) on the plate's luma at most "
                f"{flow.max_side} px on its long side, scaled to plate pixels; forward to "
                "the next frame, backward to the previous; pixels per frame, v up (Nuke); "
                "zero across cuts and holes"
            )
        return provenance


__all__ = ["ChunkJob", "default_focal", "environment", "process_chunk"]
