"""Synthetic person-like plates and the layers they are made from, for the bf16 accuracy gate.

The gate (``tasks.precision_gate``) runs small models trained on these scenes
(``bench/gate_training.py``) over a few of them: outputs that vary smoothly with the input,
unlike a random network's, so that bf16's error is measured on outputs that mean something.
A scene is a deterministic function of its seed (torch's CPU generator), so the training set
and the gate's plates are reproducible anywhere.

A figure facing the camera: a head, a torso, two arms and two legs, each a capsule (a segment
with a radius) whose surface is a tube of round section, leaning in the image plane, its limbs
spread by the seed, in front of a tilted background plane. From the same geometry come, per
pixel: the coverage (the matte, anti-aliased), camera-space normals (OpenCV axes: +x right,
+y down, +z forward; a surface facing the camera has -z), the pointmap in metres for a pinhole
camera of focal ``FOCAL``, the albedo (flat colours per part over a smooth background), the
shaded plate (albedo times Lambert shading under a light from the seed), the body-part labels
(Sapiens2's classes; the figure's left is on the image's right) and the 308 keypoints of the
pose model, each pinned to a part and mirrored across the figure's midline as the flip test
expects (``sapiens.keypoints.FLIP_INDICES``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor

from sapiens.arch import CANONICAL_FOCAL, NATIVE_INPUT_HW
from sapiens.keypoints import FLIP_INDICES, KEYPOINT_NAMES
from sapiens.seg_classes import SEG_CLASSES

# The plates' size, the input size of the gate's models: small, so that training takes
# minutes and the gate seconds, yet a multiple of the patch with the 4:3 portrait aspect.
HW = (192, 144)
# The scenes the gate's models were trained on (bench/gate_training.py) and the gate's own
# plates: never one of them (the gate measures on plates the models have not seen).
TRAINING_SEEDS = range(0, 256)
GATE_SEEDS = (1_000_003, 1_000_033)
FOCAL = CANONICAL_FOCAL * HW[0] / NATIVE_INPUT_HW[0]  # pixels: the model's canonical camera
EDGE_PX = 0.5  # the width of the anti-aliased silhouette (a logistic of the distance)
_SOFTNESS_PX = 1.5  # how sharply the front-most part wins where parts overlap
SMOOTHING = 0.12  # the height field's blur (sigma), in figure units: rounded, not creased
STEEPEST = 2.0  # the height field's steepest slope, after the blur (normals up to 63 deg)

# Each part: name, its segment's ends and radius in figure units (1 = the figure's height
# scale, y down, origin between the hips), its seg class and its albedo (which of the
# scene's colours). The limbs' ends are set per scene (spread); these are the rest pose.
_SKIN, _SHIRT, _TROUSERS, _HAIR = range(4)


@dataclass(frozen=True)
class _Part:
    name: str
    radius: float
    label: str
    colour: int


_PARTS: tuple[_Part, ...] = (
    _Part("head", 0.10, "Face_Neck", _SKIN),
    _Part("torso", 0.14, "Upper_Clothing", _SHIRT),
    _Part("left_upper_arm", 0.055, "Left_Upper_Arm", _SKIN),
    _Part("right_upper_arm", 0.055, "Right_Upper_Arm", _SKIN),
    _Part("left_lower_arm", 0.045, "Left_Lower_Arm", _SKIN),
    _Part("right_lower_arm", 0.045, "Right_Lower_Arm", _SKIN),
    _Part("left_upper_leg", 0.065, "Left_Upper_Leg", _TROUSERS),
    _Part("right_upper_leg", 0.065, "Right_Upper_Leg", _TROUSERS),
    _Part("left_lower_leg", 0.052, "Left_Lower_Leg", _TROUSERS),
    _Part("right_lower_leg", 0.052, "Right_Lower_Leg", _TROUSERS),
)
_PART_INDEX = {part.name: i for i, part in enumerate(_PARTS)}
HAIR_LABEL = SEG_CLASSES.index("Hair")  # the head's upper half
_RIGHT = {"right", "r"}  # the words that put a keypoint on the figure's right
PAIR_SPREAD = (0.05, 0.2)  # how far a keypoint pair sits from the midline, in part radii


@dataclass(frozen=True)
class GateScene:
    """One scene: the plate and its layers, float32 CPU tensors, channels first.

    plate, albedo, foreground (3, H, W) in [0, 1]; normals (3, H, W) unit; points (3, H, W)
    metres; alpha (H, W) coverage; labels (H, W) int64 Sapiens2 class indices (background
    where alpha < 0.5); keypoints (308, 2) x, y in plate pixels; box (4,) x1, y1, x2, y2 of the
    figure's pixels (alpha >= 0.5), pixel edges as ``tasks.person_boxes`` gives them."""

    plate: Tensor
    alpha: Tensor
    normals: Tensor
    points: Tensor
    albedo: Tensor
    foreground: Tensor
    labels: Tensor
    keypoints: Tensor
    box: Tensor

    @property
    def depth(self) -> Tensor:
        """Metric depth (H, W): distance along the camera's forward axis."""
        return self.points[2]


# A draw of torch's generator in [low, high)
Uniform = Callable[[float, float], float]


@dataclass(frozen=True)
class _Figure:
    """The figure placed on the plate: each part's segment ends (P, 2) and radius (P,) in
    pixels, float32; ``scale`` pixels per figure unit; its keypoints (308, 2), float64."""

    a: Tensor
    b: Tensor
    radii: Tensor
    scale: float
    keypoints: Tensor


@dataclass(frozen=True)
class _Look:
    """What a scene draws besides the figure's pose: the camera's distances, the light and
    the colours."""

    distance_m: float  # the figure's midline from the camera
    wall: float  # the background plane on the optical axis
    tilt: float  # its slope: Z = wall + tilt * Y
    light: Tensor  # (3,) unit, towards the light
    ambient: float
    colours: Tensor  # (4, 3): skin, shirt, trousers, hair
    background_colours: Tensor  # (2, 3): the background's two colours
    ripple: tuple[float, float, float]  # the background's wave between them


@dataclass(frozen=True)
class _Body:
    """The figure's pixels: ``offset`` (P, H, W, 2) from each part's nearest segment point,
    ``alpha`` (H, W) coverage, ``front`` (P, H, W) each part's weight where parts overlap,
    ``bulge`` (H, W) the surface's height in pixels and ``normal`` (3, H, W) its normals."""

    offset: Tensor
    alpha: Tensor
    front: Tensor
    bulge: Tensor
    normal: Tensor


def make_scene(seed: int, hw: tuple[int, int] = HW) -> GateScene:
    """The scene of ``seed``: the same tensors on every machine (torch's CPU generator)."""
    gen = torch.Generator().manual_seed(seed)

    def uniform(low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=gen, dtype=torch.float64))

    height, width = hw
    figure = _placed_figure(uniform, hw)  # the draws come in this order: the figure first
    look = _drawn_look(uniform)
    ys = torch.arange(height, dtype=torch.float32)[:, None].expand(height, width)
    xs = torch.arange(width, dtype=torch.float32)[None, :].expand(height, width)
    body = _body(figure, xs, ys)
    alpha = body.alpha
    points, normals, wall_normal = _camera_space(look, body, xs, ys)
    person_albedo, wall_albedo, hair = _albedos(look, figure, body, xs, ys)
    albedo = alpha * person_albedo + (1.0 - alpha) * wall_albedo

    def shade(n: Tensor) -> Tensor:
        lambert = (n * look.light[:, None, None]).sum(0).clamp_min(0.0)
        return look.ambient + (1.0 - look.ambient) * lambert

    person_colour = (person_albedo * shade(body.normal)).clamp(0.0, 1.0)
    wall_colour = wall_albedo * shade(wall_normal[:, None, None].expand(3, height, width))
    plate = (alpha * person_colour + (1.0 - alpha) * wall_colour).clamp(0.0, 1.0)
    return GateScene(
        plate=plate.float(),
        alpha=alpha.float(),
        normals=normals.float(),
        points=points.float(),
        albedo=albedo.clamp(0.0, 1.0).float(),
        foreground=person_colour.float(),
        labels=_labels(body, hair),
        keypoints=figure.keypoints.float(),
        box=_box(alpha),
    )


def _placed_figure(uniform: Uniform, hw: tuple[int, int]) -> _Figure:
    """The figure's pose (limbs spread, a lean), then its size and place on the plate: as
    large as a margin of the plate allows, give or take."""
    height, width = hw
    ends = _limb_ends(uniform(0.15, 1.0), uniform(-0.1, 0.5), uniform(0.03, 0.25))
    lean = uniform(-0.25, 0.25)
    rotation = torch.tensor(
        [[math.cos(lean), -math.sin(lean)], [math.sin(lean), math.cos(lean)]], dtype=torch.float64
    )
    unit_radii = torch.tensor([p.radius for p in _PARTS], dtype=torch.float64)
    a, b = ends[:, 0] @ rotation.T, ends[:, 1] @ rotation.T  # in figure units, turned
    low = (torch.minimum(a, b) - unit_radii[:, None]).amin(0)
    high = (torch.maximum(a, b) + unit_radii[:, None]).amax(0)
    margin = 3.0
    room = torch.tensor([width - 2 * margin, height - 2 * margin], dtype=torch.float64)
    scale = uniform(0.75, 0.95) * float((room / (high - low)).min())  # pixels per unit
    radii = unit_radii * scale
    low, high = low * scale, high * scale
    cx = uniform(margin - low[0].item(), width - margin - high[0].item())
    cy = uniform(margin - low[1].item(), height - margin - high[1].item())
    origin = torch.tensor([cx, cy], dtype=torch.float64)
    a, b = a * scale + origin, b * scale + origin
    keypoints = _keypoints(a, b, radii, rotation)
    # per pixel, float32 is plenty
    return _Figure(a=a.float(), b=b.float(), radii=radii.float(), scale=scale, keypoints=keypoints)


def _drawn_look(uniform: Uniform) -> _Look:
    """The camera's distances, the light and the colours of a scene, drawn in this order."""
    distance_m = uniform(2.5, 4.5)
    wall = distance_m + uniform(1.0, 3.0)
    tilt = uniform(-0.5, 0.5)
    light = torch.tensor([uniform(-0.7, 0.7), uniform(-0.7, 0.3), -1.0], dtype=torch.float64)
    ambient = uniform(0.25, 0.45)
    colours = torch.tensor([[uniform(0.1, 0.95) for _ in range(3)] for _ in range(4)])
    background_colours = torch.tensor([[uniform(0.05, 0.9) for _ in range(3)] for _ in range(2)])
    ripple = (uniform(1.0, 3.0), uniform(1.0, 3.0), uniform(0.0, 6.3))
    return _Look(
        distance_m=distance_m,
        wall=wall,
        tilt=tilt,
        light=(light / light.norm()).float(),
        ambient=ambient,
        colours=colours,
        background_colours=background_colours,
        ripple=ripple,
    )


def _body(figure: _Figure, xs: Tensor, ys: Tensor) -> _Body:
    """Each part's nearest segment point, distance and coverage; the figure's surface: each
    part a tube of round section (its height over the segment), the front-most part winning
    softly, the whole height field smoothed; normals from it."""
    a, b = figure.a, figure.b
    pixel = torch.stack([xs, ys], dim=-1)  # (H, W, 2), pixel centres
    ab = b - a
    t = ((pixel[None] - a[:, None, None]) * ab[:, None, None]).sum(-1)
    t = (t / (ab * ab).sum(-1).clamp_min(1e-9)[:, None, None]).clamp(0.0, 1.0)
    nearest = a[:, None, None] + t[..., None] * ab[:, None, None]
    offset = pixel[None] - nearest  # (P, H, W, 2)
    dist = _length(offset[..., 0], offset[..., 1])
    r = figure.radii[:, None, None]
    coverage = torch.sigmoid((r - dist) / EDGE_PX)
    alpha = 1.0 - torch.prod(1.0 - coverage, dim=0)
    bulge = (r * r - dist * dist).clamp_min(0.0).sqrt()
    front = torch.softmax((bulge + 4.0 * (coverage - 1.0) * r) / _SOFTNESS_PX, dim=0)
    front = front * (coverage > 1e-4)
    front = front / front.sum(0, keepdim=True).clamp_min(1e-12)
    person_bulge = _blurred((front * bulge).sum(0), SMOOTHING * figure.scale)
    slope_y, slope_x = torch.gradient(person_bulge)
    relief = STEEPEST / _length(slope_x, slope_y).amax().clamp_min(1e-6)  # rounder than a blur
    person_bulge, slope_x, slope_y = person_bulge * relief, slope_x * relief, slope_y * relief
    person_normal = torch.stack([-slope_x, -slope_y, -torch.ones_like(slope_x)])
    person_normal = person_normal / _length(*person_normal)
    return _Body(offset=offset, alpha=alpha, front=front, bulge=person_bulge, normal=person_normal)


def _camera_space(look: _Look, body: _Body, xs: Tensor, ys: Tensor) -> tuple[Tensor, ...]:
    """The pointmap (3, H, W) and normals (3, H, W) of the figure over the background plane,
    and the plane's normal (3,). The plane Z = wall + tilt * Y through the pixel's ray:
    Y = (v - cy) Z / f."""
    height, width = xs.shape
    focal = FOCAL * height / HW[0]
    ray_x = (xs + 0.5 - width / 2) / focal
    ray_y = (ys + 0.5 - height / 2) / focal
    wall_z = look.wall / (1.0 - look.tilt * ray_y).clamp_min(0.2)
    wall_normal = torch.tensor([0.0, look.tilt, -1.0]) / math.hypot(look.tilt, 1.0)
    person_z = look.distance_m - body.bulge * look.distance_m / focal
    alpha = body.alpha
    z = alpha * person_z + (1.0 - alpha) * wall_z
    points = torch.stack([ray_x * z, ray_y * z, z])
    normals = alpha * body.normal + (1.0 - alpha) * wall_normal[:, None, None]
    normals = normals / _length(*normals).clamp_min(1e-9)
    return points, normals, wall_normal


def _albedos(
    look: _Look, figure: _Figure, body: _Body, xs: Tensor, ys: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The figure's albedo (3, H, W), flat part colours with hair on the head's upper half;
    the background's (3, H, W), a smooth wave between two colours; the hair's weight (H, W)."""
    height, width = xs.shape
    head = _PART_INDEX["head"]
    hair = (body.offset[head, ..., 1] < -0.15 * figure.radii[head]).float() * body.front[head]
    part_albedo = look.colours[[p.colour for p in _PARTS]]  # (P, 3)
    person_albedo = torch.einsum("phw,pc->chw", body.front, part_albedo)
    person_albedo += hair[None] * (look.colours[_HAIR] - part_albedo[head])[:, None, None]
    ripple = look.ripple
    along = 0.5 + 0.5 * torch.sin(ripple[0] * xs / width + ripple[1] * ys / height + ripple[2])
    bg0, bg1 = look.background_colours
    wall_albedo = bg0[:, None, None] + (bg1 - bg0)[:, None, None] * along[None]
    return person_albedo, wall_albedo, hair


def _labels(body: _Body, hair: Tensor) -> Tensor:
    """(H, W) Sapiens2 classes: the front-most part's, hair where the hair weighs most,
    background where the figure covers less than half the pixel."""
    part_labels = torch.tensor([SEG_CLASSES.index(p.label) for p in _PARTS])
    labels = part_labels[body.front.argmax(0)]
    labels = torch.where(hair > 0.5, HAIR_LABEL, labels)
    return torch.where(body.alpha >= 0.5, labels, 0)


def _box(alpha: Tensor) -> Tensor:
    """(4,) x1, y1, x2, y2: the pixel edges around the pixels the figure covers at least half."""
    rows = torch.nonzero((alpha >= 0.5).any(1)).squeeze(1)
    cols = torch.nonzero((alpha >= 0.5).any(0)).squeeze(1)
    return torch.tensor(
        [cols[0] - 0.5, rows[0] - 0.5, cols[-1] + 0.5, rows[-1] + 0.5], dtype=torch.float32
    )


def _blurred(image: Tensor, sigma: float) -> Tensor:
    """(H, W) blurred by a Gaussian of ``sigma`` pixels, the image's edge values beyond it."""
    radius = max(1, math.ceil(3 * sigma))
    taps = torch.exp(
        -(torch.arange(-radius, radius + 1, dtype=torch.float32) ** 2) / (2 * sigma**2)
    )
    taps = taps / taps.sum()
    x = F.pad(image[None, None], (radius, radius, radius, radius), mode="replicate")
    x = F.conv2d(x, taps.view(1, 1, 1, -1))
    return F.conv2d(x, taps.view(1, 1, -1, 1))[0, 0]


def _length(*components: Tensor) -> Tensor:
    """The Euclidean length of vectors given by their components (``Tensor.norm`` over a
    small axis is many times slower on the CPU)."""
    total = components[0] * components[0]
    for c in components[1:]:
        total = total + c * c
    return total.sqrt()


def _limb_ends(arms: float, forearms: float, legs: float) -> Tensor:
    """(P, 2, 2) segment ends per part in figure units: arms spread by ``arms`` radians from
    hanging down, the forearms bent ``forearms`` further, the legs spread by ``legs``."""
    ends = {
        "head": ((0.0, -0.42), (0.0, -0.42)),
        "torso": ((0.0, -0.22), (0.0, -0.02)),
    }
    for side in (1, -1):
        name = "left" if side == 1 else "right"
        shoulder = (0.14 * side, -0.26)
        elbow = (shoulder[0] + 0.16 * side * math.sin(arms), shoulder[1] + 0.16 * math.cos(arms))
        bend = arms + forearms
        hand = (elbow[0] + 0.15 * side * math.sin(bend), elbow[1] + 0.15 * math.cos(bend))
        hip = (0.07 * side, 0.02)
        knee = (hip[0] + 0.2 * side * math.sin(legs), hip[1] + 0.2 * math.cos(legs))
        ankle = (knee[0] + 0.02 * side, knee[1] + 0.2)
        ends[f"{name}_upper_arm"] = (shoulder, elbow)
        ends[f"{name}_lower_arm"] = (elbow, hand)
        ends[f"{name}_upper_leg"] = (hip, knee)
        ends[f"{name}_lower_leg"] = (knee, ankle)
    return torch.tensor([ends[p.name] for p in _PARTS], dtype=torch.float64)


@cache
def keypoint_anchors() -> tuple[tuple[int, float, float], ...]:
    """Where each of the 308 keypoints sits: (part, t, offset across the part in radii, in
    the figure's frame: + towards the figure's left). Landmarks of the figure's head (the
    face's keypoints, by name) and torso (the others), t along the torso's segment or down
    the head (0 above its centre, 1 below). A keypoint's mirror partner (``FLIP_INDICES``)
    sits at the mirrored place, so the flip test averages two estimates of one point: close
    to the midline (``PAIR_SPREAD``), so that a model unsure which of a pair is the figure's
    left (the image's right) still gives one peak, not two (a toy's limbs would make it
    choose, and a precision that flips a near tie would move the point across the body).
    Keypoints that are their own mirror sit on the midline."""
    gen = torch.Generator().manual_seed(308)
    anchors: dict[int, tuple[int, float, float]] = {}
    for index, name in enumerate(KEYPOINT_NAMES):
        if index in anchors:
            continue
        partner = FLIP_INDICES[index]
        t, across = (float(v) for v in torch.rand(2, generator=gen, dtype=torch.float64))
        part = _PART_INDEX["head" if _on_face(name) else "torso"]
        if partner == index:
            anchors[index] = (part, t, 0.0)
            continue
        across = PAIR_SPREAD[0] + (PAIR_SPREAD[1] - PAIR_SPREAD[0]) * across
        left, right = (partner, index) if _RIGHT & set(name.split("_")) else (index, partner)
        anchors[left] = (part, t, across)
        anchors[right] = (part, t, -across)
    return tuple(anchors[i] for i in range(len(KEYPOINT_NAMES)))


def _on_face(name: str) -> bool:
    body = ("thumb", "finger", "wrist", "hand", "toe", "heel", "ankle", "knee", "hip", "elbow",
            "shoulder", "acromion", "olecranon", "cubital", "forearm", "neck", "chest",
            "navel", "nipple")  # fmt: skip
    return not any(word in name for word in body)


def _keypoints(a: Tensor, b: Tensor, radii: Tensor, rotation: Tensor) -> Tensor:
    """(308, 2) keypoints in plate pixels, from the parts' segments, turned by the figure's
    lean (its +x, towards its left, is the image's +x before the lean)."""
    across_axis = rotation[:, 0]
    down_axis = rotation[:, 1]
    head = _PART_INDEX["head"]
    out = torch.empty((len(KEYPOINT_NAMES), 2), dtype=torch.float64)
    for k, (part, t, across) in enumerate(keypoint_anchors()):
        if part == head:
            base = a[part] + (1.2 * t - 0.6) * radii[part] * down_axis
        else:
            base = a[part] + t * (b[part] - a[part])
        out[k] = base + across * radii[part] * across_axis
    return out
