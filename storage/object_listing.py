"""One recursive listing of a bucket prefix, with each object's size, ETag and modification
time, retried with backoff inside a bounded total time.

A scan of a prefix must cost the listing and nothing more: ``find(detail=True)`` pages through
ListObjectsV2 (1,000 keys a request) and already carries what the catalog compares (size and
ETag), so no object is opened or HEADed. s3fs retries throttling ("SlowDown") a few times on
its own; this adds a deadline over the whole listing, for stores that throttle for longer or
drop connections, and then names the prefix and the last error.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .fingerprint import fingerprint_of
from .uri import filesystem_for

log = logging.getLogger("svfx.storage")


class ListingError(OSError):
    """A prefix that could not be listed within the retry budget."""


@dataclass(frozen=True)
class ObjectInfo:
    uri: str  # s3://bucket/key (or a local path)
    key: str  # relative to the listed prefix, '/'-separated
    size: int
    fingerprint: str  # etag:... on S3, size+mtime locally (storage.fingerprint)
    modified: float | None  # seconds since the epoch


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    first_wait_s: float = 0.2
    max_wait_s: float = 5.0
    deadline_s: float = 60.0  # total time for one prefix, retries included


# Errors that say the request itself is wrong: retrying cannot help.
_PERMANENT = (FileNotFoundError, PermissionError, NotADirectoryError, ValueError, TypeError)


def with_retries(
    action: Callable[[], Any],
    what: str,
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """Run ``action``; on a transient error wait (exponential backoff, full jitter) and try
    again until it succeeds, the attempts run out or the deadline would pass."""
    start = clock()
    wait = policy.first_wait_s
    for attempt in range(1, policy.attempts + 1):
        try:
            return action()
        except _PERMANENT:
            raise
        except Exception as exc:
            elapsed = clock() - start
            pause = random.uniform(0, wait)
            if attempt == policy.attempts or elapsed + pause > policy.deadline_s:
                raise ListingError(
                    f"{what}: gave up after {attempt} attempts in {elapsed:.1f} s: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            log.warning("%s: %s (attempt %d), retrying in %.2f s", what, exc, attempt, pause)
            sleep(pause)
            wait = min(wait * 2, policy.max_wait_s)
    raise AssertionError("unreachable")


def list_objects(
    prefix: str,
    storage_options: dict[str, Any] | None = None,
    policy: RetryPolicy | None = None,
) -> list[ObjectInfo]:
    """Every object under ``prefix`` (recursively), sorted by key. A prefix that does not
    exist lists as empty; other failures raise ListingError after the retries."""
    fs, root = filesystem_for(prefix, storage_options)
    root = root.rstrip("/")
    scheme = prefix.split("://", 1)[0] + "://" if "://" in prefix else ""

    def listing() -> dict[str, dict[str, Any]]:
        fs.invalidate_cache(root)  # another process may have written since the last scan
        try:
            return fs.find(root, detail=True)  # type: ignore[no-any-return]
        except FileNotFoundError:
            return {}

    found = with_retries(listing, f"listing {prefix}", policy or RetryPolicy())
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
