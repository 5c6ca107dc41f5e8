"""Cheap per-frame fingerprints from the sequence's own directory listing: the object's ETag on
S3, size and modification time locally. They tell whether a plate frame changed since its
checksum was recorded, without reading the bytes (the worker hashes what it reads anyway)."""

from __future__ import annotations

from typing import Any

from storage.sequences import PlateSequence


def fingerprint_of(entry: dict[str, Any]) -> str:
    etag = entry.get("ETag") or entry.get("etag")
    if etag:
        return f"etag:{str(etag).strip(chr(34))}"
    mtime = entry.get("mtime") or entry.get("LastModified") or entry.get("created")
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    return f"size:{entry.get('size')}:mtime:{mtime}"


def sequence_fingerprints(seq: PlateSequence) -> dict[int, tuple[int, str]]:
    """frame -> (size in bytes, fingerprint) for the frames present (no further I/O)."""
    return {
        frame: (int(entry.get("size") or 0), fingerprint_of(entry))
        for frame, entry in seq.listing.items()
    }
