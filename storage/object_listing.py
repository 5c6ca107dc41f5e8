"""One recursive listing of a bucket prefix, with each object's size, ETag and modification
time, retried with backoff inside a bounded total time.

A scan of a prefix must cost the listing and nothing more: ``find(detail=True)`` pages
through ListObjectsV2 (1,000 keys a request) and already carries what the catalog compares
(size and ETag), so no object is opened or HEADed. s3fs retries throttling ("SlowDown") a
few times on its own; ``storage.retry`` adds a deadline over the whole listing, for stores
that throttle for longer or drop connections, and then names the prefix and the last error.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .fingerprint import fingerprint_of
from .location import Where, as_location
from .retry import RetriesExhausted, RetryPolicy, with_retries
from .uri import split_scheme


class ListingError(RetriesExhausted):
    """A prefix that could not be listed within the retry budget."""


@dataclass(frozen=True)
class ObjectInfo:
    uri: str  # s3://bucket/key (or a local path)
    key: str  # relative to the listed prefix, '/'-separated
    size: int
    fingerprint: str  # etag:... on S3, size+mtime locally (storage.fingerprint)
    modified: float | None  # seconds since the epoch


def list_objects(where: Where, policy: RetryPolicy | None = None) -> list[ObjectInfo]:
    """Every object under the prefix ``where`` (recursively), sorted by key. A prefix that
    does not exist lists as empty; other failures raise ListingError after the retries."""
    where = as_location(where)
    prefix = where.uri
    fs, root = where.fs_and_path()
    root = root.rstrip("/")
    protocol, _ = split_scheme(prefix)
    scheme = f"{protocol}://" if protocol is not None else ""

    def listing() -> dict[str, dict[str, Any]]:
        fs.invalidate_cache(root)  # another process may have written since the last scan
        try:
            return fs.find(root, detail=True)  # type: ignore[no-any-return]
        except FileNotFoundError:
            return {}

    found = with_retries(listing, f"listing {prefix}", policy or RetryPolicy(), error=ListingError)
    objects = []
    for path, entry in found.items():
        if entry.get("type") == "directory":
            continue
        key = path[len(root) :].lstrip("/") if path.startswith(root) else path
        objects.append(
            ObjectInfo(
                uri=f"{scheme}{path}",
                key=key,
                size=int(entry.get("size") or 0),
                fingerprint=fingerprint_of(entry),
                modified=_epoch(entry.get("LastModified") or entry.get("mtime")),
            )
        )
    objects.sort(key=lambda o: o.key)
    return objects


def _epoch(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float):
        return float(value)
    return None
