"""Keeping a running shot's job true in the catalog (``flows.shot_runner``): chunk summaries
recorded in order, and kept while the catalog is away past a short wait; a heartbeat that
says the run is alive; and the job closed on every way out of the run."""

from __future__ import annotations

import logging
import threading

from schemas.catalog.errors import CatalogUnavailable
from schemas.catalog.lease import HEARTBEAT_S
from schemas.catalog.writer import Catalog
from schemas.summaries import ChunkSummary
from storage.retry import RetryPolicy

from .shot_result import ShotResult, outcome_message

log = logging.getLogger("svfx.flow")

# While chunks keep landing, a catalog write waits this long before the summary is kept for
# later (the GPUs keep working); at the end of the shot the catalog's own, longer deadline.
DURING_SHOT_RETRY = RetryPolicy(attempts=10_000, first_wait_s=0.25, max_wait_s=2.0, deadline_s=10.0)


class ChunkRecorder:
    """Writes chunk summaries into the catalog in order; while the catalog is away (past a
    short wait) keeps them and tries again with each later chunk, so dispatch goes on."""

    def __init__(self, catalog: Catalog, job_id: int) -> None:
        self.catalog = catalog
        self.job_id = job_id
        self.pending: list[ChunkSummary] = []
        self.during_shot = catalog.with_retry(DURING_SHOT_RETRY)

    def record(self, summary: ChunkSummary) -> None:
        self.pending.append(summary)
        self.flush(final=False)

    def flush(self, *, final: bool) -> None:
        catalog = self.catalog if final else self.during_shot
        while self.pending:
            try:
                catalog.record_chunk(self.job_id, self.pending[0])
            except CatalogUnavailable as exc:
                if final:
                    frames = sum(len(s.frames) for s in self.pending)
                    raise CatalogUnavailable(
                        exc.where, f"{exc.reason}; {frames} finished frames are not recorded"
                    ) from None
                log.warning("%s; keeping %d chunk summaries for later", exc, len(self.pending))
                return
            self.pending.pop(0)


class Heartbeat:
    """Refreshes the job's heartbeat every HEARTBEAT_S seconds on a daemon thread."""

    def __init__(self, catalog: Catalog, job_id: int) -> None:
        self.catalog = catalog
        self.job_id = job_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="svfx-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            try:
                self.catalog.heartbeat(self.job_id)
            except Exception as exc:  # the database away: the next beat tries again
                log.debug("heartbeat of job %s failed: %s", self.job_id, exc)


def close_after(catalog: Catalog, result: ShotResult, exc: BaseException) -> None:
    """Close the job of a run that stops on ``exc`` (an error, Ctrl-C, SIGTERM)."""
    recorded = result.done or result.skipped or result.adopted
    status = "partial" if recorded else "failed"
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        reason = "the run was interrupted"
    result.status, result.error = status, reason
    message = f"the run stopped before the end: {reason}; {outcome_message(result)}"
    try:
        catalog.with_retry(DURING_SHOT_RETRY).finish_job(result.job_id, status, message)
    except Exception as close_error:  # the catalog away or anything else: say so, go on
        log.error(
            "job %s could not be closed (%s); the next job on its outputs closes it",
            result.job_id,
            close_error,
        )
