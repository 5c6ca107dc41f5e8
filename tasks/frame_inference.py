"""The chunk worker's model stage: a group of read frames in, their finished arrays on their
way to the host out, with everything in between on the model's device.

Per group (a few frames whose tiles share model batches):

1. each frame's model-encoded RGB is copied up once (non-blocking from pinned memory on
   CUDA) and desqueezed there when the plate is anamorphic;
2. pointmap runs on the whole frames (its focal estimate sets how normal tiles rotate: the
   one value the host reads back before the tiles run), and so does Sapiens v1's relative
   depth: upstream runs it on the whole image, and tiles would each get a depth scale of
   their own;
3. each tiled pass: tiles are cut on the device, run in model batches (tiles of several
   frames share a batch), rotated (normals) and blended into a frame-sized accumulator there;
4. pose, when asked: person boxes from the seg (or matte) foreground, read back as one bool
   mask per frame, then top-down crops on the device (relative depth is normalised over the
   same foreground, on the device);
5. each pass is finished (``tasks.frame_passes``) as soon as it is blended, so a frame's
   29-channel probabilities are dropped before the next pass runs, and the final arrays start
   their copy to the host (``tasks.host_transfer``). The writers wait for them; this stage
   goes on with the next group;
6. motion, when asked: the reader's flow-resolution vectors (``tasks.frame_motion``) are
   uploaded, scaled to plate pixels (of the stored image: an anamorphic plate's u in its
   squeezed pixels) and finished there too (``tasks.frame_passes.finish_motion``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sapiens.arch import CANONICAL_FOCAL, NATIVE_INPUT_HW
from sapiens.predictor import Predictor
from sapiens.seg_classes import BACKGROUND
from schemas import passes as pass_table
from schemas.spec import ShotSpec
from storage.frame import Frame
from storage.previews import MAX_SIDE, thumbnail_size
from tasks.anamorphic import desqueeze
from tasks.blending import FrameBlender
from tasks.frame_passes import MOTION, PREVIEW_PREFIX, finish_motion, finish_pass, preview_sized
from tasks.frame_reading import ReadFrame
from tasks.host_transfer import HostTransfer
from tasks.normal_rotation import rotate_normals, tile_rotation
from tasks.person_boxes import boxes_from_mask
from tasks.person_gate import PersonGate, PersonLook, background_values
from tasks.plate_flow import to_plate
from tasks.tiling import extract_tiles, plan_frame


@dataclass
class InferredFrame:
    """A frame whose model work is queued: its arrays arrive on the host through ``arrays``."""

    read: ReadFrame
    arrays: HostTransfer
    people: list[dict[str, Any]] = field(default_factory=list)
    focal: float | None = None


class FrameInference:
    def __init__(self, spec: ShotSpec, predictor: Predictor, class_names: Sequence[str]) -> None:
        self.spec = spec
        self.predictor = predictor
        self.device = predictor.device
        self.class_names = class_names
        self.gate = PersonGate.for_job(spec, predictor)

    @torch.inference_mode()
    def run(self, group: Sequence[ReadFrame]) -> list[InferredFrame]:
        t0 = time.perf_counter()
        wanted = [pass_table.BY_NAME[name] for name in self.spec.model_passes]
        frames = [self._upload(read) for read in group]
        finished: list[dict[str, Tensor]] = [{} for _ in group]
        masks: list[Tensor | None] = [None] * len(group)
        focals: list[float | None] = [None] * len(group)
        later = []  # whole-frame passes finished once the person's mask is known
        for spec in (p for p in wanted if p.inference == "whole_frame"):
            out = self.predictor.predict_batch(torch.stack(frames), spec.name)
            if spec.values == "points":  # its focal estimate sets how normal tiles rotate
                focals = [float(f) for f in out["focal"].cpu()]
            if spec.values == "relative_depth":
                later.append((spec, out[spec.name]))
                continue
            for i, read in enumerate(group):
                self._finish(read, spec, out[spec.name][i], finished[i])
            del out
        masked = any(p.needs for p in wanted)
        boxes_from = next(
            (n for n in pass_table.PERSON_MASK_FROM if n in self.spec.model_passes), None
        )
        looks = self._look(group, frames)
        for spec in (p for p in wanted if p.inference == "tiled"):
            blended = self._blend(spec, frames, focals, looks, group)
            for i, read in enumerate(group):
                if masked and spec.name == boxes_from:
                    masks[i] = _foreground(spec, blended[i])
                for derived in pass_table.derived_from(spec.name):  # from the same output,
                    if derived.name in self.spec.passes:  # before it is finished
                        self._finish(read, derived, blended[i], finished[i])
                if spec.name in self.spec.passes:
                    self._finish(read, spec, blended[i], finished[i])
            del blended
        for spec, values in later:
            for i, read in enumerate(group):
                self._finish(read, spec, values[i], finished[i], masks[i])
        del later
        posed = any(p.inference == "per_person" for p in wanted)
        written_pose = any(
            pass_table.BY_NAME[n].inference == "per_person" for n in self.spec.passes
        )
        results = []
        for i, read in enumerate(group):
            if MOTION in self.spec.passes:
                finished[i].update(self._motion(read))
            people = self._pose(read, frames[i], masks[i]) if posed else []
            if self.spec.previews and written_pose:
                finished[i][PREVIEW_PREFIX + "plate"] = preview_sized(frames[i], _preview_hw(read))
            results.append(InferredFrame(read, HostTransfer(finished[i]), people, focals[i]))
        share = (time.perf_counter() - t0) / len(group)
        for read in group:
            read.summary.timings["infer"] = share
        return results

    def _upload(self, read: ReadFrame) -> Tensor:
        rgb = torch.from_numpy(read.rgb).to(self.device, non_blocking=True).permute(2, 0, 1)
        aspect = read.plate.pixel_aspect
        return desqueeze(rgb, aspect) if abs(aspect - 1.0) > 1e-6 else rgb

    def _look(
        self, group: Sequence[ReadFrame], frames: Sequence[Tensor]
    ) -> list[PersonLook | None]:
        """Where each frame's people are (None: every tile runs), noted on each frame."""
        t0 = time.perf_counter()
        looks: list[PersonLook | None] = [None] * len(group)
        note = None
        if self.gate is not None:
            looks, note = self.gate.look(frames)
        share = (time.perf_counter() - t0) / len(group)
        for read, look in zip(group, looks, strict=True):
            read.summary.timings["look"] = share
            if note:
                read.summary.notes.append(note)
            if look is not None and not look.found:
                read.summary.notes.append(
                    "person gate: no person found; the tiled passes hold their background"
                )
        return looks

    def _blend(
        self,
        spec: pass_table.Pass,
        frames: Sequence[Tensor],
        focals: Sequence[float | None],
        looks: Sequence[PersonLook | None],
        group: Sequence[ReadFrame],
    ) -> list[Tensor]:
        """One tiled pass of every frame, blended on the device: (C, H, W') each. Where a
        frame has a look, only the tiles near its people run; the rest is background."""
        name = spec.name
        height, width = frames[0].shape[1:]
        tile_hw = self.spec.tiling.tile_hw(self.predictor.infos[name].input_hw)
        overlap = self.spec.tiling.overlap_for(tile_hw)
        plan = plan_frame(height, width, name, tile_hw, overlap)
        fill = None if spec.background is None else background_values(spec, self.class_names)
        gated = any(look is not None for look in looks)
        blenders: list[FrameBlender | None] = [
            FrameBlender.for_plan(plan, len(fill), device=self.device, fill=fill)
            if gated and fill is not None
            else None
            for _ in frames
        ]
        # (frame, tile) pairs across the group, one model batch at a time: tiles of several
        # frames share a batch, and only one batch of outputs is held at once
        work = [
            (i, t)
            for i, look in enumerate(looks)
            for t, tile in enumerate(plan.tiles)
            if look is None or look.touches(tile.box)
        ]
        ran_by_frame = Counter(i for i, _ in work)
        for i, read in enumerate(group):
            ran = ran_by_frame[i]
            tiles = read.summary.tiles
            tiles["run"] = tiles.get("run", 0) + ran
            tiles["skipped"] = tiles.get("skipped", 0) + len(plan.tiles) - ran
        for start in range(0, len(work), self.spec.batch_size):
            batch = work[start : start + self.spec.batch_size]
            tiles = torch.cat([extract_tiles(frames[i], plan, [t]) for i, t in batch])
            values = self.predictor.predict_batch(tiles, name)[name]
            del tiles
            for (i, t), tile_values in zip(batch, values, strict=True):
                tile = plan.tiles[t]
                if spec.values == "unit_vectors":  # camera-space: rotated to the frame's camera
                    focal = focals[i] or default_focal(height, width)
                    rotation = tile_rotation(tile, (height, width), focal)
                    tile_values = rotate_normals(tile_values, rotation)
                blender = blenders[i]
                if blender is None:
                    blender = FrameBlender.for_plan(plan, values.shape[1], device=self.device)
                    blenders[i] = blender
                blender.add(tile, tile_values)
            del values
        return [blender.result() for blender in blenders if blender is not None]

    def _finish(
        self,
        read: ReadFrame,
        spec: pass_table.Pass,
        values: Tensor,
        into: dict[str, Tensor],
        foreground: Tensor | None = None,
    ) -> None:
        preview_hw = _preview_hw(read) if self.spec.previews else None
        into.update(
            finish_pass(
                spec,
                values,
                plate_width=read.plate.width,
                preview_hw=preview_hw,
                class_names=self.class_names,
                foreground=foreground,
            )
        )

    def _motion(self, read: ReadFrame) -> dict[str, Tensor]:
        """The frame's motion vectors, in plate pixels on the device, finished; a side the
        reader has none for is zero (its summary says why)."""
        hw = (read.plate.height, read.plate.width)
        motion = read.motion
        if motion is None:  # not read with motion: say so rather than pass zeros silently
            read.summary.notes.append("zero motion: the reader computed no flow for it")

        def side(flow: np.ndarray | None) -> Tensor:
            if flow is None:
                return torch.zeros((*hw, 2), dtype=torch.float32, device=self.device)
            return to_plate(flow, hw, self.device)

        preview_hw = _preview_hw(read) if self.spec.previews else None
        forward = side(motion.forward if motion else None)
        backward = side(motion.backward if motion else None)
        return finish_motion(forward, backward, preview_hw=preview_hw)

    def _pose(self, read: ReadFrame, frame: Tensor, mask: Tensor | None) -> list[dict[str, Any]]:
        if mask is None:
            return []
        boxes = boxes_from_mask(mask.cpu().numpy(), max_people=self.spec.max_people)
        if len(boxes) == 0:
            return []
        pose = self.predictor.predict_pose(frame, boxes, channels_first=True)
        aspect = read.plate.pixel_aspect
        people = []
        for keypoints, scores, box in zip(pose.keypoints, pose.scores, pose.boxes, strict=True):
            keypoints = np.array(keypoints, dtype=np.float32)
            box = np.array(box, dtype=np.float32)
            if abs(aspect - 1.0) > 1e-6:  # back to plate pixels (x was desqueezed)
                keypoints[:, 0] /= aspect
                box[[0, 2]] /= aspect
            people.append({"box": box, "keypoints": keypoints, "scores": scores})
        return people


def _foreground(spec: pass_table.Pass, blended: Tensor) -> Tensor:
    """The person mask pose boxes come from: not background (labels), or alpha, >= 0.5."""
    if spec.values == "labels":
        return (1.0 - blended[BACKGROUND]) >= 0.5
    return blended[0] >= 0.5


def _preview_hw(read: ReadFrame) -> tuple[int, int]:
    return preview_hw_of(read.plate)


def preview_hw_of(plate: Frame) -> tuple[int, int]:
    """The (h, w) of a frame's previews: square pixels, at most MAX_SIDE on the long side."""
    width, height = thumbnail_size(plate.width, plate.height, MAX_SIDE, plate.pixel_aspect)
    return height, width


def default_focal(height: int, width: int) -> float:
    """Focal length in frame pixels when no pointmap estimate exists: the model's canonical
    camera (focal 768 px at its 1024x768 input) scaled to the frame's long side."""
    return CANONICAL_FOCAL * max(height, width) / max(NATIVE_INPUT_HW)
