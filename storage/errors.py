"""Errors that name what a user can act on: the file, the frame and what was wrong."""

from __future__ import annotations


class StorageError(Exception):
    """Base class for everything `storage/` raises on bad input or unreachable data."""


class FrameError(StorageError):
    """One frame could not be read, checked or written.

    Carries the URI, the frame number (None when the file has none) and a plain reason, so
    the flow can record it per frame and carry on with the rest of the shot.
    """

    def __init__(self, uri: str, frame: int | None, reason: str) -> None:
        self.uri = uri
        self.frame = frame
        self.reason = reason
        where = f"frame {frame} ({uri})" if frame is not None else uri
        super().__init__(f"{where}: {reason}")


class SequenceError(StorageError):
    """A frame pattern that matches nothing, or cannot be parsed or listed."""
