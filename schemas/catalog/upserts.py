"""The tables the catalog's writer writes, and the row operations its parts share: the
dialect's ``INSERT ... ON CONFLICT``, ids of rows on their natural keys, the job row lock and
the job's counters, upserts of plate frames and job frames. All run inside the caller's
transaction."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import Connection, Table, and_, case, func, null, select, update
from sqlalchemy.dialects import postgresql, sqlite

from schemas.catalog import models as m


def _table(model: type[m.Base]) -> Table:
    return cast(Table, model.__table__)


SHOWS, SEQUENCES, SHOTS = _table(m.Show), _table(m.Sequence), _table(m.Shot)
PLATES, PLATE_FRAMES = _table(m.Plate), _table(m.PlateFrame)
CHECKPOINTS, PROVENANCE = _table(m.Checkpoint), _table(m.Provenance)
JOBS, JOB_FRAMES = _table(m.Job), _table(m.JobFrame)
OUTPUTS, OUTPUT_CHECKPOINTS = _table(m.Output), _table(m.OutputCheckpoint)
OUTPUT_SOURCES = _table(m.OutputSource)


def insert_for(conn: Connection, table: Table) -> sqlite.Insert | postgresql.Insert:
    """INSERT with ON CONFLICT support for the connection's dialect."""
    name = conn.dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise ValueError(f"the catalog runs on SQLite or PostgreSQL, not {name}")


def get_id(conn: Connection, table: Table, key: dict[str, Any], **extra: Any) -> int:
    """Id of the row with ``key`` (its unique columns), inserting it first if missing."""
    conn.execute(
        insert_for(conn, table)
        .values(**key, **extra)
        .on_conflict_do_nothing(index_elements=list(key))
    )
    where = [table.c[name] == value for name, value in key.items()]
    return int(conn.execute(select(table.c.id).where(*where)).scalar_one())


def lock_job(conn: Connection, job_id: int) -> tuple[int, int]:
    """(shot_id, plate_id) of the job, row-locked until commit (SQLite: the whole db is)."""
    row = conn.execute(
        select(JOBS.c.shot_id, JOBS.c.plate_id).where(JOBS.c.id == job_id).with_for_update()
    ).one_or_none()
    if row is None:
        raise LookupError(f"no job {job_id} in the catalog; register_job first")
    return int(row.shot_id), int(row.plate_id)


def dedupe(rows: Iterable[dict[str, Any]], key: tuple[str, ...]) -> list[dict[str, Any]]:
    """Last row per key (ON CONFLICT DO UPDATE may not touch one row twice in a statement),
    sorted by key so concurrent writers lock shared rows in the same order (no deadlocks)."""
    latest = {tuple(row[k] for k in key): row for row in rows}
    return [latest[k] for k in sorted(latest)]


def upsert_plate_frames(conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
    rows = dedupe(rows, ("plate_id", "frame"))
    if not rows:
        return
    ins = insert_for(conn, PLATE_FRAMES)
    new, old = ins.excluded, PLATE_FRAMES.c
    refetched = and_(
        new.fingerprint.is_not(None),
        old.fingerprint.is_not(None),
        new.fingerprint != old.fingerprint,
    )
    conn.execute(
        ins.on_conflict_do_update(
            index_elements=["plate_id", "frame"],
            set_={
                "uri": case((new.uri != "", new.uri), else_=old.uri),
                "size_bytes": func.coalesce(new.size_bytes, old.size_bytes),
                "fingerprint": func.coalesce(new.fingerprint, old.fingerprint),
                # a new checksum wins; a changed file without one forgets the old checksum
                "sha256": case(
                    (new.sha256.is_not(None), new.sha256), (refetched, null()), else_=old.sha256
                ),
                "updated_at": new.updated_at,
            },
        ),
        rows,
    )


def upsert_job_frames(conn: Connection, rows: Iterable[dict[str, Any]], *, replace: bool) -> None:
    rows = dedupe(rows, ("job_id", "frame"))
    if not rows:
        return
    ins = insert_for(conn, JOB_FRAMES)
    if replace:
        stmt = ins.on_conflict_do_update(
            index_elements=["job_id", "frame"],
            set_={
                key: ins.excluded[key]
                for key in ("status", "error", "timings", "worker", "tiles_run", "tiles_skipped")
            },
        )
    else:
        stmt = ins.on_conflict_do_nothing(index_elements=["job_id", "frame"])
    conn.execute(stmt, rows)


def refresh_counters(conn: Connection, job_id: int) -> None:
    """Recount the job's frames from job_frames (idempotent, unlike n = n + k on a retry)."""

    def count(status: str) -> Any:
        return (
            select(func.count())
            .select_from(JOB_FRAMES)
            .where(JOB_FRAMES.c.job_id == job_id, JOB_FRAMES.c.status == status)
            .scalar_subquery()
        )

    conn.execute(
        update(JOBS)
        .where(JOBS.c.id == job_id)
        .values(
            frames_done=count("done"),
            frames_failed=count("failed"),
            frames_skipped=count("skipped"),
        )
    )
