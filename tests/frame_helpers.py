"""A frame as the chunk worker's model stage gets it, from an array, and the spec of a small
shot for ``FrameInference`` alone (no plate on disk)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from schemas.spec import parse_spec
from schemas.summaries import FrameSummary
from storage.frame import Frame
from tasks.frame_reading import ReadFrame


def read_frame(rgb: np.ndarray, number: int = 1001) -> ReadFrame:
    height, width = rgb.shape[:2]
    window = (0, 0, width - 1, height - 1)
    plate = Frame(rgb, f"/plates/p.{number}.exr", number, window, window)
    return ReadFrame(number, plate.uri, plate, rgb, FrameSummary(number, plate.uri, "done"))


def frame_spec(passes: Iterable[str], *, batch_size: int, previews: bool, **extra: Any) -> Any:
    return parse_spec(
        {
            "plate": "/plates/p.####.exr",
            "show": "s",
            "sequence": "q",
            "shot": "h",
            "colorspace": "lin_rec709",
            "passes": ",".join(passes),
            "batch_size": batch_size,
            "previews": previews,
            **extra,
        }
    )
