"""How a shot's dense passes are fused over time (``FusionSettings``) and the name of the
method that makes the fused values (``METHOD``). Why these defaults:
docs/design/stabilisation.md."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.stabilise.weights import gaussian

# How the fused frames are made, recorded in a stabilised version's spec (``fusion_method``):
# a version stabilised by another method is another version, beside it, never over it, and
# a run resumed after an upgrade does not mix two methods' frames in one version. A new name
# whenever the fused values change (the earlier methods: docs/design/stabilisation.md).
METHOD = "edge-reach"


@dataclass(frozen=True)
class FusionSettings:
    """How passes are fused. ``radius``: frames each side; ``max_side``: the long side of the
    resolution the fusion runs at (the plate's, when smaller), that side over
    ``label_reduction`` for class probabilities; ``edge``: how far (in robustness scales) a
    pass may change from one fused pixel to the next before the pixels there are fused at the
    plate's size instead (``tasks.stabilise.lift.edge_blocks``); ``direct_flow``:
    flow to frames two or more away by DIS between them, not composed. ``temporal_sigma``:
    the temporal kernel's width in frames. ``iterations``: reweighting rounds of the robust
    mean. ``min_frames``: a run of frames between cuts/holes shorter than this is returned
    unchanged. The rest: the robustness scale ``s`` per kind of values, in the units of its
    distance (``tasks.stabilise.rules``)."""

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
    # honest frames differ by more than the other kinds' do
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
        return gaussian(distance, self.temporal_sigma)


DEFAULT_FUSION = FusionSettings()
