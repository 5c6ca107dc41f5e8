"""The chunk worker's first stage: a plate frame read, checked and put in the model's encoding,
on a reader thread ahead of the model.

Bytes -> sha256 -> decode -> size check -> colour conversion, straight into the buffer the
device will copy from: page-locked (pinned) memory when the model runs on CUDA, so the upload
is a non-blocking DMA; plain memory otherwise. Anamorphic plates are desqueezed on the device,
not here (``tasks.frame_inference``).
"""

from __future__ import annotations

import hashlib
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from schemas.spec import ShotSpec, cache_key
from schemas.summaries import FrameSummary
from storage.errors import FrameError
from storage.frame import Frame
from storage.location import Location
from storage.plate_reader import decode_frame, fetch_bytes
from tasks.colour import ColourConversion


@dataclass
class FrameMotion:
    """A frame's flow to its neighbours in the plate, at flow resolution (``tasks.frame_motion``
    makes it): (h, w, 2) float32 in flow-image pixels, x right, y down; None: zero vectors on
    that side (the frame's summary says why)."""

    forward: np.ndarray | None = None  # to frame f+1
    backward: np.ndarray | None = None  # to frame f-1


@dataclass
class ReadFrame:
    """A frame ready for the model."""

    number: int
    uri: str
    plate: Frame
    rgb: np.ndarray  # model encoding, (H, W, 3) float32 at the plate's width
    summary: FrameSummary
    motion: FrameMotion | None = None  # flow to its neighbours, when motion is asked for


class FrameReader:
    def __init__(
        self,
        spec: ShotSpec,
        colour: ColourConversion,
        frame_hw: tuple[int, int],
        checkpoint_shas: Sequence[str],
        *,
        plate: Location,
        pinned: bool = False,
    ) -> None:
        self.spec = spec
        self.colour = colour
        self.frame_hw = frame_hw
        self.checkpoint_shas = sorted(checkpoint_shas)
        self.settings_digest = spec.settings_digest()
        self.plate = plate  # reaches every frame of the plate (`Location.at`)
        self.pinned = pinned

    def read_all(
        self,
        frames: Sequence[tuple[int, str, str | None]],
        out: queue.Queue[ReadFrame | FrameSummary | None],
    ) -> None:
        """Read (number, uri, fingerprint) frames into ``out`` (bounded: the reader waits for
        the model), a FrameSummary for a frame that failed, None at the end."""
        try:
            for number, uri, fingerprint in frames:
                summary = FrameSummary(
                    frame=number, plate_uri=uri, status="done", plate_fingerprint=fingerprint
                )
                try:
                    out.put(self.read(number, uri, summary))
                except Exception as exc:
                    out.put(failed(summary, exc, uri))
        finally:
            out.put(None)

    def read(self, number: int, uri: str, summary: FrameSummary) -> ReadFrame:
        t0 = time.perf_counter()
        data = fetch_bytes(self.plate.at(uri), frame=number)
        summary.plate_sha256 = hashlib.sha256(data).hexdigest()
        summary.plate_size = len(data)
        plate = self._decoded(data, number, uri)
        del data
        t1 = time.perf_counter()
        rgb = self._encoded(plate, self._buffer((plate.height, plate.width, 3)))
        summary.timings["read"] = t1 - t0
        summary.timings["colour"] = time.perf_counter() - t1
        summary.cache_key = cache_key(
            summary.plate_sha256, self.checkpoint_shas, self.settings_digest
        )
        return ReadFrame(number, uri, plate, rgb, summary)

    def neighbour_rgb(self, number: int, uri: str) -> np.ndarray:
        """A plate frame outside the chunk in the model's encoding, for motion only: read,
        decoded and checked like the chunk's own, its checksum not taken (it is not one of
        the chunk's frames and none of its outputs is made here)."""
        data = fetch_bytes(self.plate.at(uri), frame=number)
        plate = self._decoded(data, number, uri)
        del data
        return self._encoded(plate, np.empty((plate.height, plate.width, 3), np.float32))

    def _decoded(self, data: bytes, number: int, uri: str) -> Frame:
        plate = decode_frame(data, uri, frame=number, nonfinite=self.spec.nonfinite)
        if (plate.height, plate.width) != self.frame_hw:
            h, w = self.frame_hw
            raise FrameError(
                uri,
                number,
                f"frame is {plate.width}x{plate.height} but the shot is {w}x{h} "
                "(data window size differs from the rest of the sequence)",
            )
        return plate

    def _encoded(self, plate: Frame, rgb: np.ndarray) -> np.ndarray:
        np.copyto(rgb, plate.pixels[..., :3])
        self.colour.to_model_encoding(rgb, inplace=True)
        return rgb

    def _buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        if self.pinned:
            return torch.empty(shape, dtype=torch.float32, pin_memory=True).numpy()
        return np.empty(shape, dtype=np.float32)


def failed(summary: FrameSummary, exc: BaseException, uri: str) -> FrameSummary:
    """The summary of a frame that failed, with the file, frame and reason."""
    summary.status = "failed"
    if isinstance(exc, FrameError):
        summary.error = str(exc)
    else:
        summary.error = f"{uri}: frame {summary.frame}: {type(exc).__name__}: {exc}"
    summary.outputs = []
    return summary
