"""Progress of the running shot, for whoever listens in this process (the CLI's progress bar,
the Prefect progress artifact, tests). The flow emits; listeners must be quick."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger("svfx.progress")


@dataclass(frozen=True)
class Progress:
    stage: str  # planned, frames, finished
    total: int  # frames in the shot (present + missing)
    done: int = 0
    failed: int = 0
    skipped: int = 0
    message: str = ""

    @property
    def left(self) -> int:
        return max(0, self.total - self.done - self.failed - self.skipped)


Listener = Callable[[Progress], None]
_LISTENERS: list[Listener] = []
_LOCK = threading.Lock()


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    with _LOCK:
        _LISTENERS.append(listener)
    try:
        yield
    finally:
        with _LOCK:
            _LISTENERS.remove(listener)


def emit(progress: Progress) -> None:
    with _LOCK:
        listeners = list(_LISTENERS)
    for listener in listeners:
        try:
            listener(progress)
        except Exception:  # a broken progress display must not stop the shot
            log.exception("progress listener failed")
