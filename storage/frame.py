"""The in-memory record of one plate frame, as every reader returns it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# EXR convention: inclusive pixel bounds (xmin, ymin, xmax, ymax).
Box = tuple[int, int, int, int]


@dataclass
class Frame:
    """Pixels of one frame's data window plus the header facts that must survive to the output.

    `pixels` is float32 (H, W, C) covering the data window only; C is 3 (RGB) or 4 (RGBA).
    Integer files are scaled to [0, 1] (code value / max code value).
    """

    pixels: np.ndarray
    uri: str
    frame: int | None
    data_window: Box
    display_window: Box
    pixel_aspect: float = 1.0
    channels: tuple[str, ...] = ("R", "G", "B")
    source_type: str = "float"  # "half", "float", "uint32", "uint8", "uint10", "uint16", ...
    bit_depth: int = 32
    attributes: dict[str, Any] = field(default_factory=dict)  # timecode, camera metadata, ...

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])
