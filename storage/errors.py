"""Errors that name what a user can act on: the file, the frame and what was wrong."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from core.errors import SvfxError


class StorageError(SvfxError):
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


@contextmanager
def reading(
    uri: str,
    frame: int | None,
    *,
    prefix: str = "",
    not_found: str = "file not found",
    failed: str = "cannot read the file",
) -> Iterator[None]:
    """Turn OS and filesystem errors raised inside the block into a FrameError naming the
    file and frame: gone, forbidden or unreadable."""
    try:
        yield
    except FileNotFoundError as exc:
        raise FrameError(uri, frame, f"{prefix}{not_found} ({exc})") from exc
    except PermissionError as exc:
        raise FrameError(uri, frame, f"{prefix}access denied ({exc})") from exc
    except OSError as exc:
        raise FrameError(uri, frame, f"{prefix}{failed} ({exc})") from exc


@contextmanager
def writing(uri: str, frame: int | None) -> Iterator[None]:
    """Name the output, not the input, when writing it fails: any error inside the block
    becomes a FrameError for ``uri`` (a full disk says so: "No space left on device")."""
    try:
        yield
    except FrameError as exc:
        if exc.uri == uri:
            raise
        raise FrameError(uri, frame, f"cannot write this output: {exc}") from exc
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, OSError) and exc.strerror:
            reason = f"{exc.strerror} (errno {exc.errno})"
            if exc.filename:
                reason += f" at {exc.filename}"
        raise FrameError(uri, frame, f"cannot write this output: {reason}") from exc
