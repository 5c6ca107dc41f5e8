"""The per-chunk worker routine: a chunk of frames in, passes written, a small summary out.

Runs inside a Dask worker (one call per chunk; the flow gives it URIs and settings, never
pixels). Three stages overlap so the model does not wait on I/O:

    reader thread   read the plate frame (bytes -> sha256 -> decode) and convert its colour,
                    a bounded queue of `READ_AHEAD` frames ahead of the model
    this thread     cut tiles, batch the tiles of several frames per pass, run the models,
                    blend the tiles back, rotate normals into the frame's camera, find people
    writer threads  EXR per frame, the frame's Zarr region, previews, pose fragment; at most
                    `WRITE_BEHIND` frames queued, so memory is flat in the chunk's length

Everything written is idempotent (atomic files, whole Zarr chunks), so a chunk rerun after a
worker dies rewrites the same bytes. A frame that fails is recorded with the file, frame and
reason (the output that could not be written, when writing failed); the other frames go on.

Per frame, the writes are ordered so that what is on disk never claims more than is there:
the frame's Zarr commit mark is zeroed first, then the EXR, the Zarr regions, the pose
fragment and the previews are written, then the commit mark is set and the frame record
(`tasks.frame_records`) written last. A frame that fails while writing removes the files this
attempt wrote, so a failed frame leaves no output that the catalog does not describe.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import resource
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sapiens.arch import CANONICAL_FOCAL, NATIVE_INPUT_HW
from sapiens.keypoints import KEYPOINT_COLORS, SKELETON, SKELETON_COLORS
from sapiens.predictor import Predictor
from sapiens.seg_classes import BACKGROUND, SEG_CLASSES
from schemas.spec import ShotSpec, cache_key
from schemas.summaries import ChunkContext, ChunkSummary, FrameSummary, OutputRecord
from storage.errors import FrameError, writing
from storage.exr_writer import (
    PART_DTYPES,
    PART_ORDER,
    PASS_OF_PART,
    class_labels,
    write_passes_exr,
)
from storage.frame import Frame
from storage.plate_reader import decode_frame, fetch_bytes
from storage.pose_json import write_pose_fragment
from storage.previews import pass_preview, pose_preview, write_image
from storage.zarr_store import ShotStoreWriter
from tasks.anamorphic import desqueeze, resqueeze
from tasks.blending import FrameBlender
from tasks.checkpoints import CheckpointRef
from tasks.colour import ColourConversion
from tasks.frame_records import remove_file, write_frame_record
from tasks.model_cache import get_predictor
from tasks.normal_rotation import normalize_vectors, rotate_normals, tile_rotation
from tasks.output_paths import ShotOutputPaths
from tasks.person_boxes import boxes_from_mask
from tasks.tiling import extract_tiles, plan_frame

log = logging.getLogger("svfx.worker")

READ_AHEAD = 2
WRITE_BEHIND = 2
FRAMES_PER_BATCH = 2  # frames whose tiles share model batches
TILED = ("normal", "albedo", "matte", "seg")
CHANNELS = {"normal": 3, "albedo": 3, "matte": None, "seg": len(SEG_CLASSES)}


def _seg_palette(classes: int) -> list[tuple[int, int, int]]:
    """Black background, then evenly spaced pastel hues (preview only)."""
    colours = [(0, 0, 0)]
    for i in range(classes - 1):
        phase = 2 * np.pi * i / (classes - 1)
        rgb = [0.55 + 0.45 * np.cos(phase + offset) for offset in (0.0, 2.1, 4.2)]
        colours.append(tuple(round(255 * float(v)) for v in rgb))  # type: ignore[arg-type]
    return colours


SEG_PALETTE = _seg_palette(len(SEG_CLASSES))


@dataclass(frozen=True)
class ChunkJob:
    """One chunk's work order: small and picklable (URIs and settings only)."""

    index: int
    frames: tuple[int, ...]
    plate_uris: tuple[str, ...]
    store_indices: tuple[int, ...]  # each frame's index in the shot's Zarr arrays
    spec: dict[str, Any]  # ShotSpec as JSON
    plate_colorspace: str  # resolved OCIO name
    checkpoints: dict[str, CheckpointRef]  # model pass -> checkpoint
    paths: ShotOutputPaths
    frame_hw: tuple[int, int]  # expected data-window size (every frame must match)
    storage_options: dict[str, Any] = field(default_factory=dict)  # for the outputs
    provenance: dict[str, str] = field(default_factory=dict)  # job id, flow run, version
    fingerprints: dict[int, str] = field(default_factory=dict)
    # for the plate, which may live elsewhere (plates on S3, outputs on local disk, ...)
    plate_storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Prepared:
    number: int
    uri: str
    plate: Frame
    rgb: np.ndarray  # model encoding, desqueezed, (H, W', 3) float32
    summary: FrameSummary


@dataclass
class _Result:
    prepared: _Prepared
    passes: dict[str, np.ndarray] = field(default_factory=dict)
    people: list[dict[str, Any]] = field(default_factory=list)
    focal: float | None = None


def process_chunk(job: ChunkJob) -> ChunkSummary:
    """Run every frame of the chunk; never raises for a bad frame (it is recorded)."""
    start = time.perf_counter()
    spec = ShotSpec.model_validate(job.spec)
    predictor, load_s = get_predictor(
        job.checkpoints, precision=spec.precision, batch_size=spec.batch_size
    )
    colour = ColourConversion(job.plate_colorspace)
    context = ChunkContext(
        worker=f"{socket.gethostname()}:{os.getpid()}",
        environment=environment(predictor),
        checkpoints={name: ref.as_dict() for name, ref in job.checkpoints.items()},
        colour={**colour.to_model_info.as_dict(), "albedo": colour.albedo_info.description},
        tiling={**spec.tiling.model_dump(), "device": str(predictor.device)},
    )
    runner = _ChunkRunner(job, spec, predictor, colour, context)
    try:
        summary = context.summary(runner.run(), job.index)
    finally:
        runner.store.close()
    summary.wall_s = time.perf_counter() - start
    summary.model_s = runner.model_s
    summary.load_s = load_s
    summary.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return summary


def environment(predictor: Predictor) -> dict[str, Any]:
    import platform

    import torch

    from tasks.provenance import platform_version

    device = predictor.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "platform_version": platform_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
        "device_name": name or platform.machine(),
        "precision": str(predictor.dtype).removeprefix("torch."),
    }


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
        self.context = context
        self.spec = spec
        self.predictor = predictor
        self.colour = colour
        self.model_s = 0.0
        self.settings_digest = spec.settings_digest()
        self.zarr_lock = threading.Lock()  # writers to one shard must not overlap
        self.store = ShotStoreWriter(job.paths.zarr, job.storage_options or None)
        self.provenance = self._provenance()

    # -- the three stages -----------------------------------------------------------------
    def run(self) -> list[FrameSummary]:
        frames: queue.Queue[_Prepared | FrameSummary | None] = queue.Queue(READ_AHEAD)
        reader = threading.Thread(target=self._read_all, args=(frames,), daemon=True)
        reader.start()
        done: list[FrameSummary] = []
        pending: list[Future[FrameSummary]] = []
        with ThreadPoolExecutor(WRITE_BEHIND, thread_name_prefix="svfx-write") as writers:
            finished = False
            while not finished:
                group: list[_Prepared] = []
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
                    # wait for the next frame rather than taking what is ready: groups (and
                    # so model batches) are then the same on every run, and so are the bytes
                    item = frames.get()
                if not group:
                    continue
                for result in self._infer_group(group, done):
                    # bound the frames held by the writers: wait for the oldest
                    while sum(not f.done() for f in pending) >= WRITE_BEHIND:
                        next(f for f in pending if not f.done()).result()
                    pending.append(writers.submit(self._write, result))
            done.extend(f.result() for f in pending)
        reader.join()
        return sorted(done, key=lambda s: s.frame)

    def _read_all(self, out: queue.Queue[_Prepared | FrameSummary | None]) -> None:
        try:
            for number, uri in zip(self.job.frames, self.job.plate_uris, strict=True):
                summary = FrameSummary(
                    frame=number,
                    plate_uri=uri,
                    status="done",
                    plate_fingerprint=self.job.fingerprints.get(number),
                )
                try:
                    out.put(self._read(number, uri, summary))
                except Exception as exc:
                    out.put(_failed(summary, exc, uri))
        finally:
            out.put(None)

    def _read(self, number: int, uri: str, summary: FrameSummary) -> _Prepared:
        t0 = time.perf_counter()
        data = fetch_bytes(uri, self.job.plate_storage_options or None, frame=number)
        summary.plate_sha256 = hashlib.sha256(data).hexdigest()
        summary.plate_size = len(data)
        plate = decode_frame(data, uri, frame=number, nonfinite=self.spec.nonfinite)
        del data
        if (plate.height, plate.width) != self.job.frame_hw:
            h, w = self.job.frame_hw
            raise FrameError(
                uri,
                number,
                f"frame is {plate.width}x{plate.height} but the shot is {w}x{h} "
                "(data window size differs from the rest of the sequence)",
            )
        t1 = time.perf_counter()
        rgb = self.colour.to_model_encoding(plate.pixels[..., :3])
        if abs(plate.pixel_aspect - 1.0) > 1e-6:
            rgb = desqueeze(rgb, plate.pixel_aspect)
        summary.timings["read"] = t1 - t0
        summary.timings["colour"] = time.perf_counter() - t1
        summary.cache_key = cache_key(
            summary.plate_sha256, sorted(self._all_shas()), self.settings_digest
        )
        return _Prepared(number, uri, plate, np.ascontiguousarray(rgb, np.float32), summary)

    def _infer_group(self, group: list[_Prepared], done: list[FrameSummary]) -> list[_Result]:
        """Run the models on several frames at once; on error, frame by frame, so one bad
        frame fails alone."""
        try:
            return self._infer(group)
        except Exception as exc:
            if len(group) == 1:
                done.append(_failed(group[0].summary, exc, group[0].uri))
                return []
        results: list[_Result] = []
        for prepared in group:
            try:
                results.extend(self._infer([prepared]))
            except Exception as exc:
                done.append(_failed(prepared.summary, exc, prepared.uri))
        return results

    def _infer(self, group: list[_Prepared]) -> list[_Result]:
        t0 = time.perf_counter()
        results = [_Result(p) for p in group]
        wanted = self.spec.model_passes
        height, width = group[0].rgb.shape[:2]
        if "pointmap" in wanted:
            out = self._predict(np.stack([p.rgb for p in group]), "pointmap")
            for i, result in enumerate(results):
                result.passes["pointmap"] = out["pointmap"][i]
                result.focal = float(out["focal"][i])
        for name in (p for p in TILED if p in wanted):
            tile_hw = self.spec.tiling.tile_hw(self.predictor.infos[name].input_hw)
            overlap = self.spec.tiling.overlap_for(tile_hw)
            plan = plan_frame(height, width, name, tile_hw, overlap)
            blenders = [FrameBlender.for_plan(plan, CHANNELS[name]) for _ in group]
            # (frame, tile) pairs across the group, one model batch at a time: tiles of
            # several frames share a batch, and only one batch of outputs is held at once
            work = [(i, t) for i in range(len(group)) for t in range(len(plan.tiles))]
            for start in range(0, len(work), self.spec.batch_size):
                batch = work[start : start + self.spec.batch_size]
                tiles = np.concatenate([extract_tiles(group[i].rgb, plan, [t]) for i, t in batch])
                values = self._predict(tiles, name)[name]
                del tiles
                for (i, t), tile_values in zip(batch, values, strict=True):
                    tile = plan.tiles[t]
                    if name == "normal":
                        focal = results[i].focal or default_focal(height, width)
                        tile_values = rotate_normals(
                            tile_values, tile_rotation(tile, (height, width), focal)
                        )
                    blenders[i].add(tile, tile_values)
                del values
            for result, blender in zip(results, blenders, strict=True):
                blended = blender.result()
                result.passes[name] = normalize_vectors(blended) if name == "normal" else blended
        if "pose" in wanted:
            for result in results:
                result.people = self._pose(result)
        model_share = (time.perf_counter() - t0) / len(group)
        for result in results:
            result.prepared.summary.timings["infer"] = model_share
        return results

    def _predict(self, images: np.ndarray, name: str) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        try:
            return self.predictor.predict(images, [name])
        finally:
            self.model_s += time.perf_counter() - t0

    def _pose(self, result: _Result) -> list[dict[str, Any]]:
        if "seg" in result.passes:
            mask = 1.0 - result.passes["seg"][..., BACKGROUND]
        else:
            mask = result.passes["matte"]
        boxes = boxes_from_mask(mask, max_people=self.spec.max_people)
        if len(boxes) == 0:
            return []
        t0 = time.perf_counter()
        try:
            pose = self.predictor.predict_pose(result.prepared.rgb, boxes)
        finally:
            self.model_s += time.perf_counter() - t0
        aspect = result.prepared.plate.pixel_aspect
        people = []
        for keypoints, scores, box in zip(pose.keypoints, pose.scores, pose.boxes, strict=True):
            keypoints = np.array(keypoints, dtype=np.float32)
            box = np.array(box, dtype=np.float32)
            if abs(aspect - 1.0) > 1e-6:  # back to plate pixels (x was desqueezed)
                keypoints[:, 0] /= aspect
                box[[0, 2]] /= aspect
            people.append({"box": box, "keypoints": keypoints, "scores": scores})
        return people

    def _write(self, result: _Result) -> FrameSummary:
        prepared = result.prepared
        summary = prepared.summary
        written: list[str] = []  # committed by this attempt: removed if the frame fails
        try:
            self._write_outputs(result, written)
        except Exception as exc:
            summary.discarded = self._discard(prepared.number, written)
            return _failed(summary, exc, prepared.uri)
        return summary

    def _discard(self, number: int, written: list[str]) -> list[str]:
        """Remove what a failed frame's attempt wrote (its Zarr mark is already zeroed), so
        the disk holds nothing the catalog does not describe; returns the outputs whose old
        catalog rows no longer hold (the files and the Zarr regions)."""
        options = self.job.storage_options or None
        for uri in [*written, self.job.paths.frame_record(number)]:
            problem = remove_file(uri, options)
            if problem:
                log.warning("frame %d: could not remove a partial output: %s", number, problem)
        arrays = [self.store.array_uri(name) for name in self.store.arrays]
        return [*written, *arrays]

    def _write_outputs(self, result: _Result, written: list[str]) -> None:
        prepared = result.prepared
        summary, plate, number = prepared.summary, prepared.plate, prepared.number
        options = self.job.storage_options or None
        index = self.job.store_indices[self.job.frames.index(number)]
        with writing(self.job.paths.zarr, number), self.zarr_lock:
            self.store.retract(index)  # from here on the store does not claim this frame
        t0 = time.perf_counter()
        passes = {name: result.passes[name] for name in self.spec.passes if name in result.passes}
        if abs(plate.pixel_aspect - 1.0) > 1e-6:
            passes = {
                name: resqueeze(values, plate.width, unit_vectors=name == "normal")
                for name, values in passes.items()
            }
        if "albedo" in passes:
            passes["albedo"] = self.colour.albedo_to_scene_linear(passes["albedo"])
        key = summary.cache_key or ""
        records: list[OutputRecord] = []
        # one argmax for the EXR's seg.id, the Zarr labels and the preview (0.2-0.5 core-s
        # each at 4K)
        labels = class_labels(passes["seg"], np.uint8) if "seg" in passes else None
        if passes:
            exr_uri = self.job.paths.exr(number)
            with writing(exr_uri, number):
                exr = write_passes_exr(
                    exr_uri,
                    plate,
                    passes,
                    self.provenance,
                    class_names=SEG_CLASSES,
                    storage_options=options,
                    seg_labels=labels,
                    albedo_interop_id=self.colour.albedo_interop_id,
                )
            written.append(exr.uri)
            for part in (p for p in PART_ORDER if PASS_OF_PART[p] in passes):
                name = PASS_OF_PART[part]
                records.append(
                    OutputRecord(
                        name, number, "exr", exr.uri, exr.sha256, exr.size,
                        tuple(passes[name].shape), np.dtype(PART_DTYPES[part]).name, part, key,
                    )
                )  # fmt: skip
        t1 = time.perf_counter()
        arrays: dict[str, Any] = dict(passes)
        if labels is not None:
            arrays["seg"] = labels
        if "pose" in self.spec.passes:
            arrays["pose"] = result.people
        blocks = self.store.prepare_frame(index, arrays)
        for name, block in blocks.items():
            with writing(self.store.array_uri(name), number), self.zarr_lock:
                self.store.write_prepared(index, {name: block})
            region = np.ascontiguousarray(block)  # exactly the bytes stored
            records.append(
                OutputRecord(
                    name, number, "zarr", self.store.array_uri(name),
                    hashlib.sha256(region.tobytes()).hexdigest(), region.nbytes,
                    tuple(region.shape), str(region.dtype), None, key,
                )
            )  # fmt: skip
        t2 = time.perf_counter()
        if "pose" in self.spec.passes:
            fragments = self.job.paths.pose_fragments
            with writing(f"{fragments}/{number}", number):
                fragment = write_pose_fragment(fragments, number, result.people, options)
            written.append(fragment.uri)
            records.append(
                OutputRecord(
                    "pose", number, "pose_json", fragment.uri, fragment.sha256, fragment.size,
                    (len(result.people), 308, 3), "json", None, key,
                )
            )  # fmt: skip
        if self.spec.previews:
            shown = dict(passes) if labels is None else {**passes, "seg": labels}
            records.extend(self._previews(result, shown, key, written))
        summary.outputs = records
        summary.timings["write_exr"] = t1 - t0
        summary.timings["write_zarr"] = t2 - t1
        summary.timings["write_other"] = time.perf_counter() - t2
        if key:  # every output is on disk: the store may claim the frame, then the record
            with writing(self.job.paths.zarr, number), self.zarr_lock:
                self.store.commit(index, key)
            record = self.job.paths.frame_record(number)
            with writing(record, number):
                write_frame_record(record, summary, self.context, options)

    def _previews(
        self, result: _Result, passes: dict[str, np.ndarray], key: str, written: list[str]
    ) -> list[OutputRecord]:
        number = result.prepared.number
        aspect = result.prepared.plate.pixel_aspect
        records = []
        images = {
            name: pass_preview(
                name, values, palette=SEG_PALETTE if name == "seg" else None, pixel_aspect=aspect
            )
            for name, values in passes.items()
        }
        if "pose" in self.spec.passes:
            plate_rgb = result.prepared.rgb
            if abs(aspect - 1.0) > 1e-6:
                plate_rgb = resqueeze(plate_rgb, result.prepared.plate.width)
            images["pose"] = pose_preview(
                plate_rgb,
                result.people,
                SKELETON,
                SKELETON_COLORS,
                KEYPOINT_COLORS,
                pixel_aspect=aspect,
            )
        for name, image in images.items():
            uri = self.job.paths.preview(name, number)
            with writing(uri, number):
                preview = write_image(uri, image, self.job.storage_options or None)
            written.append(preview.uri)
            records.append(
                OutputRecord(
                    name, number, "preview", preview.uri, preview.sha256, preview.size,
                    tuple(image.shape), "uint8", None, key,
                )
            )  # fmt: skip
        return records

    # -- helpers -------------------------------------------------------------------------
    def _all_shas(self) -> list[str]:
        return [ref.sha256 for ref in self.job.checkpoints.values()]

    def _provenance(self) -> dict[str, str]:
        provenance = dict(self.job.provenance)
        untrained = []
        for name, ref in self.job.checkpoints.items():
            info = self.predictor.infos[name]
            provenance[f"sapiens2/{name}/model"] = info.label
            provenance[f"sapiens2/{name}/checkpointSha256"] = ref.sha256
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
        )
        provenance["svfx/precision"] = str(self.predictor.dtype).removeprefix("torch.")
        return provenance


def default_focal(height: int, width: int) -> float:
    """Focal length in frame pixels when no pointmap estimate exists: the model's canonical
    camera (focal 768 px at its 1024x768 input) scaled to the frame's long side."""
    return CANONICAL_FOCAL * max(height, width) / max(NATIVE_INPUT_HW)


def _failed(summary: FrameSummary, exc: BaseException, uri: str) -> FrameSummary:
    summary.status = "failed"
    if isinstance(exc, FrameError):
        summary.error = str(exc)
    else:
        summary.error = f"{uri}: frame {summary.frame}: {type(exc).__name__}: {exc}"
    summary.outputs = []
    return summary
