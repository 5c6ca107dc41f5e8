"""The writer's part for publishes to a production tracker: one row per job and tracker,
published (with the tracker's entity ids) or pending (with the reason), written again on
every attempt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import Connection, Table, case

from schemas.catalog import models as m
from schemas.catalog.transactions import CatalogTransactions
from schemas.catalog.upserts import insert_for, lock_job

PUBLISHES = cast(Table, m.Publish.__table__)


class PublishRecording(CatalogTransactions):
    """Record what a publish came to (a part of ``schemas.catalog.writer.Catalog``)."""

    def record_publish(
        self,
        job_id: int,
        tracker: str,
        *,
        code: str,
        entity_ids: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> str:
        """A publish of the job to ``tracker``: ``published`` with the tracker's entity ids,
        or ``pending`` with ``reason`` when ``reason`` is given. A failed attempt never undoes
        a publish that was made (the row stays published, with its ids). Returns the status
        asked for."""
        status = "pending" if reason is not None else "published"
        now = m.utcnow()

        def work(conn: Connection) -> str:
            shot_id, _plate_id = lock_job(conn, job_id)
            ins = insert_for(conn, PUBLISHES)
            values: dict[str, Any] = {
                "job_id": job_id,
                "shot_id": shot_id,
                "tracker": tracker,
                "status": status,
                "code": code,
                "entity_ids": dict(entity_ids or {}),
                "reason": reason,
                "attempts": 1,
                "created_at": now,
                "updated_at": now,
                "published_at": None if reason is not None else now,
            }
            update: dict[str, Any] = {
                "attempts": PUBLISHES.c.attempts + 1,
                "updated_at": ins.excluded.updated_at,
            }
            if reason is None:
                update.update(
                    {key: ins.excluded[key] for key in
                     ("status", "code", "reason", "entity_ids", "published_at")}
                )  # fmt: skip
            else:  # a publish that was made stays published; a pending one learns why
                was_published = PUBLISHES.c.status == "published"
                update["status"] = case((was_published, PUBLISHES.c.status), else_="pending")
                update["reason"] = case((was_published, PUBLISHES.c.reason), else_=reason)
            conn.execute(
                ins.values(**values).on_conflict_do_update(
                    index_elements=["job_id", "tracker"], set_=update
                )
            )
            return status

        return self._write(work, f"recording the {tracker} publish of job {job_id}")
