"""A plate frame as the chunk worker's reader hands it to the model stage, from an array."""

from __future__ import annotations

import numpy as np

from schemas.summaries import FrameSummary
from storage.frame import Frame
from tasks.frame_reading import ReadFrame


def read_frame(rgb: np.ndarray, number: int = 1001) -> ReadFrame:
    height, width = rgb.shape[:2]
    window = (0, 0, width - 1, height - 1)
    plate = Frame(rgb, f"/plates/p.{number}.exr", number, window, window)
    return ReadFrame(number, plate.uri, plate, rgb, FrameSummary(number, plate.uri, "done"))
