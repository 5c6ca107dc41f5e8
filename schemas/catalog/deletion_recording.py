"""The writer's part for deleting a version (`tasks.deletion`): the version's outputs are
marked deleted in one transaction before any of its files goes, so at every moment each of
its frames is either complete on disk and in the catalog or marked deleted; the deletion's
row is finished once the folder is gone. While a deletion is unfinished no job may register
on its folder (``VersionBeingDeleted``), so a delete never removes a new job's files."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import Connection, Table, func, select, update

from schemas.catalog import models as m
from schemas.catalog.errors import VersionStillRunning
from schemas.catalog.lease import owner_alive
from schemas.catalog.queries.versions import ACTIVE_STATUSES
from schemas.catalog.transactions import CatalogTransactions
from schemas.catalog.upserts import JOBS, OUTPUTS, SHOTS

DELETIONS = cast(Table, m.Deletion.__table__)


class DeletionRecording(CatalogTransactions):
    """Mark a version deleted and finish its deletion (a part of
    ``schemas.catalog.writer.Catalog``)."""

    def mark_version_deleted(
        self, shot_id: int, version: str, folder: str, requested_by: str, reason: str
    ) -> tuple[int, int, int]:
        """Record the deletion of ``folder`` and point its live outputs at it, in one
        transaction under the shot's lock (no job can register on the folder meanwhile);
        an unfinished deletion of the folder is continued rather than started again.
        Returns (deletion id, outputs marked in all, their bytes)."""
        now = m.utcnow()

        def work(conn: Connection) -> tuple[int, int, int]:
            conn.execute(select(SHOTS.c.id).where(SHOTS.c.id == shot_id).with_for_update())
            _refuse_live_jobs(conn, folder, now)
            deletion_id = unfinished_deletion(conn, folder)
            if deletion_id is None:
                row = DELETIONS.insert().values(
                    shot_id=shot_id,
                    version=version,
                    output_root=folder,
                    requested_by=requested_by,
                    reason=reason,
                    outputs=0,
                    size_bytes=0,
                    started_at=now,
                )
                deletion_id = int(conn.execute(row.returning(DELETIONS.c.id)).scalar_one())
            o = OUTPUTS.c
            in_folder = func.substr(o.uri, 1, len(folder) + 1) == folder + "/"
            conn.execute(
                update(OUTPUTS)
                .where(o.shot_id == shot_id, o.deletion_id.is_(None), in_folder)
                .values(deletion_id=deletion_id)
            )
            return (deletion_id, *_marked_totals(conn, deletion_id))

        return self._write(work, f"marking {folder} deleted")

    def finish_deletion(self, deletion_id: int) -> None:
        """The folder is gone: the deletion is complete, with what it freed."""

        def work(conn: Connection) -> None:
            outputs, size = _marked_totals(conn, deletion_id)
            conn.execute(
                update(DELETIONS)
                .where(DELETIONS.c.id == deletion_id, DELETIONS.c.finished_at.is_(None))
                .values(finished_at=m.utcnow(), outputs=outputs, size_bytes=size)
            )

        self._write(work, f"finishing deletion {deletion_id}")


def unfinished_deletion(conn: Connection, folder: str) -> int | None:
    """The id of the folder's deletion that has not finished, if any."""
    found = conn.execute(
        select(DELETIONS.c.id).where(
            DELETIONS.c.output_root == folder, DELETIONS.c.finished_at.is_(None)
        )
    ).scalar()
    return None if found is None else int(found)


def _refuse_live_jobs(conn: Connection, folder: str, now: datetime) -> None:
    jobs = conn.execute(
        select(JOBS.c.id, JOBS.c.owner, JOBS.c.heartbeat_at).where(
            JOBS.c.output_root == folder, JOBS.c.status.in_(ACTIVE_STATUSES)
        )
    ).all()
    for job in jobs:
        if job.owner is None or owner_alive(job.owner, job.heartbeat_at, now):
            raise VersionStillRunning(folder, int(job.id))


def _marked_totals(conn: Connection, deletion_id: int) -> tuple[int, int]:
    """How many output rows point at the deletion, and the bytes of their files (each file,
    or a Zarr array's frame, once)."""
    o = OUTPUTS.c
    per_file = (
        select(func.count().label("rows"), func.max(o.size_bytes).label("size"))
        .where(o.deletion_id == deletion_id)
        .group_by(o.uri, o.frame)
        .subquery()
    )
    rows, size = conn.execute(select(func.sum(per_file.c.rows), func.sum(per_file.c.size))).one()
    return int(rows or 0), int(size or 0)
