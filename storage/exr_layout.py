"""Which layout an EXR on disk has (multi-part or single-part), read from its first 8 bytes,
so a resubmit can be checked against the files a version already holds without reading any
pixels or a whole header (on S3 one small ranged read)."""

from __future__ import annotations

import struct

from storage.errors import StorageError
from storage.layers import ExrLayout
from storage.location import Location, Where, as_location

_MAGIC = 20000630  # OpenEXR's magic number, little-endian int32
_MULTIPART_BIT = 0x1000  # bit 12 of the version field: the file has several parts


def exr_layout(where: Where) -> ExrLayout:
    """The layout of the EXR at ``where``: "multipart" or "single"; StorageError naming it
    when it is not an OpenEXR file."""
    location = as_location(where)
    fs, path = location.fs_and_path()
    with fs.open(path, "rb") as handle:
        start = handle.read(8)
    if len(start) < 8 or struct.unpack("<i", start[:4])[0] != _MAGIC:
        raise StorageError(f"{location.uri}: not an OpenEXR file")
    (version,) = struct.unpack("<I", start[4:])
    return "multipart" if version & _MULTIPART_BIT else "single"


def first_exr(folder: Location, glob: str) -> str | None:
    """The URI of the first (by name) file matching ``glob`` in ``folder``, or None."""
    fs, path = folder.fs_and_path()
    try:
        found = sorted(fs.glob(f"{path.rstrip('/')}/{glob}"))
    except FileNotFoundError:
        return None
    return f"{folder.uri.rstrip('/')}/{found[0].rsplit('/', 1)[-1]}" if found else None
