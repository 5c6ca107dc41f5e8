"""Flow-guided temporal stabilisation of a shot's dense passes, in torch on the passes' device.

Each frame's pass is fused with its neighbours' passes warped to it by the plate's motion
(``tasks.plate_flow``), over a window of ``FusionSettings.radius`` frames each side. Frames
stream through: a frame is fused once its last neighbour is pushed and comes out once no frame
still to be fused needs it (``radius`` frames later), and memory holds that window (``2 *
radius + 1`` frames of passes, their flow-resolution motion), never the shot.

Why a radius of 2 (five frames). The errors a per-frame network makes are, frame to frame,
close to independent: averaging N frames divides them by about sqrt(N). Three frames give
0.58 at best, too close to the 0.6 goal once the warps' own error is added; five give 0.45
(0.46 with the temporal kernel's weights; ``bench.temporal`` measures 0.37-0.50 on a static
shot, where the flow is exact); seven 0.38, but each step adds a flow over a longer reach
(less exact, less often confident: the surface has turned meanwhile), 40% more warping and
memory, and a wider margin for chunks. Measured on the moving synthetic shot: radius 3 moves
the error ratios by at most 0.03 (normals 0.63 -> 0.61, albedo 0.51 -> 0.48, seg 0.39 ->
0.40): the rest is what motion changes in the passes themselves (a limb turns between frames).

Weights. Each sample's weight is the product of
- the flow's confidence: the forward-backward consistency of the centre frame's pixels towards
  that neighbour (0 where the pixel is hidden there or leaves the frame: no ghosting at
  occlusions);
- a temporal kernel, exp(-d^2 / 2 sigma^2) over the frame distance d: near frames are warped
  more exactly;
- the sample's certainty (``warp_with_certainty``): exp(-r^2 / 2 s^2) of the distance r between
  the bilinear sample and the nearest pixel's value in the neighbour. Where its taps straddle an
  edge of the pass in its own frame (a silhouette, a depth step, a crease) a flow a fraction of
  a pixel off lands on the wrong side; the centre's own pixel has no such
  error, so there it and the neighbours whose samples lie clear of their edges decide. On
  ``bench.temporal``'s 384x216 shot, where a quarter of the person lies within 2 pixels of its
  silhouette, it took the person ratios of pointmap from 0.62 to 0.54, normal 0.63 -> 0.61,
  matte 0.65 -> 0.63, seg 0.39 -> 0.37 (albedo 0.51 either way): pointmap's error within those
  2 pixels had been 1.14 times the per-frame one, as a sample straddling a silhouette mixes the
  person's depth with the background's. Colour and labels go without (``_NEAREST_CERTAINTY``:
  no gain worth a second warp of their channels);
- a robustness term, exp(-r^2 / 2 s^2) of the sample's distance r to the current estimate,
  iterated (a reweighted mean, ``iterations`` times) from the plain weighted mean: a bad frame,
  the centre included, a swapped label, a sample warped across a motion boundary the flow
  smeared, sits far from what the others agree on and loses its weight; a bad centre is
  pulled towards its neighbours. ``s`` is per kind of values (``FusionSettings``), in the
  units of the distance below: the size of an honest frame-to-frame disagreement.

The rule per kind of values (``schemas.passes.Values``):

| kind           | distance r                              | mean                          |
|----------------|-----------------------------------------|-------------------------------|
| unit_vectors   | chord between unit vectors              | weighted, re-normalised       |
| points         | distance relative to the estimate's     | weighted, in the pass's units |
| relative_depth | absolute difference                     | weighted                      |
| colour         | root mean square over the channels      | weighted                      |
| alpha          | absolute difference                     | weighted                      |
| labels         | total variation between probabilities   | weighted (still sums to 1)    |

Neighbours are sampled bilinearly; relative depth bilinearly among the pixels on the person
only, and -1 where most of a sample's taps are off it (``warp_relative_depth``): it is -1 off
the person, so a plain bilinear sample at the silhouette would be neither the person's depth
nor the background (a mix such as -0.25). Where the person is and its depth there are fused
apart (``_Band.fuse_relative_depth``): the person by every sample's vote, weighted by its share
certainty |2 x share on the person - 1| (normalised convolution's: a sample straddling its
frame's silhouette is unsure which side it is on); the depth by the samples on the person,
weighted also by their slope certainty (how far the sample lies from its nearest pixel's depth:
on the person's rim the depth runs to the background's within a pixel or two, and a sample
there is as far off as the flow is). The bilinear-against-nearest certainty of the other kinds
would put every silhouette sample at 0 (the two differ by a whole unit there) and leave the
silhouette to the centre alone. With these and its robustness scale at 0.15 in place of 0.06
(``FusionSettings``), relative depth's person ratio on ``bench.temporal``'s 384x216 shot went
from 0.81 (nearest sampling, one weighting, the person as the model's matte found it) to 0.675;
with the person as seg found it (as the platform makes the pass, and the bench since), 0.59.

Flow to neighbours two or more frames away is the composition of the adjacent flows (their
confidences multiplied along the path), at flow resolution: one DIS pair per frame, and a
composition is a bilinear lookup. Measured on the synthetic shot (``bench.temporal
--flow-check``, 384x216): the truth's normals warped from two frames away are 1.60 degrees
off on the person where the composed flow is confident (88% of it), 1.26 with DIS between
the two frames (84% confident), which costs one more DIS pair per frame (7 times the
composition's time); the stabilised passes come out the same either way (error ratios within
0.02, ``--direct-flow``). ``FusionSettings.direct_flow`` chooses DIS.

Resolution. A 4096x2160 frame of six passes is 40 channels (29 of them seg's class
probabilities) of 8.8 million pixels: warping and fusing all of them from four neighbours took
about 17 core-s on this project's 2-core CPU (4.2 at 2048x1080), against a goal of 2. So the
fusion runs at a reduced size, ``FusionSettings.max_side`` on the long side (1024: the flow's
own resolution, ``FlowSettings.max_side``; the warps are no more exact than the flow), on each
pass's area means (``reduce_pass``), and is lifted back (``lift_frame``): each pass is the
centre frame's own pixels plus the fusion's correction (fused - centre, at the reduced size)
upsampled bilinearly. What the fusion removes from a per-frame network's output (a per-frame
bias, smooth error fields, a swapped label over a region, a bad frame) is smooth at that scale,
and the frame's own detail is kept. Where one reduced pixel's mean blends two surfaces (a
silhouette, a depth step, a label boundary; ``edge_blocks``: a pass changing from one reduced
pixel to the next by more than ``edge`` robustness scales, or a non-finite value) a correction
would bleed across the edge, so the plate pixels whose upsampling reads those pixels
(``plate_pixels``) are fused again at the plate's size (``fuse_pixels``): the neighbours'
plate-size passes warped by the flow looked up at each pixel, by the same rule. With every
pixel counted an edge the result is the plate-size fusion (tested). A plate no larger than
``max_side`` is fused at its own size.

Seg's class probabilities (29 of the 40 channels, half the cost at 4K) are fused at half that
side again (``FusionSettings.label_reduction``: 512x270 for a 4096x2160 plate, with the other
passes at 1024x540; each size its own group, ``TemporalStabiliser.groups``, with its own
samples, edges and plate-size pixels; the flow is shared). A label swapped over a region is
what their fusion removes, and their boundaries are fused at the plate's size either way. On
``bench.temporal``'s 1536x864 shot fused at 384x216, seg at 192x108 (an 8x reduction, a 4K
plate's at 512) kept its ratios (person 0.19, boundary 0.31; worst frame's fall 25.5 against
26.2, 2026-11-27), and the 4K cost fell from 3.42 to 3.03 core-s a frame on a 2-core Intel
Xeon (run in turn; 2.0% of the pixels then fused at the plate's size against 1.6%).

Cost, on this project's 2-core CPU, one torch thread, six passes (``python -m bench.temporal
--size 4096x2160 --frames 12 --cost-only``, as the platform's workers run): 1.7-1.8 core-s per
4096x2160 frame on a 2-core AMD EPYC with AVX-512 (2026-11-27, three runs of commit 1a8165b;
2.2-2.3 for the code of that morning in turn), about 1.5% of its pixels fused at the plate's
size; it was about 17 before the reduction. Of it, in one instrumented run (8 frames, 1.96
core-s a frame that time): the reduced fusion 0.52 (seg's 0.08), the plate-size pixels 0.41
(seg's 0.24), the lift 0.48 (seg's 0.32; both less since), the area means 0.22, DIS and its
consistency 0.15, the plate-size flows returned 0.06. By torch operation (1a8165b): sampling
(``grid_sample``) 18%, the area means 14%, gathers 7%, upsampling 7%.
At 1536x864 fused at 384x216, ``bench.temporal``'s error ratios are those of fusing at
1536x864 to two decimals, at 0.55 core-s per frame against 1.90 (``--fusion-side``).

A hole in the frame numbers or a cut (``plate_flow.pair_motion``) closes the chain: nothing is
fused across it, and a run of frames shorter than ``min_frames`` comes back unchanged.

Chunks. A frame's result depends only on the frames within ``radius`` of it and the motion
between them, so a shot split into chunks, each pushed with ``radius`` frames of margin either
side (and only its own frames kept), gives the same frames as one pass over the shot.

On the CPU the work runs over bands of rows (``tasks.pixel_blocks``), so the warped samples
of a band stay in cache; on a GPU over the whole frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from tasks.pixel_blocks import row_blocks
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

KINDS = ("unit_vectors", "points", "relative_depth", "colour", "alpha", "labels")
# How the fused frames are made, recorded in a stabilised version's spec (``fusion_method``):
# a version stabilised by another method is another version, beside it, never over it, and
# a run resumed after an upgrade does not mix two methods' frames in one version. A new name
# whenever the fused values change. Versions from before methods were recorded (none in their
# spec) sampled relative depth at the nearest pixel, gave no sample a certainty, and
# estimated a flow image under 1024 pixels at half its size; "certain-samples" fused where the
# person is and relative depth there in one weighting, without the slope certainty
# (``_Band.fuse_relative_depth``); "depth-apart" fused class probabilities at the size of the
# other passes (``FusionSettings.label_reduction``); "labels-half-side" fused at the plate's
# size the whole 3x3 neighbourhood of an edge pixel, not only what the lift reads from it
# (``plate_pixels``).
METHOD = "edge-reach"
_EPS = 1e-6  # the centre's weight that always remains: where every weight vanished, it stands
_TINY = 1e-12
# the robustness term's smallest exponent: exp(-30) is 1e-13, already nothing, and results
# below float32's normal range (exp(-87) and less) make the CPU take a slow path
_FLOOR = -30.0
# A distance beyond this is as good as infinite to every weight here (exp(-(1e18)^2) is 0);
# held below it, the medoid's sums of distances stay finite (``_to_medoid``)
_FAR = 1e18
# Bands of rows on the CPU: per band and neighbour a few dozen torch operations, so bands must
# be large enough to hide their overhead (see tasks.pixel_blocks); the samples of every pass of
# every frame of the window are held for one band.
_BAND_BYTES = 24 << 20
# A class whose probability the reduced fusion moves by less than this in the rows at hand keeps
# the centre's values there (``lift_frame``): about half an 8-bit code value (1/255), which no
# one sees in a Cryptomatte matte, and too little to flip a label but where two classes tie.
# Most of the 29 classes are absent from most rows of a frame, and skipping them is most of the
# cost of lifting seg. With 5e-4 the synthetic shot's near-absent classes (some 3e-4 each, with
# noise) were lifted nearly everywhere: the 4K bench took 2.30 core-s a frame, 2.02 with 2e-3
# (before the lift was made in place; one run each).
_LABEL_TOLERANCE = 2e-3


@dataclass(frozen=True)
class FusionSettings:
    """How passes are fused (see the module). ``radius``: frames each side; ``max_side``: the
    long side of the resolution the fusion runs at (the plate's, when smaller), that side over
    ``label_reduction`` for class probabilities (see the module); ``edge``: how
    far (in robustness scales) a pass may change from one fused pixel to the next before the
    pixels there are fused at the plate's size instead (``edge_blocks``); ``direct_flow``:
    flow to frames two or more away by DIS between them, not composed. ``temporal_sigma``:
    the temporal kernel's width in frames. ``iterations``: reweighting rounds of the robust
    mean. ``min_frames``: a run of frames between cuts/holes shorter than this is returned
    unchanged. The rest: the robustness scale ``s`` per kind of values, in the units of its
    distance (module table)."""

    radius: int = 2
    max_side: int = 1024
    label_reduction: int = 2
    edge: float = 2.0
    direct_flow: bool = False
    temporal_sigma: float = 2.0
    iterations: int = 2
    min_frames: int = 3
    unit_vectors: float = 0.18
    points: float = 0.03
    # relative depth: a per-frame min-max normalisation moves a whole frame's values, so two
    # honest frames differ by more than the other kinds' (on bench.temporal's shot some 0.06:
    # at 0.06 an honest sample kept e^-0.5 of its weight; 0.15 took the person ratio from
    # 0.81 to 0.79 at 384x216, 0.2 and 0.3 let its bad frames back in at 1536x864)
    relative_depth: float = 0.15
    colour: float = 0.04
    alpha: float = 0.08
    labels: float = 0.3

    def __post_init__(self) -> None:
        # a chunk's margin is `radius` frames: it must also tell whether a run is too short
        if self.radius < max(1, self.min_frames - 1):
            raise ValueError(
                f"radius must be at least max(1, min_frames - 1) = "
                f"{max(1, self.min_frames - 1)}, got {self.radius}"
            )
        if self.iterations < 0 or self.temporal_sigma <= 0:
            raise ValueError("iterations must be >= 0 and temporal_sigma > 0")
        if self.max_side < 1:
            raise ValueError(f"max_side must be at least 1, got {self.max_side}")
        if self.label_reduction < 1:
            raise ValueError(f"label_reduction must be at least 1, got {self.label_reduction}")

    def side(self, kind: str) -> int:
        """The long side a kind of values is fused at (the plate's, when smaller)."""
        if kind == "labels":
            return max(1, self.max_side // self.label_reduction)
        return self.max_side

    def scale(self, kind: str) -> float:
        return float(getattr(self, kind))

    def kernel(self, distance: int) -> float:
        return math.exp(-0.5 * (distance / self.temporal_sigma) ** 2)


DEFAULT_FUSION = FusionSettings()


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
class _Fused:
    """The fusion of a frame's passes of one size (``TemporalStabiliser.groups``), until the
    frame is returned: fused at the plate's size (``pixels`` None), or at the reduced size,
    with ``exact``, the (C, N) values of the plate pixels ``pixels`` fused at the plate's
    size."""

    passes: dict[str, Tensor]
    pixels: Tensor | None = None
    exact: dict[str, Tensor] | None = None


@dataclass
class _Frame:
    frame: int
    passes: dict[str, Tensor]  # at the plate's size
    reduced: dict[str, Tensor]  # each at its fusion size (the pushed tensor when the plate's)
    nonfinite: frozenset[str]
    image: np.ndarray  # the flow image (small: at most FlowSettings.max_side)
    # flow resolution, on the device: to the next / previous frame and its confidence
    forward: Tensor | None = None
    forward_confidence: Tensor | None = None
    backward: Tensor | None = None
    backward_confidence: Tensor | None = None
    fused: list[_Fused] | None = None  # one per group of passes fused at one size
    # relative depth as its neighbours warp it (``on_person``), per (pass, plate size): made
    # once, not for every band and centre (a 4K plane is 8.8 million pixels)
    prepared: dict[tuple[str, bool], Tensor] = field(default_factory=dict)

    def on_person(self, name: str, full: bool) -> Tensor:
        key = (name, full)
        if key not in self.prepared:
            self.prepared[key] = on_person(self.passes[name] if full else self.reduced[name])
        return self.prepared[key]


@dataclass
class _Neighbour:
    frame: _Frame
    distance: int  # frames from the centre
    grid: Tensor  # (1, h, w, 2) normalised sampling positions in the neighbour, fusion size
    weight: Tensor  # (h, w) confidence x temporal kernel, fusion size
    flow: Tensor  # (h, w, 2) the flow there and its confidence (h, w), at flow resolution
    confidence: Tensor
    kernel: float  # the temporal kernel's weight at this distance


@dataclass
class _Link:
    """A neighbour of the centre at flow resolution: what ``_Neighbour`` is made of at each
    fusion size."""

    frame: _Frame
    distance: int
    flow: Tensor
    confidence: Tensor
    kernel: float

    def at_size(self, hw: tuple[int, int], device: torch.device) -> _Neighbour:
        weight = confidence_to_plate(self.confidence, hw, device)
        grid = sampling_grid(to_plate(self.flow, hw, device))
        return _Neighbour(
            self.frame, self.distance, grid, weight * self.kernel, self.flow, self.confidence,
            self.kernel,
        )  # fmt: skip


class TemporalStabiliser:
    """Streams a shot's frames in, stabilised frames out (see the module).

    ``kinds``: pass name -> kind of values (``KINDS``); ``plate_hw``: the passes' (H, W);
    ``device``: where the passes live and the work runs."""

    def __init__(
        self,
        kinds: Mapping[str, str],
        plate_hw: tuple[int, int],
        device: torch.device | str,
        settings: FusionSettings = DEFAULT_FUSION,
        flow: FlowSettings = DEFAULT_FLOW,
    ) -> None:
        unknown = {name: kind for name, kind in kinds.items() if kind not in KINDS}
        if unknown:
            raise ValueError(f"no fusion rule for {unknown}; kinds: {', '.join(KINDS)}")
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
        self._window: list[_Frame] = []  # the current run of frames, oldest kept first
        self._pending = 0  # index in the window of the first frame not returned yet
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
        nonfinite = frozenset(n for n in self.kinds if not _all_finite(reduced[n]))
        entry = _Frame(frame, full, reduced, nonfinite, image)
        out: list[StabilisedFrame] = []
        previous = self._window[-1] if self._window else None
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
        self._window.append(entry)
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
        if self._window and frame <= self._window[-1].frame:
            raise ValueError(f"frame {frame} pushed after frame {self._window[-1].frame}")
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
        out = self._release(closing=True)
        self._window = []
        self._pending = 0
        self._run_length = 0
        self._direct = {}
        return out

    def _ready(self, closing: bool) -> None:
        """Fuse the frames whose window is complete (all of them when ``closing``); each is
        returned later, by ``_release``."""
        while self._pending < len(self._window):
            centre = self._window[self._pending]
            if not closing and self._window[-1].frame < centre.frame + self.settings.radius:
                break
            if self._run_length >= self.settings.min_frames:
                centre.fused = self._fuse(self._pending)
            self._pending += 1

    def _release(self, closing: bool) -> list[StabilisedFrame]:
        """The fused frames no frame still to be fused needs as a neighbour (those more than
        ``radius`` before the next one; all when ``closing``), out of the window. Only now is
        a reduced fusion lifted, into the frame's own pushed tensors: until then its
        neighbours sample them as they were pushed."""
        count = self._pending if closing else max(0, self._pending - self.settings.radius)
        out = [self._finished(entry) for entry in self._window[:count]]
        del self._window[:count]
        self._pending -= count
        return out

    def _plate_flows(self, entry: _Frame) -> tuple[Tensor | None, Tensor | None]:
        def plate(flow: Tensor | None) -> Tensor | None:
            return None if flow is None else to_plate(flow, self.plate_hw, self.device)

        return plate(entry.forward), plate(entry.backward)

    def _finished(self, entry: _Frame) -> StabilisedFrame:
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

    def _fuse(self, index: int) -> list[_Fused] | None:
        """The centre's fusion, group by group: at the plate's size, or at the group's reduced
        size with the pixels near edges fused at the plate's size (see the module); None
        without neighbours."""
        centre = self._window[index]
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
                out.append(_Fused(fused))
                continue
            pixels = plate_pixels(edge_blocks(reduced, kinds, self.settings), self.plate_hw)
            self.pixels_at_plate_size += int(pixels.numel())
            exact = None
            if pixels.numel():
                full = {name: centre.passes[name] for name in names}
                exact = fuse_pixels(
                    full, centre.nonfinite, pixels, neighbours, kinds, self.settings
                )
            out.append(_Fused(fused, pixels, exact))
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
                if there < 0 or there >= len(self._window):
                    break
                link = getattr(self._window[at], attribute)
                link_confidence = getattr(self._window[at], attribute + "_confidence")
                if link is None or link_confidence is None:
                    break
                if flow is None or confidence is None:
                    flow, confidence = link, link_confidence
                elif self.settings.direct_flow:
                    direct = self._direct_motion(self._window[index], self._window[there])
                    if direct is None:
                        break
                    flow, confidence = direct
                else:
                    flow, confidence = compose(flow, confidence, link, link_confidence)
                kernel = self.settings.kernel(distance)
                out.append(_Link(self._window[there], distance, flow, confidence, kernel))
        return out

    def _direct_motion(self, centre: _Frame, there: _Frame) -> tuple[Tensor, Tensor] | None:
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
            oldest = self._window[0].frame
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


def fuse_frame(
    centre: Mapping[str, Tensor],
    nonfinite: frozenset[str] | set[str],
    neighbours: list[_Neighbour],
    kinds: Mapping[str, str],
    settings: FusionSettings,
) -> dict[str, Tensor]:
    """Every pass of the centre frame (at the fusion's size) fused with its warped neighbours'
    reduced passes (see the module)."""
    if not neighbours:
        return dict(centre)
    first = next(iter(centre.values()))
    height = first.shape[1]
    device = first.device
    channels = sum(values.shape[0] for values in centre.values())
    bytes_per_row = channels * first.shape[2] * 4 * (len(neighbours) + 4)
    out = {name: torch.empty_like(values) for name, values in centre.items()}
    kernel = settings.kernel(0)
    for rows in row_blocks(device, height, bytes_per_row, _BAND_BYTES):
        band = _Band(
            lambda values, rows=rows: values[:, rows],
            [(n.grid[:, rows], n.weight[rows]) for n in neighbours],
            torch.full_like(neighbours[0].weight[rows], kernel),
            neighbours,
            settings,
            full=False,
        )
        for name, fused in band.fuse_all(centre, nonfinite, kinds).items():
            out[name][:, rows] = fused
    return out


def fuse_pixels(
    centre: Mapping[str, Tensor],
    nonfinite: frozenset[str] | set[str],
    pixels: Tensor,
    neighbours: list[_Neighbour],
    kinds: Mapping[str, str],
    settings: FusionSettings,
) -> dict[str, Tensor]:
    """The fusion at the plate's own size, for some of its pixels only (``pixels``: flat
    indices into (H, W)): each pass's (C, N) fused values there. The same samples, weights
    and rule as ``fuse_frame`` over a whole plate-size frame, with each neighbour's flow and
    confidence looked up at those pixels (as ``to_plate`` would upsample them) and its
    plate-size passes warped there."""
    first = next(iter(centre.values()))
    height, width = first.shape[1:]
    count = int(pixels.numel())
    channels = sum(values.shape[0] for values in centre.values())
    step = max(1, _BAND_BYTES // (channels * 4 * (len(neighbours) + 4)))
    if first.device.type != "cpu":
        step = max(1, count)
    ys = torch.div(pixels, width, rounding_mode="floor").to(torch.float32)
    xs = (pixels % width).to(torch.float32)
    looked_up = _pixel_motion(neighbours, xs, ys, (height, width))
    out = {name: torch.empty(values.shape[0], count, device=values.device) for name, values in
           centre.items()}  # fmt: skip
    kernel = settings.kernel(0)
    for start in range(0, count, step):
        part = slice(start, min(start + step, count))
        index = pixels[part]

        def take(values: Tensor, index: Tensor = index) -> Tensor:
            return values.reshape(values.shape[0], -1).index_select(1, index)[:, None, :]

        band = _Band(
            take,
            [(grid[:, :, part], weight[:, part]) for grid, weight in looked_up],
            torch.full((1, part.stop - part.start), kernel, device=first.device),
            neighbours,
            settings,
            full=True,
        )
        for name, fused in band.fuse_all(centre, nonfinite, kinds).items():
            out[name][:, part] = fused[:, 0]
    return out


def _pixel_motion(
    neighbours: list[_Neighbour], xs: Tensor, ys: Tensor, plate_hw: tuple[int, int]
) -> list[tuple[Tensor, Tensor]]:
    """Per neighbour, at the plate pixels (xs, ys): its sampling positions (1, 1, N, 2) and
    base weights (1, N), from the flow-resolution flow and confidence."""
    height, width = plate_hw
    at = torch.stack([(2.0 * xs + 1.0) / width - 1.0, (2.0 * ys + 1.0) / height - 1.0], dim=-1)
    out = []
    for n in neighbours:
        h, w = n.flow.shape[:2]
        fields = torch.cat([n.flow, n.confidence[..., None]], dim=-1).permute(2, 0, 1)[None]
        found = F.grid_sample(
            fields, at[None, None], mode="bilinear", padding_mode="border", align_corners=False
        )[0, :, 0]
        x = (xs + found[0] * (width / w)).mul_(2.0 / max(width - 1, 1)).sub_(1.0)
        y = (ys + found[1] * (height / h)).mul_(2.0 / max(height - 1, 1)).sub_(1.0)
        out.append((torch.stack([x, y], dim=-1)[None, None], found[2][None] * n.kernel))
    return out


def reduce_pass(values: Tensor, size: tuple[int, int], kind: str) -> Tensor:
    """A pass at the fusion's size: each pixel the mean of the plate pixels it covers (area;
    NaN where one of them is: such blocks are fused at the plate's size, ``edge_blocks``).
    Unit vectors are re-normalised; probabilities still sum to 1."""
    height, width = values.shape[1:]
    if height % size[0] == 0 and width % size[1] == 0:  # the same means, a third faster
        low = F.avg_pool2d(values[None], (height // size[0], width // size[1]))[0]
    else:
        low = F.interpolate(values[None], size=size, mode="area")[0]
    if kind == "unit_vectors":
        norm = _norm(low)
        low = torch.where(norm > _TINY, low / norm.clamp_min(_TINY), low)
    return low


def edge_blocks(
    reduced: Mapping[str, Tensor], kinds: Mapping[str, str], settings: FusionSettings
) -> Tensor:
    """(h, w) bool at the fusion's size: the pixels whose plate pixels the reduced fusion
    cannot stand for. A pixel is an edge where a pass changes to the next pixel by more than
    ``settings.edge`` times its kind's robustness scale (a silhouette, a depth step, a label
    boundary: a mean over such a block blends two surfaces; both pixels of the step are
    marked, as the step may lie in either) or where it is not finite."""
    first = next(iter(reduced.values()))
    mask = torch.zeros(first.shape[1:], dtype=torch.bool, device=first.device)
    for name, kind in kinds.items():
        low = reduced[name]
        distance = _DISTANCE[kind]
        limit = settings.edge * settings.scale(kind)
        across = ~(distance(low[:, :, 1:], low[:, :, :-1]) <= limit)  # NaN: an edge too
        down = ~(distance(low[:, 1:], low[:, :-1]) <= limit)
        mask[:, 1:] |= across
        mask[:, :-1] |= across
        mask[1:] |= down
        mask[:-1] |= down
    return mask


def plate_pixels(edges: Tensor, plate_hw: tuple[int, int]) -> Tensor:
    """The flat indices, in order, of the plate pixels whose lift (``_RowUpsampler``'s
    bilinear upsampling) reads an edge pixel (``edge_blocks``): the edge pixels' own plate
    pixels and, around them, the half of each neighbour's nearer to them, where a correction
    made across the edge would bleed in. (Until 2026-11-27 the nearest edge pixel's whole 3x3
    neighbourhood: a quarter more pixels along a silhouette, for corrections the upsampling
    never carries there.)

    Made from runs of plate rows (and columns) that read the same two fused rows (columns),
    never from a plate-size mask: at 4K that mask, gathered and searched, took 0.03 core-s
    a frame for each size fused."""
    height, width = plate_hw
    rows = _tap_runs(height, edges.shape[0], edges.device)
    cols = _tap_runs(width, edges.shape[1], edges.device)
    by_row = edges.index_select(0, rows.first) | edges.index_select(0, rows.second)
    cells = by_row.index_select(1, cols.first) | by_row.index_select(1, cols.second)
    run, col = cells.nonzero(as_tuple=True)  # in order: by runs of rows, then columns
    cell, xs = _ranges(cols.start[col], cols.length[col])
    run_of_x = run[cell]  # the marked plate columns of each run of rows, in order
    per_run = torch.bincount(run_of_x, minlength=cells.shape[0])
    run_of_row = torch.repeat_interleave(
        torch.arange(cells.shape[0], device=edges.device), rows.length
    )
    row, at = _ranges(_starts(per_run)[run_of_row], per_run[run_of_row])
    return row * width + xs[at]


class _Runs(NamedTuple):
    """Runs of consecutive positions that read the same two source positions."""

    first: Tensor  # each run's two source positions
    second: Tensor
    start: Tensor  # its first position
    length: Tensor


def _tap_runs(size: int, low: int, device: torch.device) -> _Runs:
    """The runs of the ``size`` positions that read the same two of ``low`` positions
    (``_bilinear_taps``)."""
    first, second, _ = _bilinear_taps(size, low, device)
    _, counts = torch.unique_consecutive(first * low + second, return_counts=True)
    starts = _starts(counts)
    return _Runs(first[starts], second[starts], starts, counts)


def _ranges(starts: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """The ranges start .. start + count - 1, concatenated, and each element's range."""
    item = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    within = torch.arange(item.numel(), device=counts.device) - _starts(counts)[item]
    return item, starts[item] + within


def _starts(counts: Tensor) -> Tensor:
    """Where each of consecutive blocks of ``counts`` elements starts."""
    return counts.cumsum(0) - counts


def _bilinear_taps(size: int, low: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """For each of ``size`` positions, the two of ``low`` source positions a bilinear
    upsampling (``F.interpolate``'s, align_corners=False) blends, and the second's share."""
    source = (torch.arange(size, device=device, dtype=torch.float32) + 0.5) * (low / size)
    source = source.sub_(0.5).clamp_(min=0.0)
    first = source.floor().long().clamp_(max=low - 1)
    second = (first + 1).clamp_(max=low - 1)
    return first, second, (source - first).clamp_(0.0, 1.0)


def lift_frame(
    centre: Mapping[str, Tensor],
    reduced: Mapping[str, Tensor],
    fused: Mapping[str, Tensor],
    kinds: Mapping[str, str],
) -> None:
    """The reduced fusion's result at the plate's size, written into ``centre``'s own
    tensors: each pass is its own pixels plus the fusion's correction (fused - centre, at the
    fusion's size) upsampled bilinearly, put back in its kind's range (unit vectors
    re-normalised, mattes in 0..1). Probabilities: only the classes the correction moves by
    more than ``_LABEL_TOLERANCE`` (in the rows at hand) change, the others (absent from the
    frame, or nearly) keep their values; the changed ones are kept non-negative and rescaled to
    the mass they had, so every pixel still sums to what it did. In place, because a new 4K
    frame of 29 class planes is 1 GB of fresh memory a frame. Right for the pixels away from
    ``edge_blocks``; the stabiliser writes those fused at the plate's size over these."""
    for name, values in centre.items():
        correction = torch.nan_to_num(fused[name] - reduced[name], 0.0, 0.0, 0.0)
        if kinds[name] == "labels":
            _lift_labels(values, correction)
        else:
            _lift_values(kinds[name], values, correction)


def _lift_values(kind: str, values: Tensor, correction: Tensor) -> None:
    upsampler = _RowUpsampler(correction, (values.shape[1], values.shape[2]))
    bytes_per_row = values.shape[0] * values.shape[2] * 16
    for rows in row_blocks(values.device, values.shape[1], bytes_per_row):
        band = values[:, rows]
        step = upsampler.rows(rows)
        band.add_(step)
        if kind == "unit_vectors":
            norm = _norm(band)
            flat = norm <= _TINY  # no direction left: the pixel's own stands
            band.div_(norm.clamp_min(_TINY))
            if bool(flat.any()):
                band.copy_(torch.where(flat, band * norm.clamp_min(_TINY) - step, band))
        elif kind == "alpha":
            band.clamp_(0.0, 1.0)


def _lift_labels(values: Tensor, correction: Tensor) -> None:
    """Per band of rows, only the classes the correction moves there (in the fused rows the
    band's upsampling reads) are lifted; a band where none moves stays as it is."""
    moved_in_row = correction.abs().amax(dim=2) > _LABEL_TOLERANCE  # (classes, fused rows)
    moved = moved_in_row.any(dim=1).nonzero().squeeze(1)
    if not moved.numel():
        return
    upsampler = _RowUpsampler(correction.index_select(0, moved), (values.shape[1],
                                                                 values.shape[2]))  # fmt: skip
    moved_in_row = moved_in_row.index_select(0, moved)
    # a band's work arrays (four of 4 bytes a value) hold only the classes moving in it: on
    # the 4K bench 5 to 20 of 29, so bands are sized for half the frame's moving classes.
    # Sized for all of them (two rows of 4096), lifting a frame took 0.31 core-s, 0.27 so.
    bytes_per_row = moved.numel() * values.shape[2] * 8
    for rows in row_blocks(values.device, values.shape[1], bytes_per_row):
        read = slice(int(upsampler.top[rows][0]), int(upsampler.bottom[rows][-1]) + 1)
        active = moved_in_row[:, read].any(dim=1).nonzero().squeeze(1)
        if not active.numel():
            continue
        classes = moved[active]
        band = values[:, rows]
        before = band.index_select(0, classes)
        after = upsampler.rows(rows, active).add_(before).clamp_(min=0.0)
        mass, now = before.sum(dim=0), after.sum(dim=0)
        after.mul_(mass.div_(now.clamp_min(_TINY)))
        emptied = now <= _TINY  # no mass left to rescale: the pixel keeps its own values
        if bool(emptied.any()):
            after = torch.where(emptied, before, after)
        band.index_copy_(0, classes, after)


class _RowUpsampler:
    """Bilinear upsampling (``F.interpolate``'s, align_corners=False) of a (C, h, w) field to
    (C, H, W), a band of rows at a time: the columns are widened once for the whole field
    (C, h, W: a quarter of the plate's size at a 4x reduction), and each band of rows is the
    blend of two gathered rows of that, so a band's work stays in cache on the CPU."""

    def __init__(self, field: Tensor, size: tuple[int, int]) -> None:
        height, width = size
        channels, h, w = field.shape
        # linear along the rows of a (1, C * h, w) view: the values of bilinear interpolation
        # to (h, width), bit for bit, and faster on the CPU (torch 2.13, 540x1024 to 540x4096:
        # three channels 22 -> 7 ms, eleven 36 -> 24; 29 of 270x512 44 -> 31)
        self.wide = F.interpolate(
            field.reshape(1, channels * h, w), size=width, mode="linear", align_corners=False
        ).view(channels, h, width)
        self.top, self.bottom, share = _bilinear_taps(height, h, field.device)
        self.share = share[:, None]

    def rows(self, rows: slice, channels: Tensor | None = None) -> Tensor:
        """The upsampled field's rows ``rows`` (of ``channels`` only, when given)."""
        top, bottom = self.top[rows], self.bottom[rows]
        if channels is None:
            upper = self.wide.index_select(1, top)
            lower = self.wide.index_select(1, bottom)
        else:  # one gather of whole rows from the (C * h, W) view: advanced indexing
            # ([channels, rows]) took a third of lifting seg's time on the CPU
            count, h, width = channels.numel(), self.wide.shape[1], self.wide.shape[2]
            flat = self.wide.view(-1, width)
            first = (channels * h)[:, None]
            upper = flat.index_select(0, (first + top[None, :]).view(-1))
            lower = flat.index_select(0, (first + bottom[None, :]).view(-1))
            upper, lower = upper.view(count, -1, width), lower.view(count, -1, width)
        return upper.lerp_(lower, self.share[rows])


class _Band:
    """Some pixels of the centre frame (a band of rows, or a list of pixels): ``take`` picks
    them out of a frame-size pass; per neighbour its sampling positions there and its base
    weight; the centre's own weight (its kernel). ``full``: the neighbours' plate-size passes
    are sampled, else their reduced ones."""

    def __init__(
        self,
        take: Callable[[Tensor], Tensor],
        motion: list[tuple[Tensor, Tensor]],
        centre_weight: Tensor,
        neighbours: list[_Neighbour],
        settings: FusionSettings,
        *,
        full: bool,
    ) -> None:
        self.take = take
        self.grids = [grid for grid, _ in motion]
        self.neighbours = neighbours
        self.settings = settings
        self.full = full
        self.base = [centre_weight, *(weight for _, weight in motion)]

    def source(self, neighbour: _Neighbour, name: str) -> Tensor:
        frame = neighbour.frame
        return frame.passes[name] if self.full else frame.reduced[name]

    def fuse_all(
        self,
        centre: Mapping[str, Tensor],
        nonfinite: frozenset[str] | set[str],
        kinds: Mapping[str, str],
    ) -> dict[str, Tensor]:
        out = {}
        for name, kind in kinds.items():
            dirty = name in nonfinite or any(name in n.frame.nonfinite for n in self.neighbours)
            if kind == "points":
                out[name] = self.fuse_points(centre[name], name, dirty)
            elif kind == "relative_depth":
                out[name] = self.fuse_relative_depth(centre[name], name, dirty)
            else:
                warped, weights = self.warped(name, kind)
                samples = [self.take(centre[name]), *warped]
                out[name] = self.fuse(kind, samples, weights, dirty)
        return out

    def warped(
        self, name: str, kind: str, channels: slice | None = None
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Each neighbour's pass (``channels`` of it) warped to the centre, and the weights of
        all the samples, the centre's first: each neighbour's base weight times its sample's
        certainty (``warp_with_certainty``; relative depth has its own,
        ``fuse_relative_depth``)."""
        samples, weights = [], [self.base[0]]
        scale, certain = self.settings.scale(kind), kind in _NEAREST_CERTAINTY
        for neighbour, grid, base in zip(self.neighbours, self.grids, self.base[1:], strict=True):
            values = self.source(neighbour, name)
            if channels is not None:
                values = values[channels]
            if certain:
                sample, certainty = warp_with_certainty(values, grid, _DISTANCE[kind], scale)
            else:
                sample, certainty = _warp(values, grid, "bilinear"), None
            samples.append(sample)
            weights.append(base if certainty is None else base * certainty)
        return samples, weights

    def fuse_relative_depth(self, centre: Tensor, name: str, dirty: bool) -> Tensor:
        """Relative depth: where the person is, and its depth there, are fused apart. The
        person: the robust mean of the samples (``warp_relative_depth``) weighted by their share
        certainty, -1 or a depth, so a pixel is on it where most trusted samples say so. Its
        depth: the robust mean of the samples on the person only, weighted by their share and
        slope certainties. Weighted as one, a neighbour on a steep rim lost its vote with its
        value, and the silhouette pixels a per-frame mask had missed stayed missed. Person
        ratios on bench.temporal's 384x216 shot (2026-11-27): one weighting without the slope
        0.645, with it 0.616, apart 0.588; with the person as the model's matte found it (the
        bench before that day) 0.70, 0.79 and 0.675."""
        here = self.take(centre)
        samples, person_weights, depth_weights = [here], [self.base[0]], [self.base[0]]
        for neighbour, grid, base in zip(self.neighbours, self.grids, self.base[1:], strict=True):
            pair = neighbour.frame.on_person(name, self.full)
            sample, certainty, steadiness = warp_relative_depth(pair, grid)
            samples.append(sample)
            person_weights.append(base * certainty)
            depth_weights.append(base * certainty * steadiness)
        voted = self.fuse("relative_depth", samples, person_weights, dirty)
        on = [x[0] > _OFF_PERSON for x in samples]
        depth_weights = [w * o for w, o in zip(depth_weights, on, strict=True)]
        # a centre off the person has no weight, and the voted depth stands in for it: the
        # depth where no sample on the person is trusted
        samples[0] = torch.where(on[0], here, voted)
        depth = self.fuse("relative_depth", samples, depth_weights, dirty)
        # off the person -1 (a non-finite vote stays so: ``_Band.fuse``)
        return torch.where(voted > _OFF_PERSON, depth, voted.clamp(max=-1.0))

    def fuse(self, kind: str, samples: list[Tensor], weights: list[Tensor], dirty: bool) -> Tensor:
        """The robust mean of the samples (the centre first); non-finite samples have no
        weight, and where no finite sample is left the centre stands."""
        if not dirty:
            return robust_mean(
                kind, samples, weights, self.settings.scale(kind), self.settings.iterations
            )
        finite = [torch.isfinite(x).all(dim=0) for x in samples]
        weights = [w * f for w, f in zip(weights, finite, strict=True)]
        clean = [torch.nan_to_num(x, 0.0, 0.0, 0.0) for x in samples]
        fused = robust_mean(
            kind, clean, weights, self.settings.scale(kind), self.settings.iterations
        )
        left = finite[0] | (torch.stack(weights[1:]).sum(dim=0) > 0)
        return torch.where(left, fused, samples[0])

    def fuse_points(self, centre: Tensor, name: str, dirty: bool) -> Tensor:
        """Points: a pixel's point lies on its ray, and the ray belongs to the pixel (the
        camera's), not to what is seen there. So depth (z) is fused along the flow, as the
        body moves, while the ray (x/z, y/z, 1) is fused at the pixel over the same frames,
        without warping (weights: the temporal kernel); the point is the ray at that depth.
        Fusing whole points along the flow would blend positions the body had at other
        times."""
        here = self.take(centre)
        warped, weights = self.warped(name, "points", slice(2, 3))
        fused_depth = self.fuse("points", [here[2:3], *warped], weights, dirty)
        rays = [here] + [self.take(self.source(n, name)) for n in self.neighbours]
        rays = [p / p[2:3] for p in rays]
        kernel = [torch.full_like(w, self.settings.kernel(0)) for w in self.base[:1]]
        kernel += [torch.full_like(w, self.settings.kernel(n.distance)) for w, n in
                   zip(self.base[1:], self.neighbours, strict=True)]  # fmt: skip
        # a ray is not finite where its point's depth is 0 (or its point is not): looked for,
        # as the finite path is the same fusion without a copy and a mask of every sample
        finite = not dirty and all(_all_finite(ray) for ray in rays)
        fused_ray = self.fuse("points", rays, kernel, not finite)
        points = fused_ray * (fused_depth / fused_ray[2:3])
        usable = torch.isfinite(points).all(dim=0) & (here[2].abs() > _TINY)
        return torch.where(usable, points, here)


# The kinds whose neighbours' samples get a certainty from their bilinear value against the
# nearest pixel's (``warp_with_certainty``; see the module). Relative depth has its own, the
# share of its taps on the person and its slope (``warp_relative_depth``, in
# ``_Band.fuse_relative_depth``). Colour and labels go without: on bench.temporal's 384x216
# shot it moved their person ratios by 0.00 and 0.01, for a second warp of 3 and 29 channels
# (the 2048x1080 cost bench went from 1.68 to 1.93 core-s a frame with them).
_NEAREST_CERTAINTY = frozenset({"unit_vectors", "points", "alpha"})
# relative depth is -1 off the person and within 0..1 on it (``bench.temporal``'s noisy model
# strays below 0): a value above this is on the person
_OFF_PERSON = -0.5
# The scale of a relative depth sample's slope certainty against the nearest pixel's depth
# (``warp_relative_depth``): both come from one frame, so its normalisation, which the robust
# scale (``FusionSettings.relative_depth``, 0.15) must allow for, is not in their distance, only
# the slope within a pixel. On bench.temporal's 384x216 shot (a quarter of the person within 2
# pixels of its silhouette, where the neighbours' samples had been 2.4 times the centre's own
# error), person ratio: without it 0.627, with 0.1 0.594, 0.06 0.588, 0.03 0.583.
_DEPTH_STEP = 0.06


def warp_with_certainty(
    values: Tensor, grid: Tensor, distance: Callable[[Tensor, Tensor], Tensor], scale: float
) -> tuple[Tensor, Tensor]:
    """A pass (C, H, W) sampled bilinearly at ``grid`` (``sampling_grid``), and each sample's
    certainty (h, w): exp(-d^2 / 2 scale^2) of the distance d between it and the nearest
    pixel's value (the robustness term's form, on the kind's distance and scale). Where a
    sample's taps straddle an edge of the pass in its own frame (a silhouette, a depth step, a
    crease), a flow a fraction of a pixel off lands on the wrong side of it; there the two
    differ and the sample loses its weight; on a smooth surface they agree. 0 where either is
    not finite."""
    sample, nearest = _warp(values, grid, "bilinear"), _warp(values, grid, "nearest")
    certainty = _gaussian_(distance(nearest, sample), scale)
    return sample, torch.nan_to_num_(certainty, 0.0, 0.0, 0.0)


def _gaussian_(distance: Tensor, scale: float) -> Tensor:
    """exp(-d^2 / 2 scale^2) of each distance, in place: the form of every weight here (the
    robustness term, the samples' certainties), its exponent floored at ``_FLOOR``."""
    return distance.square_().mul_(-0.5 / scale**2).clamp_(min=_FLOOR).exp_()


def _warp(values: Tensor, grid: Tensor, mode: str) -> Tensor:
    batch = values[None]
    return F.grid_sample(batch, grid, mode=mode, padding_mode="border", align_corners=True)[0]


def on_person(depth: Tensor) -> Tensor:
    """Relative depth (1, H, W) as ``warp_relative_depth`` takes it: (2, H, W), the depth times
    the on-person mask, and the mask. A non-finite pixel counts as on the person, so a sample
    that reaches it is not finite and has no weight (``_Band.fuse``), as in any pass."""
    valued = (depth <= _OFF_PERSON).logical_not_().to(depth.dtype)
    return torch.cat([depth * valued, valued])


def warp_relative_depth(pair: Tensor, grid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Relative depth (``on_person``'s pair) sampled at ``grid`` (``sampling_grid``):
    interpolated bilinearly among the pixels on the person only (the depth times the mask, and
    the mask, warped, then divided), -1 where most of a sample's taps are off the person; and
    two certainties of each sample (h, w). Its share certainty, |2 x share on the person - 1|:
    1 where its taps agree, 0 where it straddles its frame's silhouette (which side it is on is
    unsure). Its slope certainty, exp(-d^2 / 2 ``_DEPTH_STEP``^2) of the distance d between
    the sample and the nearest pixel's depth where both are on the person: a sample on a steep
    slope (the person's rim, where the depth runs to the background's within a pixel or two)
    is as far off as the flow is, there. Depth is -1 off the person, so a plain bilinear sample
    at the silhouette would be neither (a mix such as -0.25); nearest sampling keeps the two
    apart but moves the depth by up to half a pixel's slope."""
    warped = _warp(pair, grid, "bilinear")
    share = warped[1:2]
    on = share >= 0.5
    depth = warped[0:1].div_(share.clamp_min(_TINY))
    depth = torch.where(on, depth, torch.full_like(depth, -1.0))
    nearest = _warp(pair, grid, "nearest")
    both = on & (nearest[1:2] > 0.5)
    step = torch.where(both, depth - nearest[0:1], torch.zeros_like(depth))[0]
    steadiness = torch.nan_to_num_(_gaussian_(step, _DEPTH_STEP), 0.0, 0.0, 0.0)
    return depth, share[0].mul(2.0).sub_(1.0).abs_(), steadiness


def robust_mean(
    kind: str, samples: list[Tensor], weights: list[Tensor], scale: float, iterations: int
) -> Tensor:
    """The robust weighted mean of ``samples`` (each (C, h, w), the centre first) under their
    base ``weights`` ((h, w) each). It starts from each pixel's weighted medoid (the sample
    with the least weighted distance to the others: what most of the trusted samples agree
    on, which a plain mean is not where some samples are wrong), then ``iterations`` times
    takes the mean with each weight times exp(-r^2 / 2 scale^2) of the sample's distance r to
    the last estimate (module table). The first round's distances, to the medoid, are the
    ones the medoid was chosen by: the medoid itself is never gathered from the samples."""
    distance = _DISTANCE[kind]
    apart = _to_medoid(samples, weights, kind)
    estimate = samples[0]  # read from the second round on
    for round_ in range(max(1, iterations)):
        robust = []
        for i, (x, w) in enumerate(zip(samples, weights, strict=True)):
            r = apart[i] if round_ == 0 else distance(x, estimate)
            robust.append(_gaussian_(r, scale).mul_(w))
        estimate = _weighted_mean(kind, samples, robust)
    return estimate


def _to_medoid(samples: list[Tensor], weights: list[Tensor], kind: str) -> list[Tensor]:
    """Per pixel, each sample's distance to the medoid: the sample whose weighted distance to
    the others is least (ties: the earlier, so the centre). Each pair's distance is computed
    once; a distance relative to its second sample (points: |x - m| / |m|) is kept as its
    symmetric part and the samples' scales, so the distance to the medoid is exact either way
    round. On the CPU at 4K this saved the medoid's gather (four selections of every channel:
    seg's are 29) and a round of distances.

    The selections are arithmetic, not ``torch.where``: a product with a 0/1 mask, or a lerp
    by 0 or 1, picks a finite value exactly, and on the CPU runs some six times faster than
    ``torch.where`` (1.3 ns a pixel, not vectorised; with a scalar operand 3.8): 2.05 -> 1.97
    core-s a frame on the 4K bench. Distances and scales are held below ``_FAR``, so every
    sum here stays finite."""
    count = len(samples)
    part = _SYMMETRIC.get(kind, _DISTANCE[kind])
    scales = [_scale_of(x) for x in samples] if kind in _SYMMETRIC else None
    pairs: dict[tuple[int, int], Tensor] = {}
    costs = [torch.zeros_like(weights[0]) for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            pairs[i, j] = part(samples[i], samples[j]).clamp_(max=_FAR)
            d = pairs[i, j] if scales is None else pairs[i, j] / scales[j]
            costs[i].addcmul_(d, weights[j])
            costs[j].addcmul_(d, weights[i])
    pick = torch.zeros_like(weights[0])  # the medoid's index (small integers: exact)
    least = costs[0]
    for j in range(1, count):
        better = ((costs[j] < least) & (weights[j] > 0)).to(least.dtype)
        least = least.lerp(costs[j], better)
        pick.addcmul_(better, j - pick)
    chosen = [(pick == j).to(pick.dtype) for j in range(count)]
    out = []
    for i in range(count):
        r = torch.zeros_like(weights[0])  # the medoid itself: 0
        for j in range(count):
            if j != i:
                r.addcmul_(chosen[j], pairs[min(i, j), max(i, j)])
        if scales is not None:
            scale = torch.zeros_like(weights[0])
            for j in range(count):
                scale.addcmul_(chosen[j], scales[j])
            r.div_(scale)
        out.append(r)
    return out


def _weighted_mean(kind: str, samples: list[Tensor], weights: list[Tensor]) -> Tensor:
    centre = samples[0]
    total = weights[0] + _EPS
    mean = centre * total
    for x, w in zip(samples[1:], weights[1:], strict=True):
        mean.addcmul_(x, w)
        total.add_(w)
    mean.div_(total)
    if kind == "unit_vectors":
        norm = _norm(mean)
        mean = torch.where(norm > _TINY, mean / norm.clamp_min(_TINY), centre)
    return mean


def _norm(x: Tensor) -> Tensor:
    """The length of each pixel's vector (over dim 0); ``linalg.vector_norm`` over the outer
    dimension is some ten times slower on the CPU."""
    return x.square().sum(dim=0).sqrt_()


def _chord(x: Tensor, m: Tensor) -> Tensor:
    return _norm(x - m)


def _relative(x: Tensor, m: Tensor) -> Tensor:
    return _norm(x - m).div_(_scale_of(m))


def _scale_of(m: Tensor) -> Tensor:
    """What ``_relative`` divides by (finite: ``_FAR``)."""
    return _norm(m).clamp_(_TINY, _FAR)


def _absolute(x: Tensor, m: Tensor) -> Tensor:
    return (x - m).abs_().amax(dim=0)


def _rms(x: Tensor, m: Tensor) -> Tensor:
    return (x - m).square_().mean(dim=0).sqrt_()


def _total_variation(x: Tensor, m: Tensor) -> Tensor:
    return (x - m).abs_().sum(dim=0).mul_(0.5)


_DISTANCE: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "unit_vectors": _chord,
    "points": _relative,
    "relative_depth": _absolute,
    "colour": _rms,
    "alpha": _absolute,
    "labels": _total_variation,
}
# the distances that are not symmetric: their symmetric part, then divided by ``_scale_of``
_SYMMETRIC: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"points": _chord}


def _all_finite(values: Tensor) -> bool:
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))


__all__ = [
    "DEFAULT_FUSION",
    "KINDS",
    "METHOD",
    "FusionSettings",
    "StabilisedFrame",
    "TemporalStabiliser",
    "compose",
    "fuse_frame",
    "robust_mean",
    "sampling_grid",
]
