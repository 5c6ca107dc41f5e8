"""The person gate (``ShotSpec.tiles == "people"``): one cheap look at each whole frame finds
where the people are, and each tiled pass then runs only the tiles near them; every other
pixel holds the pass's declared background (``Pass.background``).

The look. The person-mask model the job already runs (seg, else matte:
``schemas.passes.PERSON_MASK_FROM``) sees the whole frame shrunk so its long side is the model
input's (a quarter of a 4K plate's side): one model input a frame, where the tiles are about
twenty. A look pixel is a person where its person probability (1 - P(background) for seg,
alpha for matte) is at least ``THRESHOLD``.

Which tiles run. A tile runs when its box, grown by the margin (``margin_px``) on every side,
meets a person pixel of the look. So every tile that covers a pixel within the margin of a
found person runs, and the blender adds them in plan order as it does with every tile: those
pixels are the all-tiles result bit for bit. Pixels that only skipped tiles cover hold the
background; pixels that run and skipped tiles share hold the blend of the run ones.

Threshold and margin. A lost person costs pixels an artist needs; a false one costs a tile. So
the threshold is low (0.1, where pose boxes take 0.5): a person who fills only part of a look
pixel (a 60 px figure is 15 look pixels tall at 4K), or whom the model sees at low confidence
from far away, still counts. The margin (1/32 of the frame's long side: 128 px at 4K, the
default tile overlap) covers what the look misses at the person's edges (hair, fingers, a held
prop, the look's own pixel) and keeps a band around every person exact.

Untrained weights find nobody that means anything: with an untrained look model every tile
runs, and the frame's note says so. ``SVFX_PERSON_GATE`` (``module:function``) replaces the
look's probabilities with ``function(frames, look)`` (frames (B, 3, H, W) in the model's
[0, 1] encoding, look (B, h, w) the model's probabilities; returns (B, h', w') probabilities
of any size): a studio's own detector, or a benchmark's stand-in that knows where its drawn
figure is. The model's look still runs first, so its cost is counted either way.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from core.errors import SvfxError
from sapiens.predictor import Predictor
from sapiens.seg_classes import BACKGROUND
from schemas import passes as pass_table
from schemas.spec import ShotSpec
from tasks.tiling import Region

THRESHOLD = 0.1
MARGIN_FRACTION = 1 / 32  # of the frame's long side
PLUGIN_VARIABLE = "SVFX_PERSON_GATE"

Plugin = Callable[[Tensor, Tensor], Tensor]


class PersonGateError(SvfxError, ValueError):
    """``SVFX_PERSON_GATE`` names nothing that can be called."""


@dataclass(frozen=True)
class PersonLook:
    """Where one frame's people are: ``mask`` (h, w) on the host at the look's size, over a
    frame of ``height`` x ``width``."""

    mask: np.ndarray
    height: int
    width: int

    @property
    def found(self) -> bool:
        return bool(self.mask.any())

    def margin_px(self) -> int:
        return math.ceil(max(self.height, self.width) * MARGIN_FRACTION)

    def touches(self, box: Region) -> bool:
        """Whether ``box`` (frame pixels), grown by the margin, meets a person pixel."""
        margin = self.margin_px()
        rows, cols = self.mask.shape
        sy, sx = rows / self.height, cols / self.width
        y0 = max(0, math.floor((box.y0 - margin) * sy))
        x0 = max(0, math.floor((box.x0 - margin) * sx))
        y1 = min(rows, math.ceil((box.y1 + margin) * sy))
        x1 = min(cols, math.ceil((box.x1 + margin) * sx))
        return bool(self.mask[y0:y1, x0:x1].any())


def background_values(spec: pass_table.Pass, class_names: Sequence[str]) -> list[float]:
    """The model output of pass ``spec`` where no tile ran, one value a channel."""
    if spec.background == "background_class":
        return [1.0 if i == BACKGROUND else 0.0 for i in range(len(class_names))]
    if spec.background == "zeros":
        assert spec.zarr is not None, f"{spec.name} declares a background but stores no array"
        shape = spec.zarr.trailing
        return [0.0] * (int(shape[2]) if len(shape) == 3 else 1)
    raise ValueError(f"the {spec.name} pass declares no background: it is never gated")


def load_plugin(text: str) -> Plugin:
    """The function ``module:name`` names; PersonGateError when it cannot be had."""
    module_name, _, name = text.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name) if name else None
    except (ImportError, AttributeError) as exc:
        raise PersonGateError(f"{PLUGIN_VARIABLE}={text}: {exc}") from None
    if not callable(function):
        raise PersonGateError(f"{PLUGIN_VARIABLE}={text}: give module:function, a callable")
    return function


class PersonGate:
    """The look of a job: ``look(frames)`` gives each frame's ``PersonLook``, or None for each
    with a note when the gate is blind (every tile runs: no person-mask model to look with, or
    an untrained one and no plugin)."""

    def __init__(self, predictor: Predictor, pass_name: str | None, plugin: Plugin | None) -> None:
        self.predictor = predictor
        self.pass_name = pass_name
        self.plugin = plugin
        self.blind: str | None = None  # why every tile runs, the frames' note
        if pass_name is None:
            wanted = " or ".join(pass_table.PERSON_MASK_FROM)
            self.blind = (
                f"person gate: every tile ran (the job runs no {wanted} model to look with)"
            )
        elif plugin is None and not predictor.infos[pass_name].trained:
            self.blind = f"person gate: every tile ran (the {pass_name} model is untrained)"

    @classmethod
    def for_job(cls, spec: ShotSpec, predictor: Predictor) -> PersonGate | None:
        """The job's gate; None when it runs every tile by choice or has no tiled pass."""
        tiled = [n for n in spec.model_passes if pass_table.BY_NAME[n].background is not None]
        if spec.tiles != "people" or not tiled:
            return None
        name = next((n for n in pass_table.PERSON_MASK_FROM if n in predictor.models), None)
        plugin = os.environ.get(PLUGIN_VARIABLE)
        return cls(predictor, name, load_plugin(plugin) if plugin else None)

    def look(self, frames: Sequence[Tensor]) -> tuple[list[PersonLook | None], str | None]:
        """Each frame's look (frames (3, H, W) of one size), and a note for every frame."""
        if self.blind is not None or self.pass_name is None:
            return [None] * len(frames), self.blind
        batch = torch.stack(list(frames))
        height, width = batch.shape[-2:]
        probability = self._model_look(batch, self.pass_name)
        if self.plugin is not None:
            probability = self.plugin(batch, probability)
        masks = (probability >= THRESHOLD).cpu().numpy()
        looks: list[PersonLook | None] = [PersonLook(m, height, width) for m in masks]
        return looks, None

    def _model_look(self, batch: Tensor, name: str) -> Tensor:
        """(B, h, w) person probabilities of the frames shrunk to the model's long side."""
        long_side = max(self.predictor.infos[name].input_hw)
        height, width = batch.shape[-2:]
        scale = min(1.0, long_side / max(height, width))
        if scale < 1.0:
            size = (max(1, round(height * scale)), max(1, round(width * scale)))
            batch = F.interpolate(batch, size=size, mode="area")
        out = self.predictor.predict_batch(batch, name)[name]
        if pass_table.BY_NAME[name].values == "labels":
            return 1.0 - out[:, BACKGROUND]
        return out[:, 0]
