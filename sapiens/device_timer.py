"""Time spent in the model, measured without making the host wait for the device.

On a GPU the host only queues work, so a wall clock around a forward call measures the
queueing, not the network. Each region is instead bracketed by two CUDA events recorded on
the current stream, and their elapsed times are read once, when asked (``seconds``): the only
point that waits, and by then the work is long finished. On the CPU, the wall clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class DeviceTimer:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._lock = threading.Lock()
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._seconds = 0.0

    @contextmanager
    def measure(self) -> Iterator[None]:
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                with self._lock:
                    self._pending.append((start, end))
            return
        began = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._seconds += time.perf_counter() - began

    def seconds(self) -> float:
        """Seconds measured so far (waits for the device's measured work to finish)."""
        with self._lock:
            pending, self._pending = self._pending, []
        measured = 0.0
        for start, end in pending:
            end.synchronize()
            measured += start.elapsed_time(end) / 1000.0
        with self._lock:
            self._seconds += measured
            return self._seconds
