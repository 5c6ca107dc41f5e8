"""What the writers are told about the data they store: EXR layers and Zarr arrays, as frozen
values. Storage never knows a pass; the pass table (`schemas.passes`) builds these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PreviewKind = Literal[
    "vectors", "inverse_depth", "relative_depth", "colour", "alpha", "labels", "motion"
]  # fmt: skip
# How a frame's layers sit in its EXR: one part per layer (Nuke reads each on its own), or
# every layer in one header (readers that take only a file's first part see them all).
ExrLayout = Literal["multipart", "single"]


@dataclass(frozen=True)
class ExrLayer:
    """One part of the per-frame multi-part EXR (or one layer of the single-part one), and
    the layer its channels form.

    ``channels`` are full channel names (layer prefix included: Nuke and OpenImageIO derive
    layers from channel names, not part names). A layer whose channels are Cryptomatte ranks
    has as many as the planes given (``cryptomatte``); one that holds class indices carries
    the class names in its header (``class_names``). ``scene_linear``: the values are colour,
    tagged with the plate's scene-linear space (``colorInteropID``); every other part is
    tagged ``data``. ``planes``: which plane of the pass's (C, H, W) array each channel
    holds (empty: the planes in order)."""

    part: str
    channels: tuple[str, ...]
    dtype: str
    content: str
    scene_linear: bool = False
    cryptomatte: bool = False
    class_names: bool = False
    planes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ZarrArray:
    """One array of the shot's Zarr store: per-frame trailing shape (``"H"``, ``"W"``: the
    plate's height and width, ``"P"``: people, ``"K"``: keypoints), dtype, dimension names,
    fill value and what it holds. ``class_names``: its attributes name the class indices."""

    name: str
    trailing: tuple[int | str, ...]
    dtype: str
    dims: tuple[str, ...]
    fill: float | int
    content: str
    class_names: bool = False
    keypoints: bool = False  # a frame's block may come as a list of people (box, keypoints)
