"""Which layout an EXR this platform wrote has (`storage.exr_writer`), read from its header
alone, so a resubmit can be checked against the files a version already holds.

The file's multi-part bit is not enough: a "multipart" frame of one layer (a shot of normals
only) is a file of one part, as OpenEXR writes it. What tells them apart is how the header
describes its layers: `sapiens2/content` in each part (multipart), or
`sapiens2/content/<layer>` per layer in the one part (single)."""

from __future__ import annotations

from dataclasses import dataclass

import OpenEXR

from storage.errors import StorageError
from storage.exr_writer import CONTENT_KEY
from storage.layers import ExrLayout
from storage.location import Location, Where, as_location
from storage.native_output import captured_native_output


def _parts(location: Location) -> list[OpenEXR.Part]:
    """The parts of the EXR at ``location``, headers only; StorageError naming it."""
    fs, path = location.fs_and_path()
    try:
        with fs.open(path, "rb") as handle, captured_native_output(lambda _line: True):
            return list(OpenEXR.File(handle, header_only=True).parts)
    except OSError as exc:  # not there, no permission, an object store's refusal
        raise StorageError(f"{location.uri}: cannot read it: {exc}") from exc
    except (RuntimeError, ValueError, TypeError) as exc:
        raise StorageError(f"{location.uri}: not a readable OpenEXR file ({exc})") from exc


@dataclass(frozen=True)
class ExrHeader:
    """What a resubmit checks of a version's EXR: its layout and its first part's string
    attributes (svfx's provenance is on every part)."""

    uri: str
    layout: ExrLayout
    attributes: dict[str, str]


def read_exr_header(where: Where) -> ExrHeader:
    """The header of the EXR at ``where``, read once; StorageError naming it when it cannot
    be read or is not an EXR this platform wrote."""
    location = as_location(where)
    parts = _parts(location)
    first = parts[0].header
    if len(parts) > 1 or CONTENT_KEY in first:
        layout: ExrLayout = "multipart"
    elif any(str(key).startswith(CONTENT_KEY + "/") for key in first):
        layout = "single"
    else:
        raise StorageError(f"{location.uri}: an EXR without {CONTENT_KEY}, not written by svfx")
    attributes = {
        str(k): v.decode() if isinstance(v, bytes) else v
        for k, v in first.items()
        if isinstance(v, (str, bytes))
    }
    return ExrHeader(location.uri, layout, attributes)


def exr_attribute(where: Where, key: str) -> str | None:
    """The string attribute ``key`` of the first part of the EXR at ``where`` (None when it
    has none); StorageError naming the file when it cannot be read."""
    return read_exr_header(where).attributes.get(key)


def exr_layout(where: Where) -> ExrLayout:
    """The layout of the EXR at ``where``: "multipart" or "single"; StorageError naming it
    when it is not an EXR this platform wrote."""
    return read_exr_header(where).layout


def first_exr(folder: Location, glob: str) -> str | None:
    """The URI of the first (by name) file matching ``glob`` in ``folder``, or None."""
    fs, path = folder.fs_and_path()
    try:
        found = sorted(fs.glob(f"{path.rstrip('/')}/{glob}"))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"{folder.uri}: cannot list it: {exc}") from exc
    return f"{folder.uri.rstrip('/')}/{found[0].rsplit('/', 1)[-1]}" if found else None
