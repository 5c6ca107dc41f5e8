"""Cheap per-frame fingerprints from one directory listing: the object's ETag on S3, size and
modification time locally. They tell whether a plate frame changed since its checksum was
recorded, without reading the bytes (the worker hashes what it reads anyway)."""

from __future__ import annotations

from typing import Any

from storage.errors import SequenceError
from storage.sequences import PlateSequence
from storage.uri import filesystem_for


def fingerprint_of(entry: dict[str, Any]) -> str:
    etag = entry.get("ETag") or entry.get("etag")
    if etag:
        return f"etag:{str(etag).strip(chr(34))}"
    mtime = entry.get("mtime") or entry.get("LastModified") or entry.get("created")
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    return f"size:{entry.get('size')}:mtime:{mtime}"


def sequence_fingerprints(seq: PlateSequence) -> dict[int, tuple[int, str]]:
    """frame -> (size in bytes, fingerprint) for the frames present."""
    fs, path = filesystem_for(seq.directory, seq.storage_options)
    try:
        fs.invalidate_cache(path)
        entries = fs.ls(path, detail=True)
    except OSError as exc:
        raise SequenceError(f"cannot list {seq.directory!r} ({exc})") from exc
    by_name = {str(e["name"]).rstrip("/").rpartition("/")[2]: e for e in entries}
    out: dict[int, tuple[int, str]] = {}
    for frame in seq.frames:
        name = seq.uri_for(frame).rpartition("/")[2]
        entry = by_name.get(name)
        if entry is not None:
            out[frame] = (int(entry.get("size") or 0), fingerprint_of(entry))
    return out
