"""Stand-in models with the predictor's interface, for tests and dry runs without weights.

They copy ``sapiens.predictor``'s shape without importing it: ``predict(images, passes)``
takes float32 (B, h, w, 3) RGB in the model's [0, 1] encoding and returns, per requested pass,
``normal`` (B, h, w, 3), ``albedo`` (B, h, w, 3), ``pointmap`` (B, h, w, 3) plus ``focal``
(B,), ``seg`` (B, h, w, 29) probabilities and ``matte`` (B, h, w), at the input's (h, w).
Every stand-in is pointwise or constant, so tiling never changes what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SEG_CLASSES = 29
DENSE_PASSES: tuple[str, ...] = ("normal", "albedo", "pointmap", "seg", "matte")


def _check_request(images: np.ndarray, passes: Sequence[str], supported: Sequence[str]) -> None:
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be (B, h, w, 3), got shape {images.shape}")
    if images.dtype != np.float32:
        raise ValueError(f"images must be float32, got {images.dtype}")
    unknown = [name for name in passes if name not in supported]
    if unknown:
        raise ValueError(f"passes {unknown} not supported; this model has {list(supported)}")


def seg_label_from_rgb(images: np.ndarray) -> np.ndarray:
    """The identity stand-in's class per pixel: the RGB mean cut into 29 equal bins.

    RGB is clipped to [0, 1] first (NaN counts as 0), so any pixel gives a class.
    """
    clipped = np.clip(np.nan_to_num(images, nan=0.0), 0.0, 1.0)
    label = (clipped.mean(axis=-1) * SEG_CLASSES).astype(np.int64)
    return np.minimum(label, SEG_CLASSES - 1)


def one_hot(labels: np.ndarray, classes: int = SEG_CLASSES) -> np.ndarray:
    """float32 (..., classes) with 1 at each label and 0 elsewhere."""
    return (labels[..., None] == np.arange(classes)).astype(np.float32)


class IdentityModel:
    """Returns its input: normal, albedo and pointmap are the RGB, matte is R.

    ``seg`` is the one-hot of ``seg_label_from_rgb`` (a deterministic function of each pixel,
    exactly summing to 1); ``focal`` is the constant given.
    """

    passes: tuple[str, ...] = DENSE_PASSES

    def __init__(self, focal: float = 1000.0) -> None:
        self.focal = float(focal)

    def predict(self, images: np.ndarray, passes: Sequence[str]) -> dict[str, np.ndarray]:
        _check_request(images, passes, self.passes)
        out: dict[str, np.ndarray] = {}
        for name in passes:
            if name in ("normal", "albedo", "pointmap"):
                out[name] = images.copy()
            elif name == "matte":
                out[name] = images[..., 0].copy()
            elif name == "seg":
                out[name] = one_hot(seg_label_from_rgb(images))
        if "pointmap" in passes:
            out["focal"] = np.full(images.shape[0], self.focal, dtype=np.float32)
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
        self.albedo = albedo
        self.depth = depth
        self.seg_class = seg_class
        self.matte = matte
        self.focal = focal

    def predict(self, images: np.ndarray, passes: Sequence[str]) -> dict[str, np.ndarray]:
        _check_request(images, passes, self.passes)
        batch, height, width = images.shape[:3]
        grid = (batch, height, width)
        constants = {
            "normal": np.array([0.0, 0.0, -1.0], dtype=np.float32),
            "albedo": np.full(3, self.albedo, dtype=np.float32),
            "pointmap": np.array([0.0, 0.0, self.depth], dtype=np.float32),
            "seg": one_hot(np.array(self.seg_class)),
        }
        out: dict[str, np.ndarray] = {}
        for name in passes:
            if name == "matte":
                out[name] = np.full(grid, self.matte, dtype=np.float32)
            else:
                value = constants[name]
                out[name] = np.broadcast_to(value, (*grid, value.shape[-1])).copy()
        if "pointmap" in passes:
            out["focal"] = np.full(batch, self.focal, dtype=np.float32)
        return out


class RandomModel:
    """Returns seeded random values of the right kind; each call draws fresh values.

    normal: unit vectors; albedo, matte: uniform [0, 1); pointmap: XYZ with Z in [0.5, 10);
    seg: softmax of normal logits (sums to 1); focal: uniform [500, 3000) pixels. The same
    seed and the same sequence of calls give the same outputs.
    """

    passes: tuple[str, ...] = DENSE_PASSES

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def predict(self, images: np.ndarray, passes: Sequence[str]) -> dict[str, np.ndarray]:
        _check_request(images, passes, self.passes)
        rng = self._rng
        batch, height, width = images.shape[:3]
        grid = (batch, height, width)
        out: dict[str, np.ndarray] = {}
        for name in passes:
            if name == "normal":
                vectors = rng.standard_normal((*grid, 3), dtype=np.float32)
                norms = np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-6)
                out[name] = vectors / norms
            elif name == "albedo":
                out[name] = rng.random((*grid, 3), dtype=np.float32)
            elif name == "matte":
                out[name] = rng.random(grid, dtype=np.float32)
            elif name == "pointmap":
                points = rng.uniform(-1.0, 1.0, (*grid, 3)).astype(np.float32)
                points[..., 2] = rng.uniform(0.5, 10.0, grid)
                out[name] = points
            elif name == "seg":
                logits = rng.standard_normal((*grid, SEG_CLASSES), dtype=np.float32)
                exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
                out[name] = exp / exp.sum(axis=-1, keepdims=True)
        if "pointmap" in passes:
            out["focal"] = rng.uniform(500.0, 3000.0, batch).astype(np.float32)
        return out
