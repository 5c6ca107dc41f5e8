"""The chunk worker's last stage, on a bounded pool of writer threads: a frame's finished
arrays, once on the host, become its files.

Per frame, the writes are ordered so that what is on disk never claims more than is there:
the frame's arrays are checked first (a pass the model made NaN or Inf fails the frame before
anything is touched), the frame's Zarr commit mark is zeroed, then the EXR, the Zarr regions,
the pose fragment and the previews are written, then the commit mark is set and the frame
record (``tasks.frame_records``) written last. A frame that fails while writing removes the
files this attempt wrote, so a failed frame leaves no output that the catalog does not
describe.

The host's own per-pixel work here is what cannot run on the device: albedo's OpenColorIO
transform back to scene-linear (and its conversion to half), interleaving the normal and
pointmap planes for the Zarr arrays, and the codecs (ZIP in OpenEXR's thread pool, Blosc in
Zarr's). Everything else arrives in its final type.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sapiens.keypoints import keypoint_colors_for, skeleton_for
from schemas import passes as pass_table
from schemas.spec import ShotSpec
from schemas.summaries import ChunkContext, FrameSummary, OutputRecord
from storage.errors import FrameError, writing
from storage.exr_writer import part_channels, write_passes_exr
from storage.pose_json import write_pose_fragment
from storage.previews import pass_preview, pose_preview, write_image
from storage.zarr_store import KEYPOINTS
from storage.zarr_writer import ShotStoreWriter
from tasks.colour import ColourConversion
from tasks.frame_inference import InferredFrame
from tasks.frame_passes import ID_SUFFIX, NONFINITE_PREFIX, PREVIEW_PREFIX, RANKS_SUFFIX
from tasks.frame_reading import failed
from tasks.frame_records import remove_file, write_frame_record
from tasks.output_paths import ShotOutputPaths

log = logging.getLogger("svfx.worker")


def _seg_palette(classes: int) -> list[tuple[int, int, int]]:
    """Black background, then evenly spaced pastel hues (preview only)."""
    colours = [(0, 0, 0)]
    for i in range(classes - 1):
        phase = 2 * np.pi * i / (classes - 1)
        rgb = [0.55 + 0.45 * np.cos(phase + offset) for offset in (0.0, 2.1, 4.2)]
        colours.append(tuple(round(255 * float(v)) for v in rgb))  # type: ignore[arg-type]
    return colours


@dataclass
class _Attempt:
    """What writing a frame has done so far: removed again if the frame fails."""

    written: list[str] = field(default_factory=list)  # files this attempt committed
    retracted: bool = False  # the frame's Zarr commit mark was zeroed


class FrameWriter:
    def __init__(
        self,
        spec: ShotSpec,
        paths: ShotOutputPaths,
        store: ShotStoreWriter,
        colour: ColourConversion,
        context: ChunkContext,
        provenance: dict[str, str],
        class_names: Sequence[str],
        *,
        store_index: dict[int, int],
        keypoints: int = KEYPOINTS,
        colour_is_scene_linear: bool = False,
    ) -> None:
        self.spec = spec
        self.paths = paths
        self.store = store
        self.colour = colour
        self.context = context
        self.provenance = provenance
        self.class_names = list(class_names)
        self.palette = _seg_palette(len(self.class_names))
        self.store_index = store_index  # frame number -> index in the shot's Zarr arrays
        self.zarr_lock = threading.Lock()  # writers to one shard must not overlap
        self.keypoints = keypoints  # the pose model's
        # colour passes arrive scene-linear already (a stabilised version fuses them so),
        # else in the model's encoding, converted here
        self.colour_is_scene_linear = colour_is_scene_linear
        self.passes = [pass_table.BY_NAME[name] for name in spec.passes]
        self.layers = pass_table.exr_layers(spec.passes)

    def write(self, frame: InferredFrame) -> FrameSummary:
        """Write every output of the frame; a frame that fails is returned failed, with
        what it had written removed."""
        read = frame.read
        attempt = _Attempt()
        try:
            self._write_outputs(frame, attempt)
        except Exception as exc:
            if attempt.retracted:
                read.summary.discarded = self._discard(read.number, attempt.written)
            return failed(read.summary, exc, read.uri)
        return read.summary

    def _discard(self, number: int, written: list[str]) -> list[str]:
        """Remove what a failed frame's attempt wrote (its Zarr mark is already zeroed), so
        the disk holds nothing the catalog does not describe; returns the outputs whose old
        catalog rows no longer hold (the files and the Zarr regions)."""
        for uri in [*written, self.paths.frame_record(number)]:
            problem = remove_file(self.paths.at(uri))
            if problem:
                log.warning("frame %d: could not remove a partial output: %s", number, problem)
        arrays = [self.store.array_uri(name) for name in self.store.arrays]
        return [*written, *arrays]

    def _write_outputs(self, frame: InferredFrame, attempt: _Attempt) -> None:
        """Write the frame's outputs in the order that keeps the disk honest: arrays checked,
        Zarr commit mark zeroed, EXR, Zarr regions, pose fragment, previews, then (with a
        cache key) the commit mark set and the frame record written."""
        read = frame.read
        summary, number = read.summary, read.number
        t0 = time.perf_counter()
        arrays = frame.arrays.wait()
        _refuse_nonfinite(read.uri, number, arrays)
        index = self.store_index[number]
        attempt.retracted = True
        with writing(self.paths.zarr, number), self.zarr_lock:
            self.store.retract(index)  # from here on the store does not claim this frame
        colour = {  # OpenColorIO runs on the CPU only
            p.name: self._scene_linear(arrays[p.name]).astype(np.float16)
            for p in self.passes
            if p.scene_linear and p.name in arrays
        }
        parts, blocks = exr_parts_and_zarr_blocks(self.passes, arrays, colour)
        key = summary.cache_key or ""
        records = self._write_exr(frame, parts, key, attempt.written)
        t1 = time.perf_counter()
        for spec in (p for p in self.passes if p.values == "keypoints"):
            blocks[spec.name] = frame.people
        records += self._write_zarr(number, index, blocks, key)
        t2 = time.perf_counter()
        records += self._write_pose(frame, key, attempt.written)
        if self.spec.previews:
            records.extend(self._previews(frame, arrays, key, attempt.written))
        summary.outputs = records
        summary.timings["write_exr"] = t1 - t0
        summary.timings["write_zarr"] = t2 - t1
        summary.timings["write_other"] = time.perf_counter() - t2
        if key:  # every output is on disk: the store may claim the frame, then the record
            with writing(self.paths.zarr, number), self.zarr_lock:
                self.store.commit(index, key)
            record = self.paths.frame_record(number)
            with writing(record, number):
                write_frame_record(self.paths.at(record), summary, self.context)

    def _write_exr(
        self,
        frame: InferredFrame,
        parts: dict[str, dict[str, np.ndarray]],
        key: str,
        written: list[str],
    ) -> list[OutputRecord]:
        """The frame's EXR (none without parts) and a record per layer written in it."""
        if not parts:
            return []
        number, plate = frame.read.number, frame.read.plate
        exr_uri = self.paths.exr(number)
        with writing(exr_uri, number):
            exr = write_passes_exr(
                self.paths.at(exr_uri),
                plate,
                self.layers,
                parts,
                self.provenance,
                class_names=self.class_names,
                scene_linear_id=self.colour.albedo_interop_id,
                layout=self.spec.exr_layout,
            )
        written.append(exr.uri)
        records = []
        for layer in (layer for layer in self.layers if layer.part in parts):
            spec = pass_table.pass_of_part(layer.part)
            records.append(
                OutputRecord(
                    spec.name, number, "exr", exr.uri, exr.sha256, exr.size,
                    self._recorded_shape(spec, plate.height, plate.width), layer.dtype,
                    layer.part, key,
                )
            )  # fmt: skip
        return records

    def _write_zarr(
        self, number: int, index: int, blocks: dict[str, np.ndarray], key: str
    ) -> list[OutputRecord]:
        """The frame's region of each Zarr array and a record per region, its sha256 that of
        exactly the bytes stored."""
        records = []
        for name, block in self.store.prepare_frame(index, blocks).items():
            with writing(self.store.array_uri(name), number), self.zarr_lock:
                self.store.write_prepared(index, {name: block})
            region = np.ascontiguousarray(block)  # exactly the bytes stored
            records.append(
                OutputRecord(
                    name, number, "zarr", self.store.array_uri(name),
                    hashlib.sha256(memoryview(region)).hexdigest(), region.nbytes,
                    tuple(region.shape), str(region.dtype), None, key,
                )
            )  # fmt: skip
        return records

    def _write_pose(self, frame: InferredFrame, key: str, written: list[str]) -> list[OutputRecord]:
        """The frame's pose fragment (one per pass with a pose side file) and its record."""
        number = frame.read.number
        records = []
        for spec in (p for p in self.passes if p.side_file == "pose_json"):
            fragments = self.paths.pose_fragments
            with writing(f"{fragments}/{number}", number):
                fragment = write_pose_fragment(self.paths.at(fragments), number, frame.people)
            written.append(fragment.uri)
            records.append(
                OutputRecord(
                    spec.name, number, "pose_json", fragment.uri, fragment.sha256, fragment.size,
                    (len(frame.people), self.keypoints, 3), "json", None, key,
                )
            )  # fmt: skip
        return records

    def _scene_linear(self, values: np.ndarray) -> np.ndarray:
        if self.colour_is_scene_linear:
            return values
        return self.colour.albedo_to_scene_linear(values, inplace=True)

    def _recorded_shape(self, spec: pass_table.Pass, height: int, width: int) -> tuple[int, ...]:
        """A pass's shape as the catalog records it for its EXR: that of its Zarr array's
        frame (labels: its class probabilities)."""
        if spec.values == "labels":
            return (height, width, len(self.class_names))
        assert spec.zarr is not None
        sizes = {"H": height, "W": width}
        return tuple(sizes[d] if isinstance(d, str) else d for d in spec.zarr.trailing)

    def _previews(
        self, frame: InferredFrame, arrays: dict[str, np.ndarray], key: str, written: list[str]
    ) -> list[OutputRecord]:
        """Previews from the preview-sized arrays the device made (square pixels already)."""
        number = frame.read.number
        images = {}
        for spec in self.passes:
            small = arrays.get(PREVIEW_PREFIX + spec.name)
            if small is None or spec.preview is None or spec.preview == "keypoints":
                continue
            if spec.scene_linear and not self.colour_is_scene_linear:
                small = self.colour.albedo_to_scene_linear(small)
            images[spec.name] = pass_preview(spec.preview, small, palette=self.palette)
        posed = [p.name for p in self.passes if p.preview == "keypoints"]
        if posed and PREVIEW_PREFIX + "plate" in arrays:
            plate = frame.read.plate
            skeleton, colours = skeleton_for(self.keypoints)
            images[posed[0]] = pose_preview(
                arrays[PREVIEW_PREFIX + "plate"],
                frame.people,
                skeleton,
                colours,
                keypoint_colors_for(self.keypoints),
                frame_size=(plate.width, plate.height),
            )
        records = []
        for name, image in images.items():
            uri = self.paths.preview(name, number)
            with writing(uri, number):
                preview = write_image(self.paths.at(uri), image)
            written.append(preview.uri)
            records.append(
                OutputRecord(
                    name, number, "preview", preview.uri, preview.sha256, preview.size,
                    tuple(image.shape), "uint8", None, key,
                )
            )  # fmt: skip
        return records


def _refuse_nonfinite(uri: str, number: int, arrays: dict[str, np.ndarray]) -> None:
    """A FrameError naming the passes the model made NaN or Inf (their flags among the
    frame's arrays), before anything of the frame is written."""
    bad = [
        name.removeprefix(NONFINITE_PREFIX)
        for name, flag in arrays.items()
        if name.startswith(NONFINITE_PREFIX) and bool(flag)
    ]
    if bad:
        raise FrameError(
            uri,
            number,
            f"the model's {', '.join(bad)} output holds NaN or Inf values; "
            "nothing of this frame was written",
        )


def exr_parts_and_zarr_blocks(
    passes: Sequence[pass_table.Pass],
    arrays: dict[str, np.ndarray],
    colour: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A frame's EXR parts (channel planes by part) and Zarr blocks (by pass) from its arrays
    as the device finished them (``tasks.frame_passes``); ``colour`` holds each colour pass
    in its final form, scene-linear half (H, W, 3). Keypoint passes have neither."""
    colour = colour or {}
    parts: dict[str, dict[str, np.ndarray]] = {}
    blocks: dict[str, np.ndarray] = {}
    for spec in passes:
        name = spec.name
        if spec.scene_linear:
            if name not in colour:
                continue
            values = colour[name]
            blocks[name] = values
            for layer in spec.exr:  # OpenEXR writes <part>.R/G/B from the (H, W, 3) array
                parts[layer.part] = {layer.part: values}
            continue
        if name not in arrays:
            continue
        values = arrays[name]
        for layer in spec.exr:
            if layer.cryptomatte:
                planes = arrays[name + RANKS_SUFFIX]
                names = part_channels(layer, 2 * (len(planes) // 4))
                parts[layer.part] = dict(zip(names, planes, strict=True))
            elif layer.class_names:
                parts[layer.part] = {layer.channels[0]: arrays[name + ID_SUFFIX].view(np.uint32)}
            elif values.ndim == 2:
                parts[layer.part] = {layer.channels[0]: values}
            else:
                planes = layer.planes or tuple(range(len(layer.channels)))
                parts[layer.part] = {
                    c: values[i] for c, i in zip(layer.channels, planes, strict=True)
                }
        planar = spec.values != "labels" and values.ndim == 3
        blocks[name] = _channels_last(values) if planar else values
    return parts, blocks


def _channels_last(planes: np.ndarray) -> np.ndarray:
    """(C, H, W) planes as the (H, W, C) block a Zarr array of the pass stores."""
    return np.ascontiguousarray(np.moveaxis(planes, 0, -1))
