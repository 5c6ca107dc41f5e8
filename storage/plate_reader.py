"""`read_plate_frame`: one plate frame from a local path or `s3://` into a float32 Frame.

EXR goes through the OpenEXR module (`storage.exr_reader`); DPX, TIFF, PNG, JPEG and the
rest through OpenImageIO (`storage.oiio_reader`). The reader is picked by the file's
magic number, not its name, so a damaged `.exr` is reported as such.

Remote objects are fetched whole into memory (one GET; one frame at a time). EXR is decoded
straight from that buffer. OpenImageIO's Python bindings (3.2) expose no in-memory reader
(no `IOMemReader`/`ioproxy`), so other formats are written to a temporary file first.
"""

from __future__ import annotations

import io
import os
import tempfile
from typing import Literal

import numpy as np

from storage.errors import FrameError, reading
from storage.exr_reader import EXR_MAGIC, read_exr
from storage.frame import Frame
from storage.location import Where, as_location
from storage.retry import RetryPolicy, with_retries

NonFinitePolicy = Literal["error", "zero"]
NONFINITE_ATTRIBUTE = "svfx/nonfinitePixelsZeroed"
_EXR_SUFFIXES = (".exr", ".sxr")


def read_plate_frame(
    where: Where,
    frame: int | None = None,
    layer: str | None = None,
    nonfinite: NonFinitePolicy = "error",
) -> Frame:
    """Read one frame; `layer` picks an EXR layer or part (default: R,G,B[,A]).

    `nonfinite="error"` (default) rejects frames with NaN/Inf pixels; `"zero"` replaces
    them with 0 and records how many pixels in `attributes[NONFINITE_ATTRIBUTE]`.
    Every failure is a FrameError naming the file, the frame and the reason.
    """
    _check_policy(nonfinite)
    where = as_location(where)
    uri = where.uri
    if where.is_remote:
        data = fetch_bytes(where, frame=frame)
        return decode_frame(data, uri, frame=frame, layer=layer, nonfinite=nonfinite)
    _, path = where.fs_and_path()
    magic = _local_magic(path, uri, frame)
    if magic == EXR_MAGIC:
        decoded = read_exr(path, uri, frame, layer)
    else:
        _reject_fake_exr(magic, uri, frame)
        decoded = _read_other(path, uri, frame, layer)
    return apply_nonfinite_policy(decoded, nonfinite)


# A frame read waits out throttling for at most a minute, then fails alone (recorded).
READ_RETRY = RetryPolicy(attempts=6, first_wait_s=0.5, max_wait_s=8.0, deadline_s=60.0)


def fetch_bytes(where: Where, *, frame: int | None = None) -> bytes:
    """The whole object at `where`; FrameError when it is gone, forbidden or unreadable."""
    where = as_location(where)
    uri = where.uri
    fs, path = where.fs_and_path()
    with reading(uri, frame, not_found="file not found (removed after the sequence was listed?)"):
        if not where.is_remote:
            return bytes(fs.cat_file(path))
        # object stores throttle and drop connections: wait and retry within a bound
        return bytes(with_retries(lambda: fs.cat_file(path), f"reading {uri}", READ_RETRY))


def decode_frame(
    data: bytes,
    uri: str,
    frame: int | None = None,
    layer: str | None = None,
    nonfinite: NonFinitePolicy = "error",
) -> Frame:
    """Decode a frame already in memory (so a caller can checksum the same bytes)."""
    _check_policy(nonfinite)
    magic = data[:4]
    if not data:
        raise FrameError(uri, frame, "the file is empty (0 bytes)")
    if magic == EXR_MAGIC:
        decoded = read_exr(io.BytesIO(data), uri, frame, layer)
    else:
        _reject_fake_exr(magic, uri, frame)
        decoded = _read_image_bytes(data, uri, frame, layer)
    return apply_nonfinite_policy(decoded, nonfinite)


def apply_nonfinite_policy(frame: Frame, policy: NonFinitePolicy) -> Frame:
    """Raise on NaN/Inf pixels, or zero them and record the count, per `policy`."""
    finite = np.isfinite(frame.pixels)
    if finite.all():
        return frame
    bad = ~finite
    bad_pixels = int(bad.any(axis=-1).sum())
    if policy == "error":
        nan_values = int(np.isnan(frame.pixels).sum())
        inf_values = int(bad.sum()) - nan_values
        bad_channels = [name for index, name in enumerate(frame.channels) if bad[..., index].any()]
        raise FrameError(
            frame.uri,
            frame.frame,
            f"{bad_pixels} pixels hold non-finite values ({nan_values} NaN, {inf_values} Inf "
            f"in channels {', '.join(bad_channels)}); fix the plate, or submit with "
            "--nonfinite zero to read them as 0",
        )
    frame.pixels[bad] = 0.0
    frame.attributes[NONFINITE_ATTRIBUTE] = bad_pixels
    return frame


def _check_policy(policy: str) -> None:
    if policy not in ("error", "zero"):
        raise ValueError(f"nonfinite must be 'error' or 'zero', not {policy!r}")


def _local_magic(path: str, uri: str, frame: int | None) -> bytes:
    with reading(uri, frame), open(path, "rb") as handle:
        magic = handle.read(4)
    if not magic:
        raise FrameError(uri, frame, "the file is empty (0 bytes)")
    return magic


def _reject_fake_exr(magic: bytes, uri: str, frame: int | None) -> None:
    """A `.exr` without the EXR magic number is corrupt; say so rather than guess a format."""
    if uri.lower().endswith(_EXR_SUFFIXES):
        raise FrameError(
            uri,
            frame,
            f"corrupt OpenEXR: the file does not start with the EXR magic number "
            f"(first bytes {magic.hex()}); it is damaged or not an EXR",
        )


def _read_image_bytes(data: bytes, uri: str, frame: int | None, layer: str | None) -> Frame:
    suffix = os.path.splitext(uri.rsplit("/", 1)[-1])[1]
    with tempfile.TemporaryDirectory(prefix="svfx-frame-") as scratch:
        path = os.path.join(scratch, f"frame{suffix}")
        with open(path, "wb") as handle:
            handle.write(data)
        return _read_other(path, uri, frame, layer)


def _read_other(path: str, uri: str, frame: int | None, layer: str | None) -> Frame:
    """A frame that is not EXR, through OpenImageIO. Imported here, on the first such frame:
    an EXR-only worker (and the GPU kit, whose wheels must stay small) never loads its 8 MB
    of libraries."""
    from storage.oiio_reader import read_oiio_image

    return read_oiio_image(path, uri, frame, layer)
