"""The catalog's writer: the only API the flow uses to record jobs and what they made.

Every write is one transaction (``BEGIN IMMEDIATE`` on SQLite) and idempotent: rows are
upserted on their natural keys with the dialect's ``INSERT ... ON CONFLICT``, so recording a
chunk again after a Dask retry updates rows in place instead of adding new ones. Job counters
are recomputed from ``job_frames`` inside the same transaction, after the job row is locked
(``SELECT ... FOR UPDATE`` on PostgreSQL), so concurrent writers never lose a count.

Because every write is idempotent, a transaction that fails on a transient database error (a
PostgreSQL restart, a dropped connection, SQLite busy) is simply run again, with backoff,
within a bounded time (``CATALOG_RETRY``); then ``CatalogUnavailable`` names the catalog.
Registering a job is made idempotent too (a retried registration finds the row it may have
committed), and checks that no live job writes the same output folder (``JobConflict``),
closing jobs whose process is gone (``schemas.catalog.lease``).

``Catalog`` is assembled from its parts, one module each: ``transactions`` (the engine and
the retried transactions), ``job_lifecycle``, ``chunk_recording``, ``qc_recording``,
``publish_recording``, ``deletion_recording`` and ``planner_reads``; ``upserts`` holds the
tables and the row operations they share.
"""

from __future__ import annotations

from schemas.catalog.chunk_recording import ChunkRecording
from schemas.catalog.deletion_recording import DeletionRecording
from schemas.catalog.job_lifecycle import JobLifecycle
from schemas.catalog.planner_reads import PlannerReads
from schemas.catalog.publish_recording import PublishRecording
from schemas.catalog.qc_recording import QcRecording
from storage.retry import RetryPolicy


class Catalog(
    JobLifecycle, ChunkRecording, QcRecording, PublishRecording, DeletionRecording, PlannerReads
):
    """Writer API over one engine (see ``schemas.catalog.opening.open_catalog``)."""

    def with_retry(self, policy: RetryPolicy) -> Catalog:
        """The same catalog (same engine) waiting at most as ``policy`` says on each write."""
        return Catalog(self.engine, policy)
