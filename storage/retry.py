"""Retrying requests to a service that may be briefly away (an object store, the catalog's
database): exponential backoff with full jitter inside a bounded total time, so throttling
("SlowDown", 503), a dropped connection or a database restart costs a wait, not a frame or a
scan, and a service that stays down is reported after a known time rather than never.

Plain Python with no dependencies (but the errors' root, `core.errors`): the object-store
readers and the catalog writer share it."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import SvfxError

log = logging.getLogger("svfx.storage")

# Not tenacity: its deadline reads time.monotonic itself; with_retries takes a clock (tests).


class RetriesExhausted(SvfxError, OSError):
    """A request that kept failing until the attempts or the deadline ran out."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    first_wait_s: float = 0.2
    max_wait_s: float = 5.0
    deadline_s: float = 60.0  # total time, retries included


# Errors that say the request itself is wrong: retrying cannot help.
_PERMANENT = (FileNotFoundError, PermissionError, NotADirectoryError, ValueError, TypeError)


def with_retries(
    action: Callable[[], Any],
    what: str,
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    error: type[Exception] = RetriesExhausted,
    retryable: Callable[[Exception], bool] | None = None,
) -> Any:
    """Run ``action``; on a transient error wait (exponential backoff, full jitter) and try
    again until it succeeds, the attempts run out or the deadline would pass (then ``error``
    names ``what``, the attempts, the time and the last cause).

    Transient means: not one of the permanent OS errors (missing, forbidden) and, when
    ``retryable`` is given, an error it accepts; anything else is raised at once."""
    start = clock()
    wait = policy.first_wait_s
    for attempt in range(1, policy.attempts + 1):
        try:
            return action()
        except _PERMANENT:
            raise
        except Exception as exc:
            if retryable is not None and not retryable(exc):
                raise
            elapsed = clock() - start
            pause = random.uniform(0, wait)
            if attempt == policy.attempts or elapsed + pause > policy.deadline_s:
                raise error(
                    f"{what}: gave up after {attempt} attempts in {elapsed:.1f} s: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            log.warning("%s: %s (attempt %d), retrying in %.2f s", what, exc, attempt, pause)
            sleep(pause)
            wait = min(wait * 2, policy.max_wait_s)
    raise AssertionError("unreachable")
