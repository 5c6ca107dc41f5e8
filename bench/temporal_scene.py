"""A synthetic shot with ground truth for temporal stabilisation (``bench.temporal``, the tests).

A textured person-like figure (head, torso, two arms and two legs, each an ellipsoid with its
own texture) walks across a textured background the camera pans over: it moves, leans (turns
in the image plane), swings its limbs (the arms pass in front of the torso: occlusion
boundaries inside the figure) and grows as it comes closer. Per frame the truth of every pass:
camera-space normals (OpenCV axes), the pointmap in metres, relative depth (0 near to 1 far
over the person, -1 elsewhere), albedo, the matte, 29 body-part class probabilities (the
Sapiens2 count; the figure uses 7) and 15 keypoints per person, with a second person whose
keypoints only are drawn.

The "model" is the truth plus what per-frame networks do: a per-frame bias and a smooth random
field per pass, a few frames far off (``BAD``), left/right label swaps (``SWAPS``), keypoint
jitter and outliers, person order shuffled, a person missing for a few frames. Every frame's
draw depends on the scene's seed and the frame alone, so any frame can be made on its own (in
any order, by any chunk).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from schemas.passes import fusion_rules

CLASSES = 29  # Sapiens2's seg class count
KEYPOINTS = 15
PEOPLE = 3  # rows of the pose array: the figure, a second person, a padding row (NaN)
# The shot's dense passes -> the rule each is fused by (the pass table's)
PASS_KINDS = fusion_rules(("normal", "pointmap", "depth", "albedo", "matte", "seg"))
# Frames (indices into the shot) where one pass is far off, per pass; and the label swaps.
BAD = {"normal": (10, 30), "pointmap": (14, 36), "depth": (12,), "albedo": (20, 41),
       "matte": (25, 40), "seg": (17,)}  # fmt: skip
SWAPS = {8: (3, 4), 22: (5, 6), 33: (3, 4)}  # frame index -> the two classes swapped
MISSING_PERSON = range(15, 19)  # frames where the second person is not found
PACE = 48  # frames the figure takes to cross the frame
_UNIT_M = 0.35  # metres per body unit
_LIGHT = np.array([-0.4, -0.5, -0.75]) / np.linalg.norm([-0.4, -0.5, -0.75])


@dataclass(frozen=True)
class Part:
    label: int
    joint: tuple[float, float]  # body units, y down, origin at the pelvis
    offset: float  # the ellipse's centre below the joint, along the limb
    radii: tuple[float, float]
    layer: float  # metres nearer (negative) or farther than the torso
    colour: tuple[float, float, float]
    swing: float  # degrees
    phase: float


# front to back (painter's order)
PARTS = (
    Part(3, (-0.52, -1.2), 0.6, (0.14, 0.62), -0.12, (0.75, 0.55, 0.45), 22.0, 0.0),
    Part(4, (0.52, -1.2), 0.6, (0.14, 0.62), -0.12, (0.72, 0.52, 0.42), 22.0, math.pi),
    Part(1, (0.0, -1.68), 0.0, (0.3, 0.36), -0.02, (0.8, 0.62, 0.5), 0.0, 0.0),
    Part(2, (0.0, -0.62), 0.0, (0.46, 0.76), 0.0, (0.25, 0.35, 0.6), 4.0, 0.5),
    Part(5, (-0.22, 0.05), 0.75, (0.18, 0.78), 0.05, (0.3, 0.28, 0.25), 16.0, math.pi),
    Part(6, (0.22, 0.05), 0.75, (0.18, 0.78), 0.05, (0.32, 0.3, 0.27), 16.0, 0.0),
)


@dataclass(frozen=True)
class Scene:
    """A shot: its size, length, seed; ``static``: nothing moves; ``cut_at``: from this frame
    index on, another shot (other textures, colours and place)."""

    width: int
    height: int
    frames: int
    seed: int = 0
    static: bool = False
    cut_at: int | None = None
    first_frame: int = 1001


@dataclass
class Truth:
    plate: np.ndarray  # (H, W, 3) float32, 0..1 in the model's encoding
    passes: dict[str, np.ndarray]  # (C, H, W) float32
    labels: np.ndarray  # (H, W) uint8
    person: np.ndarray  # (H, W) bool
    boundary: np.ndarray  # (H, W) bool: silhouette and part boundaries
    keypoints: np.ndarray  # (PEOPLE, KEYPOINTS, 3): x, y, visibility 1 (NaN: nobody)


class _Textures:
    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.body = _noise(rng, 256, 256, (1.5, 4.0, 10.0))
        self.background = _noise(rng, 512, 1024, (2.0, 6.0, 20.0))
        self.tint = rng.uniform(0.8, 1.2, 3)


_TEXTURES: dict[int, _Textures] = {}


def _textures(seed: int) -> _Textures:
    if seed not in _TEXTURES:
        _TEXTURES[seed] = _Textures(seed)
    return _TEXTURES[seed]


def _noise(rng: np.random.Generator, h: int, w: int, blurs: tuple[float, ...]) -> np.ndarray:
    total = np.zeros((h, w), np.float32)
    for blur in blurs:
        layer = cv2.GaussianBlur(rng.standard_normal((h, w)).astype(np.float32), (0, 0), blur)
        total += layer / layer.std()
    total -= total.min()
    return (total / total.max()).astype(np.float32)


def _pose(scene: Scene, index: int) -> tuple[float, float, float, float, float]:
    """(cx, cy, scale px per body unit, lean radians, swing phase) at a frame index."""
    # the same pace in a shot of any length: across the frame in 48 frames, then back
    pace = (index / (PACE - 1)) % 2.0
    u = 0.5 if scene.static else 1.0 - abs(1.0 - pace)
    w, h = scene.width, scene.height
    cx = w * (0.3 + 0.4 * u)
    cy = h * (0.52 + 0.03 * math.sin(4 * math.pi * u))
    scale = h / 4.4 * (0.85 + 0.3 * u)
    lean = math.radians(12.0) * math.sin(3 * math.pi * u)
    swing = 0.0 if scene.static else 2 * math.pi * index / 24.0  # a walk's: 1 Hz at 24 fps
    if scene.cut_at is not None and index >= scene.cut_at:
        cx = w - cx
    return cx, cy, scale, lean, swing


def _seed(scene: Scene, index: int) -> int:
    return scene.seed + (1000 if scene.cut_at is not None and index >= scene.cut_at else 0)


def render(scene: Scene, index: int) -> Truth:
    """The truth of one frame (by its index in the shot)."""
    w, h = scene.width, scene.height
    textures = _textures(_seed(scene, index))
    cx, cy, scale, lean, swing = _pose(scene, index)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    cos, sin = math.cos(lean), math.sin(lean)
    dx, dy = (xx - cx) / scale, (yy - cy) / scale
    bu, bv = cos * dx + sin * dy, -sin * dx + cos * dy  # body coordinates
    remaining = np.ones((h, w), np.float32)
    probabilities = np.zeros((CLASSES, h, w), np.float32)
    normal = np.zeros((3, h, w), np.float32)
    depth = np.zeros((h, w), np.float32)
    albedo = np.zeros((3, h, w), np.float32)
    edge = np.full((h, w), np.inf, np.float32)
    base_depth = 3.0 * (h / 4.4) / scale
    for k, part in enumerate(PARTS):
        phi = math.radians(part.swing) * math.sin(swing + part.phase)
        pc, ps = math.cos(phi), math.sin(phi)
        ju, jv = bu - part.joint[0], bv - part.joint[1]
        lx = pc * ju + ps * jv
        ly = -ps * ju + pc * jv - part.offset
        rx, ry = part.radii
        q = np.sqrt((lx / rx) ** 2 + (ly / ry) ** 2)
        distance = (q - 1.0) * min(rx, ry) * scale  # pixels, approximate
        edge = np.minimum(edge, distance)
        coverage = np.clip(0.5 - distance, 0.0, 1.0) * remaining
        remaining -= coverage
        rz = min(rx, ry)
        height = np.sqrt(np.clip(1.0 - q**2, 0.0, 1.0))
        nx, ny, nz = lx / rx**2, ly / ry**2, -height / rz
        angle = lean + phi  # local to image: rotate by the lean and the swing
        ix = math.cos(angle) * nx - math.sin(angle) * ny
        iy = math.sin(angle) * nx + math.cos(angle) * ny
        length = np.sqrt(ix**2 + iy**2 + nz**2) + 1e-12
        normal += coverage * np.stack([ix, iy, nz]) / length
        depth += coverage * (base_depth + part.layer - height * rz * _UNIT_M)
        tex = cv2.remap(
            textures.body,
            (lx * 60.0 + 40.0 * k + 20.0).astype(np.float32),
            (ly * 60.0 + 30.0 * k + 20.0).astype(np.float32),
            cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_WRAP,
        )
        colour = np.array(part.colour, np.float32) * textures.tint
        albedo += coverage * colour[:, None, None] * (0.6 + 0.8 * tex)
        probabilities[part.label] = coverage
    pan = 0.0 if scene.static else 0.6 * index
    background = cv2.remap(
        textures.background,
        xx * (512.0 / max(h, 1)) * 0.5 + pan * 512.0 / max(h, 1),
        yy * (512.0 / max(h, 1)) * 0.5,
        cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_WRAP,
    )
    probabilities[0] = remaining
    normal += remaining * np.array([0.0, 0.0, -1.0], np.float32)[:, None, None]
    normal /= np.linalg.norm(normal, axis=0, keepdims=True)
    depth += remaining * 6.0
    bg_albedo = (0.2 + 0.45 * background)[None] * np.array([1.0, 0.95, 0.85], np.float32)[
        :, None, None
    ]
    if scene.cut_at is not None and index >= scene.cut_at:
        bg_albedo = 0.3 + 0.5 * bg_albedo  # another set, lit otherwise
    albedo += remaining * bg_albedo
    focal = 1.2 * w
    pointmap = np.stack([(xx - w / 2) / focal * depth, (yy - h / 2) / focal * depth, depth]).astype(
        np.float32
    )
    matte = 1.0 - remaining
    person = matte >= 0.5
    relative = np.full((h, w), -1.0, np.float32)
    if person.any():
        near, far = depth[person].min(), depth[person].max()
        relative[person] = (depth[person] - near) / max(far - near, 1e-6)
    shading = 0.35 + 0.65 * np.clip(np.tensordot(_LIGHT.astype(np.float32), normal, 1), 0, 1)
    linear = albedo * np.where(person, shading, 0.9)
    rng = np.random.default_rng((scene.seed, index, 7))
    grain = rng.normal(0.0, 0.004, (3, h, w)).astype(np.float32)
    plate = np.clip(linear + grain, 0.0, 1.0) ** (1 / 2.2)
    labels = probabilities.argmax(axis=0).astype(np.uint8)
    return Truth(
        plate=np.ascontiguousarray(plate.transpose(1, 2, 0), dtype=np.float32),
        passes={
            "normal": normal.astype(np.float32),
            "pointmap": pointmap,
            "depth": relative[None],
            "albedo": albedo.astype(np.float32),
            "matte": matte[None].astype(np.float32),
            "seg": probabilities,
        },
        labels=labels,
        person=person,
        boundary=_boundary(edge, labels, scale),
        keypoints=_keypoints(scene, index, cx, cy, scale, lean, swing),
    )


def _boundary(edge: np.ndarray, labels: np.ndarray, scale: float) -> np.ndarray:
    """Pixels within a few pixels of the silhouette or of a boundary between parts."""
    reach = max(2, round(scale * 0.08))
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * reach + 1, 2 * reach + 1))
    parts = cv2.morphologyEx(labels, cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8)) > 0
    near_parts = cv2.dilate(parts.astype(np.uint8), kernel) > 0
    return (np.abs(edge) <= reach) | near_parts


def _body_keypoints(swing: float) -> np.ndarray:
    """(15, 2) keypoints in body coordinates."""
    points = [(0.0, -2.04), (0.0, -1.32), (0.0, 0.0)]  # head top, neck, pelvis
    for part in PARTS:
        if part.label in (3, 4, 5, 6):
            phi = math.radians(part.swing) * math.sin(swing + part.phase)
            down = np.array([-math.sin(phi), math.cos(phi)])  # the limb's axis, body coords
            joint = np.array(part.joint)
            span = 2 * part.offset
            points += [tuple(joint), tuple(joint + down * span / 2), tuple(joint + down * span)]
    return np.array(points, np.float64)


def _keypoints(
    scene: Scene, index: int, cx: float, cy: float, scale: float, lean: float, swing: float
) -> np.ndarray:
    body = _body_keypoints(swing)
    cos, sin = math.cos(lean), math.sin(lean)
    rotation = np.array([[cos, -sin], [sin, cos]])
    first = body @ rotation.T * scale + (cx, cy)
    second = (body * 0.8) @ rotation * scale + (scene.width - cx * 0.7, cy + 0.05 * scene.height)
    people = np.full((PEOPLE, KEYPOINTS, 3), np.nan)
    people[0, :, :2], people[0, :, 2] = first, 1.0
    if index not in MISSING_PERSON:
        people[1, :, :2], people[1, :, 2] = second, 1.0
    return people


def smooth_field(
    rng: np.random.Generator, channels: int, h: int, w: int, sigma: float
) -> np.ndarray:
    """(channels, H, W) smooth random values of standard deviation about ``sigma``: a coarse
    grid of normal draws, upsampled bicubically (the low-frequency error of a network)."""
    grid = rng.normal(0.0, sigma, (channels, 5, 8)).astype(np.float32)
    return np.stack([cv2.resize(g, (w, h), interpolation=cv2.INTER_CUBIC) for g in grid])


def model(scene: Scene, index: int, truth: Truth) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """What a per-frame network would make of the frame: (passes, keypoints (P, K, 3), person
    order shuffled)."""
    rng = np.random.default_rng((scene.seed, index, 11))
    h, w = scene.height, scene.width
    t = truth.passes
    bad = {name for name, frames in BAD.items() if index in frames}
    passes: dict[str, np.ndarray] = {}

    axis = rng.normal(0.0, math.radians(3.0), 3)
    if "normal" in bad:  # tilted by 25 degrees about an axis in the image plane
        direction = rng.normal(0.0, 1.0, 2)
        axis = np.array([*direction / np.linalg.norm(direction), 0.0]) * math.radians(25.0)
    field = smooth_field(rng, 3, h, w, 0.2 if "normal" in bad else 0.07)
    normal = np.tensordot(_rotation(axis), t["normal"], 1) + field
    passes["normal"] = normal / np.linalg.norm(normal, axis=0, keepdims=True)

    gain = 1.0 + rng.normal(0.0, 0.015) + (0.15 if "pointmap" in bad else 0.0)
    passes["pointmap"] = t["pointmap"] * gain * (1.0 + smooth_field(rng, 1, h, w, 0.01))

    colour_gain = 1.0 + rng.normal(0.0, 0.04, 3)[:, None, None]
    albedo = t["albedo"] * colour_gain + smooth_field(rng, 3, h, w, 0.025)
    passes["albedo"] = albedo * (0.7 if "albedo" in bad else 1.0)

    coverage = t["matte"] + smooth_field(rng, 1, h, w, 0.03) * t["matte"] * (1 - t["matte"]) * 4
    shift = smooth_field(rng, 1, h, w, 0.5)  # the edge moves by about half a pixel
    grown = cv2.dilate(t["matte"][0], np.ones((3, 3), np.float32))
    shrunk = cv2.erode(t["matte"][0], np.ones((3, 3), np.float32))
    edge_moved = np.where(shift > 0, coverage + shift * (grown - t["matte"]),
                          coverage + shift * (t["matte"] - shrunk))  # fmt: skip
    matte = np.clip(edge_moved + smooth_field(rng, 1, h, w, 0.02), 0.0, 1.0)
    passes["matte"] = matte * (0.6 if "matte" in bad else 1.0)

    relative = np.where(t["depth"] >= 0, t["depth"], 1.0)  # outside: as far as the person
    relative = relative + rng.normal(0.0, 0.03) + smooth_field(rng, 1, h, w, 0.03)
    if "depth" in bad:
        relative = 0.6 * relative + 0.3
    passes["depth"] = relative  # masked below, once the person is found

    logits = 5.0 * np.log(t["seg"] + 0.02)
    logits[7:] = -8.0
    logits += rng.normal(0.0, 0.3, (CLASSES, 1, 1))
    logits += smooth_field(rng, CLASSES, h, w, 2.5 if "seg" in bad else 0.9)
    logits -= logits.max(axis=0, keepdims=True)
    probabilities = np.exp(logits)
    probabilities /= probabilities.sum(axis=0, keepdims=True)
    if index in SWAPS:
        a, b = SWAPS[index]
        probabilities[[a, b]] = probabilities[[b, a]]
    passes["seg"] = probabilities
    # relative depth over the person the model itself found, as the platform's is
    # (``frame_passes.relative_depth`` on the first of ``PERSON_MASK_FROM``: seg, when it runs)
    passes["depth"] = np.where(probabilities[0] <= 0.5, relative, -1.0)
    passes = {name: np.ascontiguousarray(v, dtype=np.float32) for name, v in passes.items()}

    people = truth.keypoints.copy()
    pixels = max(scene.height / 400.0, 0.5)  # the jitter grows with the frame
    people[..., :2] += rng.normal(0.0, 1.5 * pixels, people[..., :2].shape)
    outliers = rng.random(people.shape[:2]) < 0.03
    people[..., :2] += outliers[..., None] * rng.normal(0.0, 12.0 * pixels, people[..., :2].shape)
    people[..., 2] = np.where(outliers, 0.15, rng.uniform(0.55, 1.0, people.shape[:2]))
    people[np.isnan(truth.keypoints[..., 0])] = np.nan
    return passes, people[person_order(scene, index)]


def _rotation(vector: np.ndarray) -> np.ndarray:
    matrix, _ = cv2.Rodrigues(vector.astype(np.float64))
    return matrix.astype(np.float32)


def person_order(scene: Scene, index: int) -> np.ndarray:
    """The order ``model`` lists a frame's people in (a per-frame shuffle)."""
    return np.random.default_rng((scene.seed, index, 13)).permutation(PEOPLE)
