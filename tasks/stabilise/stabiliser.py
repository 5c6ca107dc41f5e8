"""The stabiliser: a shot's frames streamed in, each frame's dense passes fused with its
neighbours' passes warped to it by the plate's motion (``tasks.plate_flow``) over a window of
``FusionSettings.radius`` frames each side, and streamed out (``tasks.stabilise.window``).

The flow to a neighbour two or more frames away is the composition of the adjacent flows (their
confidences multiplied along the path), at flow resolution: one DIS pair per frame
(``FusionSettings.direct_flow`` runs DIS between the two frames instead). The fusion runs at a
reduced size, ``FusionSettings.max_side`` on the long side (the flow's own resolution; class
probabilities at ``label_reduction`` times less), each size a group of passes
(``TemporalStabiliser.groups``) with its own samples, edges and plate-size pixels, and is lifted
back to the plate's size (``tasks.stabilise.lift``); a plate no larger is fused at its own size.
A hole in the frame numbers or a cut (``plate_flow.pair_motion``) closes the chain: nothing is
fused across it, and a run of frames shorter than ``min_frames`` comes back unchanged. Why and
what it costs: docs/design/stabilisation.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from schemas.passes import FUSIONS
from tasks.plate_flow import (
    DEFAULT_FLOW,
    FlowSettings,
    can_flow,
    confidence_to_plate,
    flow_image,
    pair_motion,
    reduced_size,
    to_plate,
)
from tasks.stabilise.fusion import Frame, Fused, Neighbour, fuse_frame, fuse_pixels
from tasks.stabilise.lift import edge_blocks, lift_frame, plate_pixels, reduce_pass
from tasks.stabilise.rules import all_finite
from tasks.stabilise.settings import DEFAULT_FUSION, FusionSettings
from tasks.stabilise.window import Window


@dataclass
class StabilisedFrame:
    """One frame out: its passes fused (same names, shapes, units, float32 as pushed; the pushed
    tensors themselves when the fusion ran at a reduced size) and the
    plate-pixel flow to its neighbours, (H, W, 2) x then y, y down; None across a cut or a
    hole and at the ends of what was pushed."""

    frame: int
    passes: dict[str, Tensor]
    forward: Tensor | None
    backward: Tensor | None


@dataclass
class _Link:
    """A neighbour of the centre at flow resolution: what ``Neighbour`` is made of at each
    fusion size."""

    frame: Frame
    distance: int
    flow: Tensor
    confidence: Tensor
    kernel: float

    def at_size(self, hw: tuple[int, int], device: torch.device) -> Neighbour:
        weight = confidence_to_plate(self.confidence, hw, device)
        grid = sampling_grid(to_plate(self.flow, hw, device))
        return Neighbour(
            self.frame, self.distance, grid, weight * self.kernel, self.flow, self.confidence,
            self.kernel,
        )  # fmt: skip


class TemporalStabiliser:
    """Streams a shot's frames in, stabilised frames out (see the module).

    ``kinds``: pass name -> the rule it is fused by (``schemas.passes.FUSIONS``, as
    ``schemas.passes.fusion_rules`` gives them); ``plate_hw``: the passes' (H, W);
    ``device``: where the passes live and the work runs."""

    def __init__(
        self,
        kinds: Mapping[str, str],
        plate_hw: tuple[int, int],
        device: torch.device | str,
        settings: FusionSettings = DEFAULT_FUSION,
        flow: FlowSettings = DEFAULT_FLOW,
    ) -> None:
        unknown = {name: kind for name, kind in kinds.items() if kind not in FUSIONS}
        if unknown:
            raise ValueError(f"no fusion rule for {unknown}; kinds: {', '.join(FUSIONS)}")
        self.kinds = dict(kinds)
        self.plate_hw = (int(plate_hw[0]), int(plate_hw[1]))
        # the passes fused at each size: (size, names), the plate's size for a plate no larger
        sizes: dict[tuple[int, int], list[str]] = {}
        for name, kind in self.kinds.items():
            sizes.setdefault(reduced_size(self.plate_hw, settings.side(kind)), []).append(name)
        self.groups = [(hw, tuple(names)) for hw, names in sizes.items()]
        self._size_of = {name: hw for hw, names in self.groups for name in names}
        self.device = torch.device(device)
        self.settings = settings
        self.flow = flow
        self._window: Window[Frame] = Window(settings.radius)  # the current run of frames
        self._run_length = 0  # frames in the current run, trimmed ones included
        self._last_image: np.ndarray | None = None
        # whether the frame pushed last continues the run of the one before it (False after
        # a cut or a hole, and for the first): what a keypoint smoother beside it is told
        self.joined = False
        self._direct: dict[tuple[int, int], tuple[Tensor, Tensor, Tensor, Tensor] | None] = {}
        # of the pixels of the frames fused so far (each group's counted), how many were fused
        # at the plate's size (all of them when the fusion runs at that size): what the
        # reduction saved
        self.pixels_fused = 0
        self.pixels_at_plate_size = 0

    def push(
        self, frame: int, plate_rgb: np.ndarray, passes: Mapping[str, Tensor]
    ) -> list[StabilisedFrame]:
        """Add a frame (frames in increasing order): its plate (H, W, 3) in the model's
        encoding and its passes, (C, H, W) float32 on the device. Returns, in order, the
        frames no later frame needs any more: a frame comes out once the ``radius`` frames
        after it are fused (``flush`` returns the rest). When the fusion runs at a reduced
        size the stabiliser owns the pushed tensors until their frame comes out: the fused
        frame is written into them (a 4K frame's seg is 1 GB; push copies where they are
        still wanted as they were)."""
        self._check(frame, passes)
        image = flow_image(plate_rgb, self.flow)
        full = {name: passes[name].contiguous() for name in self.kinds}
        reduced = {
            name: values
            if self._size_of[name] == self.plate_hw
            else reduce_pass(values, self._size_of[name], self.kinds[name])
            for name, values in full.items()
        }
        # a mean over a non-finite pixel is not finite: the reduced pass tells, in a sixteenth
        # of the time at a 4x reduction
        nonfinite = frozenset(n for n in self.kinds if not all_finite(reduced[n]))
        entry = Frame(frame, full, reduced, nonfinite, image)
        out: list[StabilisedFrame] = []
        previous = self._window.last
        joined = False
        if (
            previous is not None
            and frame == previous.frame + 1
            and self._last_image is not None
            and can_flow(image)  # a plate too small for flow: nothing is fused
        ):
            motion = pair_motion(self._last_image, image, self.flow)
            if not motion.cut:
                previous.forward = self._tensor(motion.forward)
                previous.forward_confidence = self._tensor(motion.confidence_a)
                entry.backward = self._tensor(motion.backward)
                entry.backward_confidence = self._tensor(motion.confidence_b)
                joined = True
        if previous is not None and not joined:
            out += self._close_run()
        self.joined = joined
        self._window.frames.append(entry)
        self._run_length += 1
        self._last_image = image
        self._ready(closing=False)
        out += self._release(closing=False)
        return out

    def flush(self) -> list[StabilisedFrame]:
        """The frames not returned yet, at the end of what was pushed."""
        out = self._close_run()
        self._last_image = None
        return out

    def _check(self, frame: int, passes: Mapping[str, Tensor]) -> None:
        self._window.check_order(frame)
        missing = set(self.kinds) - set(passes)
        if missing:
            raise ValueError(f"frame {frame}: passes {sorted(missing)} missing")
        for name, kind in self.kinds.items():
            values = passes[name]
            single = kind in ("alpha", "relative_depth")
            if (
                values.ndim != 3
                or tuple(values.shape[1:]) != self.plate_hw
                or (single and values.shape[0] != 1)
            ):
                raise ValueError(
                    f"frame {frame}: pass {name} is {tuple(values.shape)}, expected "
                    f"({'1' if single else 'C'}, {self.plate_hw[0]}, {self.plate_hw[1]})"
                )

    def _tensor(self, array: np.ndarray) -> Tensor:
        return torch.as_tensor(array, dtype=torch.float32, device=self.device)

    def _close_run(self) -> list[StabilisedFrame]:
        self._ready(closing=True)
        out = self._release(closing=True)  # the whole run: the window is empty again
        self._run_length = 0
        self._direct = {}
        return out

    def _ready(self, closing: bool) -> None:
        """Fuse the frames whose window is complete (all of them when ``closing``); each is
        returned later, by ``_release``."""
        for index in self._window.ready(closing):
            if self._run_length >= self.settings.min_frames:
                self._window.frames[index].fused = self._fuse(index)

    def _release(self, closing: bool) -> list[StabilisedFrame]:
        """The fused frames no frame still to be fused needs as a neighbour (those more than
        ``radius`` before the next one; all when ``closing``), out of the window. Only now is
        a reduced fusion lifted, into the frame's own pushed tensors: until then its
        neighbours sample them as they were pushed."""
        return [self._finished(entry) for entry in self._window.release(closing)]

    def _plate_flows(self, entry: Frame) -> tuple[Tensor | None, Tensor | None]:
        def plate(flow: Tensor | None) -> Tensor | None:
            return None if flow is None else to_plate(flow, self.plate_hw, self.device)

        return plate(entry.forward), plate(entry.backward)

    def _finished(self, entry: Frame) -> StabilisedFrame:
        passes = dict(entry.passes)
        for fused in entry.fused or []:
            if fused.pixels is None:  # fused at the plate's size
                passes.update(fused.passes)
                continue
            names = list(fused.passes)
            lift_frame(
                {n: entry.passes[n] for n in names},
                {n: entry.reduced[n] for n in names},
                fused.passes,
                self.kinds,
            )
            for name, values in (fused.exact or {}).items():
                entry.passes[name].view(values.shape[0], -1).index_copy_(1, fused.pixels, values)
        entry.fused = None
        forward, backward = self._plate_flows(entry)
        return StabilisedFrame(entry.frame, passes, forward, backward)

    def _fuse(self, index: int) -> list[Fused] | None:
        """The centre's fusion, group by group: at the plate's size, or at the group's reduced
        size with the pixels near edges fused at the plate's size (see the module); None
        without neighbours."""
        centre = self._window.frames[index]
        links = self._links(index)
        if not links:
            return None
        area = self.plate_hw[0] * self.plate_hw[1]
        out = []
        for hw, names in self.groups:
            kinds = {name: self.kinds[name] for name in names}
            neighbours = [link.at_size(hw, self.device) for link in links]
            reduced = {name: centre.reduced[name] for name in names}
            fused = fuse_frame(reduced, centre.nonfinite, neighbours, kinds, self.settings)
            self.pixels_fused += area
            if hw == self.plate_hw:
                self.pixels_at_plate_size += area
                out.append(Fused(fused))
                continue
            pixels = plate_pixels(edge_blocks(reduced, kinds, self.settings), self.plate_hw)
            self.pixels_at_plate_size += int(pixels.numel())
            exact = None
            if pixels.numel():
                full = {name: centre.passes[name] for name in names}
                exact = fuse_pixels(
                    full, centre.nonfinite, pixels, neighbours, kinds, self.settings
                )
            out.append(Fused(fused, pixels, exact))
        return out

    def _links(self, index: int) -> list[_Link]:
        """The window's other frames, each with the flow from the centre to it (adjacent flows
        composed, or direct) and its confidence, at flow resolution."""
        out = []
        for step, attribute in ((1, "forward"), (-1, "backward")):
            flow: Tensor | None = None
            confidence: Tensor | None = None
            for distance in range(1, self.settings.radius + 1):
                at = index + step * (distance - 1)
                there = index + step * distance
                if there < 0 or there >= len(self._window.frames):
                    break
                link = getattr(self._window.frames[at], attribute)
                link_confidence = getattr(self._window.frames[at], attribute + "_confidence")
                if link is None or link_confidence is None:
                    break
                if flow is None or confidence is None:
                    flow, confidence = link, link_confidence
                elif self.settings.direct_flow:
                    frames = self._window.frames
                    direct = self._direct_motion(frames[index], frames[there])
                    if direct is None:
                        break
                    flow, confidence = direct
                else:
                    flow, confidence = compose(flow, confidence, link, link_confidence)
                kernel = self.settings.kernel(distance)
                out.append(_Link(self._window.frames[there], distance, flow, confidence, kernel))
        return out

    def _direct_motion(self, centre: Frame, there: Frame) -> tuple[Tensor, Tensor] | None:
        """DIS flow from the centre to a frame two or more away, and its confidence: one pair
        serves both frames (kept until the earlier leaves the window); None if it is a cut."""
        first, last = sorted((centre, there), key=lambda f: f.frame)
        key = (first.frame, last.frame)
        if key not in self._direct:
            motion = pair_motion(first.image, last.image, self.flow)
            self._direct[key] = (
                None
                if motion.cut
                else (
                    self._tensor(motion.forward),
                    self._tensor(motion.confidence_a),
                    self._tensor(motion.backward),
                    self._tensor(motion.confidence_b),
                )
            )
            oldest = self._window.frames[0].frame
            for stale in [k for k in self._direct if k[0] < oldest]:
                del self._direct[stale]
        found = self._direct[key]
        if found is None:
            return None
        return (found[0], found[1]) if centre is first else (found[2], found[3])


def compose(
    first: Tensor, first_confidence: Tensor, then: Tensor, then_confidence: Tensor
) -> tuple[Tensor, Tensor]:
    """The flow a -> c from a -> b (``first``) and b -> c (``then``), all (h, w, 2) at one
    resolution, and its confidence: a's confidence times b's where a's vector lands (0 where
    it lands outside b)."""
    grid = sampling_grid(first)
    fields = torch.cat([then, then_confidence[..., None]], dim=-1).permute(2, 0, 1)[None]
    landed = F.grid_sample(fields, grid, mode="bilinear", padding_mode="border", align_corners=True)
    landed = landed[0].permute(1, 2, 0)
    inside = (grid[0].abs() <= 1.0).all(dim=-1)
    flow = first + landed[..., :2]
    confidence = first_confidence * landed[..., 2] * inside
    return flow, confidence


def sampling_grid(flow: Tensor) -> Tensor:
    """(1, h, w, 2) grid_sample positions (align_corners=True) of each pixel plus its vector."""
    h, w = flow.shape[:2]
    xs = torch.arange(w, dtype=torch.float32, device=flow.device)
    ys = torch.arange(h, dtype=torch.float32, device=flow.device)
    grid = flow.clone()
    grid[..., 0].add_(xs).mul_(2.0 / max(w - 1, 1)).sub_(1.0)
    grid[..., 1].add_(ys[:, None]).mul_(2.0 / max(h - 1, 1)).sub_(1.0)
    return grid[None]
