"""Stand-in models for tests and benchmarks without weights, in torch, channels first.

Two kinds:

- **Pass stand-ins** (``IdentityModel``, ``ConstantModel``, ``RandomModel``) have
  ``Predictor.predict_batch``'s interface: ``predict_batch(tiles, name)`` takes float32
  (B, 3, h, w) RGB in the model's [0, 1] encoding and returns the pass as the predictor does
  (``normal``/``albedo``/``pointmap`` (B, 3, h, w) plus ``focal`` (B,), ``seg`` (B, 29, h, w)
  probabilities, ``matte`` (B, 1, h, w)), at the input's size, on its device. Every one is
  pointwise or constant, so tiling never changes what it returns.
- **Network stand-ins** (``StandInNetwork``) replace a Sapiens network inside a real
  ``Predictor``: they take the normalised canvas and return the head's raw output, so the
  predictor's own pre- and post-processing (softmax included) runs as with real weights.
  ``content="realistic"`` gives what real passes look like (smooth normals and depth inside a
  person-shaped region, a few body parts with soft edges over background, a soft-edged
  alpha), read off a plate made by ``person_plate``; ``content="noise"`` gives independent
  random values per pixel, the worst case for every codec. They count the CPU time they
  spend (``cpu_seconds``) so a benchmark can leave it out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

SEG_CLASSES = 29
DENSE_PASSES: tuple[str, ...] = ("normal", "albedo", "pointmap", "seg", "matte")


def _check_request(tiles: Tensor, name: str, supported: Sequence[str]) -> None:
    if tiles.ndim != 4 or tiles.shape[1] != 3:
        raise ValueError(f"tiles must be (B, 3, h, w), got shape {tuple(tiles.shape)}")
    if tiles.dtype != torch.float32:
        raise ValueError(f"tiles must be float32, got {tiles.dtype}")
    if name not in supported:
        raise ValueError(f"pass {name!r} not supported; this model has {list(supported)}")


def seg_label_from_rgb(tiles: Tensor) -> Tensor:
    """The identity stand-in's class per pixel of (B, 3, h, w): the RGB mean cut into 29
    equal bins. RGB is clipped to [0, 1] first (NaN counts as 0), so any pixel gives a class."""
    clipped = torch.nan_to_num(tiles, nan=0.0).clamp(0.0, 1.0)
    label = (clipped.mean(dim=1) * SEG_CLASSES).to(torch.int64)
    return label.clamp_max(SEG_CLASSES - 1)


def one_hot(labels: Tensor, classes: int = SEG_CLASSES) -> Tensor:
    """float32 (B, classes, h, w) with 1 at each label of (B, h, w) and 0 elsewhere."""
    return F.one_hot(labels, classes).permute(0, 3, 1, 2).to(torch.float32).contiguous()


class IdentityModel:
    """Returns its input: normal, albedo and pointmap are the RGB, matte is R.

    ``seg`` is the one-hot of ``seg_label_from_rgb`` (a deterministic function of each pixel,
    exactly summing to 1); ``focal`` is the constant given.
    """

    passes: tuple[str, ...] = DENSE_PASSES

    def __init__(self, focal: float = 1000.0) -> None:
        self.focal = float(focal)

    def predict_batch(self, tiles: Tensor, name: str) -> dict[str, Tensor]:
        _check_request(tiles, name, self.passes)
        out: dict[str, Tensor] = {}
        if name in ("normal", "albedo", "pointmap"):
            out[name] = tiles.clone()
        elif name == "matte":
            out[name] = tiles[:, :1].clone()
        else:
            out[name] = one_hot(seg_label_from_rgb(tiles))
        if name == "pointmap":
            out["focal"] = torch.full((tiles.shape[0],), self.focal)
        return out


class ConstantModel:
    """Returns the same values everywhere, whatever the input.

    normal (0, 0, -1) (a surface facing the camera), albedo ``albedo`` grey, pointmap
    (0, 0, ``depth``), seg all class ``seg_class``, matte ``matte``, focal ``focal``.
    """

    passes: tuple[str, ...] = DENSE_PASSES

    def __init__(
        self,
        albedo: float = 0.5,
        depth: float = 2.0,
        seg_class: int = 0,
        matte: float = 1.0,
        focal: float = 1000.0,
    ) -> None:
        if not 0 <= seg_class < SEG_CLASSES:
            raise ValueError(f"seg_class must be in 0..{SEG_CLASSES - 1}, got {seg_class}")
        self.values = {
            "normal": [0.0, 0.0, -1.0],
            "albedo": [albedo] * 3,
            "pointmap": [0.0, 0.0, depth],
            "seg": [1.0 if c == seg_class else 0.0 for c in range(SEG_CLASSES)],
            "matte": [matte],
        }
        self.focal = focal

    def predict_batch(self, tiles: Tensor, name: str) -> dict[str, Tensor]:
        _check_request(tiles, name, self.passes)
        batch, _, height, width = tiles.shape
        value = torch.tensor(self.values[name], dtype=torch.float32, device=tiles.device)
        out = {name: value.view(1, -1, 1, 1).expand(batch, -1, height, width).contiguous()}
        if name == "pointmap":
            out["focal"] = torch.full((batch,), float(self.focal))
        return out


class RandomModel:
    """Returns seeded random values of the right kind; each call draws fresh values.

    normal: unit vectors; albedo, matte: uniform [0, 1); pointmap: XYZ with Z in [0.5, 10);
    seg: softmax of normal logits (sums to 1); focal: uniform [500, 3000) pixels. The same
    seed and the same sequence of calls give the same outputs.
    """

    passes: tuple[str, ...] = DENSE_PASSES

    def __init__(self, seed: int = 0) -> None:
        self._generator = torch.Generator().manual_seed(seed)

    def predict_batch(self, tiles: Tensor, name: str) -> dict[str, Tensor]:
        _check_request(tiles, name, self.passes)
        g = self._generator
        batch, _, height, width = tiles.shape
        grid = (height, width)
        out: dict[str, Tensor] = {}
        if name == "normal":
            vectors = torch.randn((batch, 3, *grid), generator=g)
            out[name] = vectors / vectors.norm(dim=1, keepdim=True).clamp_min(1e-6)
        elif name == "albedo":
            out[name] = torch.rand((batch, 3, *grid), generator=g)
        elif name == "matte":
            out[name] = torch.rand((batch, 1, *grid), generator=g)
        elif name == "pointmap":
            points = torch.rand((batch, 3, *grid), generator=g) * 2 - 1
            points[:, 2] = 0.5 + 9.5 * torch.rand((batch, *grid), generator=g)
            out[name] = points
            out["focal"] = 500.0 + 2500.0 * torch.rand((batch,), generator=g)
        else:
            out[name] = torch.softmax(torch.randn((batch, SEG_CLASSES, *grid), generator=g), 1)
        return {k: v.to(tiles.device) for k, v in out.items()}


# -- network stand-ins ----------------------------------------------------------------------

_MEAN = torch.tensor((123.675, 116.28, 103.53)).view(1, 3, 1, 1)
_STD = torch.tensor((58.395, 57.12, 57.375)).view(1, 3, 1, 1)
# body parts the realistic seg draws, by the plate's (scene-linear) green level in the person
_PART_GREENS = {3: 0.78, 4: 0.66, 22: 0.55, 11: 0.45, 12: 0.35}  # face, hair, torso, arms, legs
_DETAIL = 8  # the realistic outputs are computed at 1/8 of the input size, then upsampled


class StandInNetwork(nn.Module):
    """A Sapiens task network's stand-in: normalised (B, 3, H, W) canvas in, the head's raw
    output out (``pointmap``: points and scale; ``matting``: alpha after the sigmoid)."""

    def __init__(self, task: str, content: str = "realistic", seed: int = 0) -> None:
        super().__init__()
        from sapiens.model import build_model

        if content not in ("realistic", "noise"):
            raise ValueError(f"content must be 'realistic' or 'noise', got {content!r}")
        self.info = build_model("tiny", task, device="meta").info
        self.task = task
        self.content = content
        self.cpu_seconds = 0.0
        self._generator = torch.Generator().manual_seed(seed)
        self._anchor = nn.Parameter(torch.zeros(()))  # a device and dtype to move with

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        started = time.process_time()
        try:
            with torch.no_grad():
                raw = self._realistic(x) if self.content == "realistic" else self._noise(x)
            return raw
        finally:
            self.cpu_seconds += time.process_time() - started

    def _noise(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        batch, _, height, width = x.shape
        channels = {"normal": 3, "albedo": 3, "seg": SEG_CLASSES, "matting": 1, "pointmap": 3}
        values = torch.rand((batch, channels[self.task], height, width), generator=self._generator)
        values = values.to(x.device, x.dtype)
        if self.task == "normal":
            return values * 2 - 1
        if self.task == "seg":
            return values * 6
        if self.task == "pointmap":
            values[:, 2] = 1 + 9 * values[:, 2]
            return values, torch.ones((batch, 1), device=x.device, dtype=x.dtype)
        return values

    def _realistic(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        height, width = x.shape[-2:]
        rgb = (x.float() * _STD.to(x.device) + _MEAN.to(x.device)) / 255.0
        low = F.avg_pool2d(rgb, _DETAIL, ceil_mode=True)  # what a ViT's patch grid sees
        red, green, blue = low[:, 0], low[:, 1], low[:, 2]
        person = torch.sigmoid((red - blue - 0.1) * 25)  # the plate's warm figure on blue
        if self.task == "matting":
            out = person[:, None]
        elif self.task == "albedo":
            out = (low * 0.8 + 0.05).clamp(0, 1)
        elif self.task == "seg":
            logits = torch.zeros((low.shape[0], SEG_CLASSES, *low.shape[-2:]), device=x.device)
            logits[:, 0] = 12 * (1 - person)
            for part, level in _PART_GREENS.items():  # as the model sees them: sRGB-encoded
                seen = 1.055 * level ** (1 / 2.4) - 0.055
                logits[:, part] = 12 * person * torch.exp(-((green - seen) ** 2) / 0.004)
            out = logits
        else:
            # a rounded body: the silhouette blurred into a height field, whose slope tilts
            # the normals and whose height brings the depth forward, smoothly everywhere
            height_field = person[:, None]
            for _ in range(3):
                height_field = F.avg_pool2d(height_field, 5, stride=1, padding=2)
            height_field = height_field[:, 0]
            dy, dx = torch.gradient(height_field, dim=(-2, -1))
            depth = 6.0 - 1.5 * person - 1.0 * height_field - 0.1 * green
            if self.task == "normal":
                out = torch.stack([-dx * 6, -dy * 6, -torch.ones_like(dx)], dim=1)
            else:
                rows = torch.linspace(-0.5, 0.5, depth.shape[-2], device=x.device)
                cols = torch.linspace(-0.66, 0.66, depth.shape[-1], device=x.device)
                out = torch.stack(
                    [cols.view(1, 1, -1) * depth, rows.view(1, -1, 1) * depth, depth], dim=1
                )
        full = F.interpolate(out, size=(height, width), mode="bilinear", align_corners=False)
        full = full.to(x.dtype)
        if self.task == "pointmap":
            return full, torch.ones((x.shape[0], 1), device=x.device, dtype=x.dtype)
        return full


def stand_in_models(passes: Sequence[str], content: str = "realistic") -> dict[str, StandInNetwork]:
    """One network stand-in per dense pass, for ``sapiens.Predictor``."""
    task_of = {"matte": "matting"}
    return {name: StandInNetwork(task_of.get(name, name), content) for name in passes}


def person_plate(height: int, width: int, frame: int = 0, grain: float = 0.01) -> np.ndarray:
    """A scene-linear Rec.709 (H, W, 3) float32 plate of a person-shaped figure (head, torso,
    arms, legs: warm, the green level marking the body part) over a blue-grey gradient, with
    soft edges and a little grain; ``frame`` moves the figure sideways a little."""
    rng = np.random.default_rng(frame)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u = (x - width * (0.5 + 0.01 * frame)) / height  # figure-relative, in frame heights
    v = y / height

    def ellipse(cx: float, cy: float, rx: float, ry: float) -> np.ndarray:
        return (((u - cx) / rx) ** 2 + ((v - cy) / ry) ** 2).astype(np.float32)

    parts = [  # (distance field, body part)
        (ellipse(0.0, 0.16, 0.06, 0.08), 3),
        (ellipse(0.0, 0.09, 0.065, 0.04), 4),
        (ellipse(0.0, 0.42, 0.13, 0.2), 22),
        (np.minimum(ellipse(-0.17, 0.42, 0.04, 0.18), ellipse(0.17, 0.42, 0.04, 0.18)), 11),
        (np.minimum(ellipse(-0.06, 0.8, 0.05, 0.2), ellipse(0.06, 0.8, 0.05, 0.2)), 12),
    ]
    plate = np.empty((height, width, 3), dtype=np.float32)
    plate[..., 0] = 0.08 + 0.05 * v
    plate[..., 1] = 0.12 + 0.05 * v
    plate[..., 2] = 0.3 - 0.1 * v
    for field, part in parts:
        inside = np.clip((1.0 - field) * 8.0, 0.0, 1.0)[..., None]  # soft edge
        colour = np.array([0.75, _PART_GREENS[part], 0.12], dtype=np.float32)
        plate += inside * (colour - plate)
    plate += rng.normal(0.0, grain, plate.shape).astype(np.float32)
    return np.clip(plate, 0.0, None)


def distant_plate(height: int, width: int, frame: int = 0, grain: float = 0.01) -> np.ndarray:
    """``person_plate``'s blue-grey ground with one small, distant figure: a warm block 60 px
    tall and 14 wide (whatever the plate's size), right of centre, moving 2 px a frame."""
    rng = np.random.default_rng(frame)
    v = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    plate = np.empty((height, width, 3), dtype=np.float32)
    plate[..., 0] = 0.08 + 0.05 * v
    plate[..., 1] = 0.12 + 0.05 * v
    plate[..., 2] = 0.3 - 0.1 * v
    top, left = int(height * 0.7), int(width * 0.73) + 2 * frame
    plate[top : top + 60, left : left + 14] = (0.75, 0.4, 0.12)
    plate += rng.normal(0.0, grain, plate.shape).astype(np.float32)
    return np.clip(plate, 0.0, None)


def figure_look(frames: Tensor, look: Tensor) -> Tensor:
    """The person gate's stand-in for ``person_plate`` figures (``SVFX_PERSON_GATE=
    bench.standins:figure_look``): untrained weights find no person, but the figure is warm
    over a blue-grey ground, so its pixels are those whose red exceeds their blue by 0.2 (in
    scene-linear and display encodings alike). Returns its coverage of each pixel of the model's
    look, (B, h, w), as a model that saw exactly the figure would; the look itself (its cost)
    has run before."""
    figure = ((frames[:, 0] - frames[:, 2]) > 0.2).float()[:, None]
    return F.interpolate(figure, size=look.shape[-2:], mode="area")[:, 0]
