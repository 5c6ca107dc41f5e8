"""A chunk of a stabilised version: a per-frame version's passes fused over time along the
plate's motion, written as a new version's frames.

Runs inside a Dask worker, like `tasks.chunk_worker` (which runs and summarises the chunks
of a stabilised job with this runner): no model runs. Frames stream through in order, from
``radius`` frames before the chunk to ``radius`` after it (`ChunkJob.margin`: read for
context, not written), each one: its plate read and checked against the checksum the source
version recorded for it (a plate changed since is refused by name), its passes read back from
the source version (`tasks.version_reading`), pushed into the stabiliser
(`tasks.stabilise.stabiliser`: flow on the host, warps and fusion on the device, each pass by
its rule in the pass table) and the keypoint smoother (`tasks.stabilise.smoothing`). A frame
whose window is complete comes out fused and is finished like a model's output
(`tasks.frame_passes`: the labels, Cryptomatte and `parts` mattes from the fused class
probabilities) and written by the same writer (`tasks.frame_writing`). Memory holds the
window, never the chunk.

A frame that cannot be read (plate or source) fails alone and breaks the chain there, as a
hole does: nothing is fused across it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from schemas import passes as pass_table
from schemas.spec import ShotSpec
from schemas.summaries import ChunkContext, FrameSummary
from storage.errors import FrameError
from storage.pose_json import fragment_uri
from storage.zarr_store import KEYPOINTS
from storage.zarr_writer import ShotStoreWriter, array_uri
from tasks.checkpoints.files import seg_class_names
from tasks.chunk_job import ChunkJob
from tasks.colour import ColourConversion
from tasks.frame_inference import InferredFrame, preview_hw_of
from tasks.frame_passes import (
    NONFINITE_PREFIX,
    PREVIEW_PREFIX,
    finish_motion,
    finish_pass,
    preview_sized,
)
from tasks.frame_reading import FrameReader, ReadFrame, failed
from tasks.frame_writing import FrameWriter
from tasks.model_cache import pick_device
from tasks.provenance import chunk_context, environment
from tasks.stabilise.settings import FusionSettings
from tasks.stabilise.stabiliser import StabilisedFrame, TemporalStabiliser
from tasks.version_reading import VersionFrame, read_version_frame

log = logging.getLogger("svfx.worker")


def stabilising(job: ChunkJob) -> Stabilising:
    """The runner of a stabilised version's chunk: its ``run`` stabilises the chunk's frames
    and never raises for a bad frame (it is recorded)."""
    assert job.source is not None, "a stabilise chunk names its source version"
    spec = ShotSpec.model_validate(job.spec)
    device = pick_device()
    colour = ColourConversion(job.plate_colorspace)
    context = chunk_context(
        job,
        colour,
        environment(device, torch.float32),
        {"temporal_radius": spec.temporal_radius, "device": str(device)},
    )
    return Stabilising(job, spec, device, colour, context)


@dataclass
class _Ready:
    """Arrays already on the host: what `FrameWriter` waits on (`HostTransfer`'s face)."""

    arrays: dict[str, np.ndarray]

    def wait(self) -> dict[str, np.ndarray]:
        return self.arrays


class Stabilising:
    """A stabilised version's chunk: its frames read, fused and written (see the module)."""

    def __init__(
        self,
        job: ChunkJob,
        spec: ShotSpec,
        device: torch.device,
        colour: ColourConversion,
        context: ChunkContext,
    ) -> None:
        assert job.source is not None
        self.job, self.spec, self.device, self.context = job, spec, device, context
        self.source = job.source
        self.classes = seg_class_names(job.checkpoints)
        self.kinds = pass_table.fusion_rules(spec.passes)
        self.store = ShotStoreWriter(job.paths.at(job.paths.zarr))
        shas = [ref.sha256 for ref in job.checkpoints.values()]
        self.reader = FrameReader(spec, colour, job.frame_hw, shas, plate=job.plate)
        self.posed = pass_table.first_of_kind(spec.passes, "keypoints")
        keypoints = job.keypoints or KEYPOINTS
        self.writer = FrameWriter(
            spec,
            job.paths,
            self.store,
            colour,
            context,
            {
                **job.provenance,
                "svfx/temporal": f"stabilised from {spec.source_version}: each frame's passes "
                f"fused with {spec.temporal_radius} frames on each side, warped along the "
                "plate's optical flow (DIS), weighted by flow confidence",
                "svfx/sourceVersion": str(spec.source_version),
            },
            self.classes,
            store_index=dict(zip(job.frames, job.store_indices, strict=True)),
            keypoints=keypoints,
            colour_is_scene_linear=True,
        )
        self.stabiliser = TemporalStabiliser(
            self.kinds, job.frame_hw, device, FusionSettings(radius=spec.temporal_radius)
        )
        self.smoother = None
        if self.posed:
            from tasks.stabilise.smoothing import KeypointSmoother

            self.smoother = KeypointSmoother()
        self.keypoint_count = keypoints

    def run(self) -> list[FrameSummary]:
        wanted = set(self.job.frames)
        uris = dict(zip(self.job.frames, self.job.plate_uris, strict=True))
        uris.update(dict(self.job.margin))
        done: list[FrameSummary] = []
        reads: dict[int, ReadFrame] = {}
        fused: dict[int, StabilisedFrame] = {}
        smoothed: dict[int, list[dict[str, Any]]] = {}
        sources: dict[int, VersionFrame] = {}
        self.pushed: set[int] = set()
        for number in sorted(uris):
            summary = FrameSummary(
                frame=number,
                plate_uri=uris[number],
                status="done",
                plate_fingerprint=self.job.fingerprints.get(number),
            )
            try:
                read, source = self._read(number, uris[number], summary)
            except Exception as exc:
                if number in wanted:
                    done.append(failed(summary, exc, uris[number]))
                else:
                    log.warning("frame %d (context only) unreadable: %s", number, exc)
                continue
            if number in wanted:
                reads[number] = read
                sources[number] = source
            self.pushed.add(number)
            for out in self.stabiliser.push(number, read.rgb, source.passes):
                fused[out.frame] = out
            if self.smoother is not None:
                cut = not self.stabiliser.joined  # the plate's cut: the smoother's too
                people_now = _people_array(source.people, self.keypoint_count)
                for frame, people in self.smoother.push(number, people_now, cut=cut):
                    smoothed[frame] = _people_records(sources.get(frame), people)
            self._write_ready(reads, sources, fused, smoothed, done)
        for out in self.stabiliser.flush():
            fused[out.frame] = out
        if self.smoother is not None:
            for frame, people in self.smoother.flush():
                smoothed[frame] = _people_records(sources.get(frame), people)
        self._write_ready(reads, sources, fused, smoothed, done, final=True)
        return sorted(done, key=lambda s: s.frame)

    def _read(self, number: int, uri: str, summary: FrameSummary) -> tuple[ReadFrame, Any]:
        read = self.reader.read(number, uri, summary)
        source = read_version_frame(
            self.source, number, self.spec.passes, self.classes, self.device
        )
        made_from = source.record.plate_sha256
        if made_from and made_from != summary.plate_sha256:
            raise FrameError(
                uri,
                number,
                f"the plate changed since {self.spec.source_version} was made (its checksum "
                "differs from the one the source frame recorded); submit that version again "
                "first",
            )
        return read, source

    def _write_ready(
        self,
        reads: dict[int, ReadFrame],
        sources: dict[int, Any],
        fused: dict[int, StabilisedFrame],
        smoothed: dict[int, list[dict[str, Any]]],
        done: list[FrameSummary],
        final: bool = False,
    ) -> None:
        for number in sorted(fused):
            if number not in reads:  # a context frame: fused for its neighbours only
                del fused[number]
                continue
            if self.smoother is not None and number not in smoothed and not final:
                continue
            out = fused.pop(number)
            read = reads.pop(number)
            source = sources.pop(number)
            people = smoothed.pop(number, source.people)
            read.summary.sources = self._made_from(number)
            try:
                arrays = self._finish(read, out)
            except Exception as exc:
                done.append(failed(read.summary, exc, read.uri))
                continue
            done.append(self.writer.write(InferredFrame(read, _Ready(arrays), people)))  # type: ignore[arg-type]

    def _made_from(self, number: int) -> list[tuple[str, int]]:
        """The source outputs a frame was made from: each pass's EXR, Zarr region and pose
        fragment of the frames of its window that were read (`FrameSummary.sources`)."""
        radius = self.spec.temporal_radius
        posed = self.smoother.settings.radius if self.smoother is not None else -1
        made: list[tuple[str, int]] = []
        arrays = [a.name for a in pass_table.zarr_arrays(self.spec.passes)]
        for frame in sorted(self.pushed):
            if abs(frame - number) <= radius:
                made.append((self.source.exr(frame), frame))
                made += [(array_uri(self.source.zarr, name), frame) for name in arrays]
            if abs(frame - number) <= posed:  # the keypoint smoother's own window
                made.append((fragment_uri(self.source.pose_fragments, frame), frame))
        return made

    @torch.inference_mode()
    def _finish(self, read: ReadFrame, out: StabilisedFrame) -> dict[str, np.ndarray]:
        """The fused passes as the arrays the writer stores (`tasks.frame_passes`)."""
        t0 = time.perf_counter()
        preview_hw = preview_hw_of(read.plate) if self.spec.previews else None
        width = read.plate.width
        arrays: dict[str, Tensor] = {}
        for name in self.spec.passes:
            spec = pass_table.BY_NAME[name]
            if spec.fusion is None:
                continue
            # a pass not fused itself is made again from the fused pass it is made from
            # (parts: from the fused class probabilities)
            values = out.passes[name if name in out.passes else pass_table.made_from(name)]
            if spec.values in ("relative_depth", "class_groups") and name in out.passes:
                arrays.update(_as_stored(spec, values, preview_hw))
                continue
            arrays.update(
                finish_pass(
                    spec,
                    values,
                    plate_width=width,
                    preview_hw=preview_hw,
                    class_names=self.classes,
                )
            )
        if any(pass_table.BY_NAME[n].values == "motion" for n in self.spec.passes):
            arrays.update(self._motion(out, preview_hw))
        if self.posed and preview_hw is not None:
            rgb = torch.from_numpy(read.rgb).to(self.device).permute(2, 0, 1)
            arrays[PREVIEW_PREFIX + "plate"] = preview_sized(rgb, preview_hw)
        host = {k: v.cpu().numpy() for k, v in arrays.items()}
        read.summary.timings["stabilise"] = time.perf_counter() - t0
        return host

    def _motion(
        self, out: StabilisedFrame, preview_hw: tuple[int, int] | None
    ) -> dict[str, Tensor]:
        """The stabiliser's plate-pixel flow to each neighbour as the motion pass (zero on a
        side with a cut, a hole or the end of the frames), finished as the chunk worker's."""
        height, width = self.job.frame_hw
        zero = torch.zeros((height, width, 2), dtype=torch.float32, device=self.device)
        forward = out.forward if out.forward is not None else zero
        backward = out.backward if out.backward is not None else zero
        return finish_motion(forward, backward, preview_hw=preview_hw)


def _as_stored(
    spec: pass_table.Pass, values: Tensor, preview_hw: tuple[int, int] | None
) -> dict[str, Tensor]:
    """A pass fused in its stored form, kept so: relative depth (already normalised over the
    person, -1 elsewhere) and `parts` mattes fused as values (no seg in the version)."""
    low, high = torch.aminmax(values)
    out = {NONFINITE_PREFIX + spec.name: ~(torch.isfinite(low) & torch.isfinite(high))}
    if spec.values == "relative_depth":  # fused across the silhouette: below 0 is not the
        depth = values[0].float()  # person (-1), the rest stays in 0..1
        out[spec.name] = torch.where(depth < 0, -1.0, depth.clamp(max=1.0))
    else:
        out[spec.name] = values.clamp(0.0, 1.0).to(torch.float16)
    if preview_hw is not None:
        out[PREVIEW_PREFIX + spec.name] = preview_sized(values, preview_hw)
    return out


def _people_array(people: Sequence[dict[str, Any]], keypoints: int) -> np.ndarray:
    """(P, K, 3): x, y, score per person and keypoint."""
    if not people:
        return np.zeros((0, keypoints, 3), dtype=np.float32)
    rows = []
    for person in people:
        xy = np.asarray(person["keypoints"], np.float32)
        scores = np.asarray(person["scores"], np.float32)[:, None]
        rows.append(np.concatenate([xy, scores], axis=1))
    return np.stack(rows)


def _people_records(source: Any, smoothed: np.ndarray) -> list[dict[str, Any]]:
    """The smoothed keypoints back as the pose records the writer takes; each person keeps
    the box of the source frame's person nearest to it (the smoother may order people
    differently), or the box around its keypoints when the source frame has none."""
    found = list(source.people) if source is not None else []
    people = []
    for person in smoothed:
        if not np.isfinite(person[:, :2]).any():
            continue
        box = _nearest_box(person, found) if found else _box_of(person)
        people.append({"box": box, "keypoints": person[:, :2], "scores": person[:, 2]})
    return people


def _nearest_box(person: np.ndarray, found: Sequence[dict[str, Any]]) -> np.ndarray:
    def distance(other: dict[str, Any]) -> float:
        gap = np.linalg.norm(np.asarray(other["keypoints"], np.float32) - person[:, :2], axis=1)
        return float(np.nanmean(gap)) if np.isfinite(gap).any() else float("inf")

    return np.asarray(min(found, key=distance)["box"], dtype=np.float32)


def _box_of(person: np.ndarray) -> np.ndarray:
    points = person[np.isfinite(person[:, 0]), :2]
    return np.array([*points.min(0), *points.max(0)], dtype=np.float32)
