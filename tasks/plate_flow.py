"""Motion from the plate: dense optical flow between two plate frames, its confidence, and
whether the two frames belong to the same shot at all.

Flow is OpenCV's DIS (Dense Inverse Search): classical, no weights, and fast enough to run on
the host beside the model (docs/design/optical-flow.md).
It runs on the luma of the plate as the model saw it (its 8-bit encoding), at a reduced
resolution: the flow is smooth where it matters for fusing passes, DIS's own pyramid starts
coarse anyway, and a frame at most ``FlowSettings.max_side`` on its long side keeps the cost
flat in the plate's size. Vectors are returned at that flow resolution in *its* pixels;
``to_plate`` scales them to plate pixels on the device (in torch, beside the warps).

Confidence is forward-backward consistency: a pixel's forward vector followed by the backward
vector where it lands returns close to where it started, unless the pixel is occluded in the
other frame or the flow is wrong there. It is 1 for a perfect round trip and falls to 0 at
``FlowSettings.consistency`` pixels of error (plus a share of the motion's length, since long
vectors are less exact).

A cut (the next frame is another shot, a flash frame, a frame from another take) is a pair
whose luma histograms disagree, or whose flow is consistent almost nowhere: nothing may be
blended across it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np
import torch
import torch.nn.functional as F

_LUMA = np.array([0.2126, 0.7152, 0.0722], dtype=np.float32)
_PRESETS = {
    "ultrafast": cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST,
    "fast": cv2.DISOPTICAL_FLOW_PRESET_FAST,
    "medium": cv2.DISOPTICAL_FLOW_PRESET_MEDIUM,
}


@dataclass(frozen=True)
class FlowSettings:
    """How flow is computed. ``max_side``: the flow image's longest side (the plate is
    reduced to it, never enlarged). ``consistency``: the round-trip error, in flow pixels, at
    which confidence reaches 0 (plus ``consistency_share`` of the vector's length).
    ``cut_histogram``: the luma histogram correlation below which a pair is a cut;
    ``cut_consistent``: the share of consistent pixels below which it is one too.
    ``finest_side``: DIS refines the flow down to its preset's finest pyramid level (medium's
    is level 1: half the image, so a 1024-pixel flow image is estimated at 512), or to a finer
    level where that one's long side would be under this many pixels (``finest_scale``); None:
    the preset's level always."""

    max_side: int = 1024
    preset: Literal["ultrafast", "fast", "medium"] = "medium"
    consistency: float = 1.0
    consistency_share: float = 0.05
    cut_histogram: float = 0.5
    cut_consistent: float = 0.2
    # A plate under 1024 pixels on its long side makes a flow image under 1024, which DIS at
    # level 1 estimates at under 512: the figure is then coarser in the flow than in the passes
    # it warps. Such an image is estimated at level 0, cheaply, and every pass gains; larger
    # plates gain little from it (docs/design/optical-flow.md).
    finest_side: int | None = 512


DEFAULT_FLOW = FlowSettings()
# DIS (OpenCV 5.0) reads outside a flow image under 16 pixels on a side: some such sizes
# raise, others kill the process (a segfault, seen at 15x200 and 12x64; every size from 16
# up that was tried ran). A pair that small has no flow (``can_flow``).
MIN_FLOW_SIDE = 16


def can_flow(image: np.ndarray) -> bool:
    """Whether DIS can run on a flow image of this size (``MIN_FLOW_SIDE``)."""
    return min(image.shape[:2]) >= MIN_FLOW_SIDE


def flow_image(rgb: np.ndarray, settings: FlowSettings = DEFAULT_FLOW) -> np.ndarray:
    """The 8-bit luma the flow runs on, from a plate frame in the model's encoding ((H, W, 3)
    float in 0..1), reduced so its long side is at most ``settings.max_side`` (area
    averaging: no aliasing). C-contiguous, as DIS requires."""
    return luma_flow_image(rgb[..., :3] @ _LUMA, settings)


def luma_flow_image(luma: np.ndarray, settings: FlowSettings = DEFAULT_FLOW) -> np.ndarray:
    """``flow_image`` from the luma ((H, W) float, 0..1) instead of the RGB."""
    luma = np.clip(luma, 0.0, 1.0)
    size = reduced_size(luma.shape, settings.max_side)
    if size != luma.shape:
        luma = cv2.resize(luma, size[::-1], interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray((luma * 255.0 + 0.5).astype(np.uint8))


def reduced_size(hw: tuple[int, ...], max_side: int) -> tuple[int, int]:
    """(h, w) scaled so the long side is at most ``max_side`` (never enlarged)."""
    h, w = int(hw[0]), int(hw[1])
    scale = min(1.0, max_side / max(h, w))
    if scale >= 1.0:
        return h, w
    return max(1, round(h * scale)), max(1, round(w * scale))


def dense_flow(a: np.ndarray, b: np.ndarray, settings: FlowSettings = DEFAULT_FLOW) -> np.ndarray:
    """Flow from ``a`` to ``b`` (flow images of one size): (h, w, 2) float32, x then y, in
    flow-image pixels, y down; ``a[y, x]`` is seen at ``b[y + v, x + u]``. Refused
    (ValueError) below ``MIN_FLOW_SIDE``."""
    if not (can_flow(a) and can_flow(b)):
        raise ValueError(
            f"a flow image of {a.shape[1]}x{a.shape[0]} pixels is under the {MIN_FLOW_SIDE} a "
            "side optical flow needs"
        )
    dis = cv2.DISOpticalFlow_create(_PRESETS[settings.preset])
    dis.setFinestScale(finest_scale(a.shape, dis.getFinestScale(), settings.finest_side))
    return dis.calc(a, b, None)


def finest_scale(shape: tuple[int, ...], preset_level: int, finest_side: int | None) -> int:
    """The finest pyramid level DIS refines to for a flow image of this shape: the preset's,
    or finer while that level's long side is under ``finest_side`` (never below level 0)."""
    level = preset_level
    if finest_side is None:
        return level
    while level > 0 and max(shape[:2]) / 2**level < finest_side:
        level -= 1
    return level


@dataclass(frozen=True)
class PairMotion:
    """The motion between two neighbouring frames a and b, at flow resolution.

    ``forward``: a -> b; ``backward``: b -> a, each (h, w, 2) float32 in flow pixels, y down.
    ``confidence_a``: (h, w) in 0..1, how far a's forward vectors can be trusted (its pixels
    visible in b); ``confidence_b`` likewise for b's backward vectors. ``cut``: a and b are
    not the same shot; nothing is blended between them (the vectors are then zero and the
    confidences 0). ``histogram``, ``consistent``: the figures the cut was decided on."""

    forward: np.ndarray
    backward: np.ndarray
    confidence_a: np.ndarray
    confidence_b: np.ndarray
    cut: bool
    histogram: float
    consistent: float

    @property
    def scale_to(self) -> tuple[int, int]:
        h, w = self.forward.shape[:2]
        return h, w


def pair_motion(a: np.ndarray, b: np.ndarray, settings: FlowSettings = DEFAULT_FLOW) -> PairMotion:
    """Forward and backward flow between flow images ``a`` and ``b``, their confidences, and
    whether the pair is a cut."""
    histogram = histogram_correlation(a, b)
    forward = dense_flow(a, b, settings)
    backward = dense_flow(b, a, settings)
    confidence_a = round_trip_confidence(forward, backward, settings)
    confidence_b = round_trip_confidence(backward, forward, settings)
    consistent = float(np.mean(confidence_a > 0.5))
    cut = histogram < settings.cut_histogram or consistent < settings.cut_consistent
    if cut:
        forward = np.zeros_like(forward)
        backward = np.zeros_like(backward)
        confidence_a = np.zeros_like(confidence_a)
        confidence_b = np.zeros_like(confidence_b)
    return PairMotion(forward, backward, confidence_a, confidence_b, cut, histogram, consistent)


def histogram_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of the two images' 64-bin luma histograms: 1 for the same picture, near 0
    or below for unrelated ones. Motion barely changes it; a cut changes it a lot."""
    ha = cv2.calcHist([a], [0], None, [64], [0, 256])
    hb = cv2.calcHist([b], [0], None, [64], [0, 256])
    value = cv2.compareHist(ha, hb, cv2.HISTCMP_CORREL)
    return 1.0 if not np.isfinite(value) else float(value)  # two flat images: the same


def round_trip_confidence(
    there: np.ndarray, back: np.ndarray, settings: FlowSettings = DEFAULT_FLOW
) -> np.ndarray:
    """(h, w) float32 in 0..1: 1 where following ``there`` and then ``back`` (sampled where
    ``there`` lands, bilinearly) returns to the start, 0 from ``settings.consistency`` pixels
    of error (plus a share of the vector's length) and where ``there`` leaves the frame."""
    h, w = there.shape[:2]
    xs, ys = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    map_x = xs + there[..., 0]
    map_y = ys + there[..., 1]
    back_there = cv2.remap(back, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    error = np.hypot(*(there + back_there).transpose(2, 0, 1))
    limit = settings.consistency + settings.consistency_share * np.hypot(*there.transpose(2, 0, 1))
    confidence = np.clip(1.0 - error / limit, 0.0, 1.0)
    outside = (map_x < 0) | (map_x > w - 1) | (map_y < 0) | (map_y > h - 1)
    confidence[outside] = 0.0
    return confidence.astype(np.float32)


def to_plate(
    flow: np.ndarray | torch.Tensor, plate_hw: tuple[int, int], device: torch.device | str
) -> torch.Tensor:
    """Flow-resolution vectors as (H, W, 2) float32 plate-pixel vectors on ``device``
    (bilinear, each component scaled by its axis's ratio)."""
    vectors = torch.as_tensor(flow, dtype=torch.float32, device=device)
    h, w = vectors.shape[:2]
    height, width = plate_hw
    if (h, w) == (height, width):
        return vectors
    resized = F.interpolate(
        vectors.permute(2, 0, 1)[None], size=plate_hw, mode="bilinear", align_corners=False
    )[0]
    scale = torch.tensor([width / w, height / h], dtype=torch.float32, device=device)
    return resized.permute(1, 2, 0) * scale


def confidence_to_plate(
    confidence: np.ndarray | torch.Tensor, plate_hw: tuple[int, int], device: torch.device | str
) -> torch.Tensor:
    """Flow-resolution confidence as an (H, W) float32 plate-size map on ``device``."""
    values = torch.as_tensor(confidence, dtype=torch.float32, device=device)
    if tuple(values.shape) == tuple(plate_hw):
        return values
    return F.interpolate(values[None, None], size=plate_hw, mode="bilinear", align_corners=False)[
        0, 0
    ]
