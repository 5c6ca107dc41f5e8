"""The streaming window both temporal smoothers run over: frames pushed in increasing order,
each made once the ``radius`` frames after it are in, and dropped once no frame still to be
made needs it as a neighbour (``radius`` frames later). Memory holds ``2 * radius + 1``
frames, never the shot; a frame's result depends only on the frames within ``radius`` of it,
so a shot split into chunks (each with ``radius`` frames of margin) gives the same frames.
A hole or a cut closes the run: the owner makes the rest (``ready(closing=True)``) and
releases them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class _Numbered(Protocol):
    frame: int


_Entry = TypeVar("_Entry", bound=_Numbered)


class Window(Generic[_Entry]):
    """The current run of frames, oldest kept first; ``pending``: the index of the first
    frame not made yet."""

    def __init__(self, radius: int) -> None:
        self.radius = radius
        self.frames: list[_Entry] = []
        self.pending = 0

    @property
    def last(self) -> _Entry | None:
        return self.frames[-1] if self.frames else None

    def check_order(self, frame: int) -> None:
        """ValueError unless ``frame`` comes after every frame in the window."""
        if self.frames and frame <= self.frames[-1].frame:
            raise ValueError(f"frame {frame} pushed after frame {self.frames[-1].frame}")

    def ready(self, closing: bool) -> Iterator[int]:
        """The index of each frame whose window is complete (every one left when
        ``closing``), in order; each counts as made once the caller takes the next."""
        while self.pending < len(self.frames):
            centre = self.frames[self.pending]
            if not closing and self.frames[-1].frame < centre.frame + self.radius:
                return
            yield self.pending
            self.pending += 1

    def release(self, closing: bool) -> list[_Entry]:
        """The made frames no frame still to be made needs (those more than ``radius``
        before the first of them; all when ``closing``), out of the window."""
        count = self.pending if closing else max(0, self.pending - self.radius)
        out = self.frames[:count]
        del self.frames[:count]
        self.pending -= count
        return out
