"""Jobs: pages of them by shot and status, one by id, and which used untrained models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, Select, false, select

from schemas.catalog import models as m
from schemas.catalog.queries.by_shot import SHOT_NAMES, filter_shot, join_shot, where_given
from schemas.catalog.queries.paging import (
    Bind,
    Item,
    Reader,
    ToItems,
    iso,
    newest_page,
    reading,
)
from schemas.catalog.queries.qc import DEFAULT_FLICKER_THRESHOLD, flagged_frames


def jobs_select() -> Select[Any]:
    """Every job with its shot's names and its plate's pattern (``plate``)."""
    stmt = (
        select(*m.Job.__table__.c, *SHOT_NAMES, m.Plate.pattern.label("plate"))
        .select_from(m.Job)
        .join(m.Plate, m.Plate.id == m.Job.plate_id)
    )
    return join_shot(stmt, m.Job.shot_id)


def job_dict(row: Row[Any]) -> Item:
    """A row of ``jobs_select`` as a job item (without its frames)."""
    return {
        "id": row.id,
        "show": row.show,
        "sequence": row.sequence,
        "shot": row.shot,
        "plate": row.plate,
        "status": row.status,
        "submitter": row.submitter,
        "flow_run_id": row.flow_run_id,
        "created_at": iso(row.created_at),
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "frames_total": row.frames_total,
        "frames_done": row.frames_done,
        "frames_failed": row.frames_failed,
        "frames_skipped": row.frames_skipped,
        "message": row.message,
        "spec": row.spec,
    }


def _with_frames(flicker_threshold: float) -> ToItems:
    """Job items with their failed frames (``failed_frames``: frame, error) and the frames
    temporal QC flags in their outputs (``flagged_frames``, see ``qc.flagged_frames``)."""

    def to_items(conn: Reader, rows: Sequence[Row[Any]]) -> list[Item]:
        ids = [r.id for r in rows]
        failed = conn.execute(
            select(m.JobFrame.job_id, m.JobFrame.frame, m.JobFrame.error)
            .where(m.JobFrame.job_id.in_(ids), m.JobFrame.status == "failed")
            .order_by(m.JobFrame.job_id, m.JobFrame.frame)
        ).all()
        by_job: dict[int, list[Item]] = {}
        for f in failed:
            by_job.setdefault(f.job_id, []).append({"frame": f.frame, "error": f.error})
        flagged = flagged_frames(conn, ids, flicker_threshold) if ids else {}
        result = []
        for r in rows:
            job = job_dict(r)
            job["failed_frames"] = by_job.get(job["id"], [])
            job["flagged_frames"] = flagged.get(job["id"], [])
            result.append(job)
        return result

    return to_items


def jobs_page(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    status: str | None = None,
    limit: int = 50,
    offset: int = 0,
    flicker_threshold: float = DEFAULT_FLICKER_THRESHOLD,
) -> tuple[list[Item], int]:
    """Jobs of the named show/sequence/shot with this status (None: any), newest first, each
    with its failed and flagged frames; and the total."""
    stmt = where_given(filter_shot(jobs_select(), show, sequence, shot), (m.Job.status, status))
    to_items = _with_frames(flicker_threshold)
    return newest_page(bind, stmt, m.Job.created_at, m.Job.id, to_items, limit, offset)


def job(
    bind: Bind, job_id: int, flicker_threshold: float = DEFAULT_FLICKER_THRESHOLD
) -> Item | None:
    """The job as ``jobs_page`` lists it, by its id (None when unknown)."""
    with reading(bind) as conn:
        rows = conn.execute(jobs_select().where(m.Job.id == job_id)).all()
        return _with_frames(flicker_threshold)(conn, rows)[0] if rows else None


def untrained_jobs(bind: Bind, job_ids: list[int]) -> set[int]:
    """The jobs among ``job_ids`` with an output that depends on a checkpoint recorded as
    untrained (random weights), directly or as an input (seg for pose)."""
    if not job_ids:
        return set()
    # EXISTS per output: the jobs' outputs are few and each looks up its own checkpoints
    # (a join let PostgreSQL hash them and scan every output's checkpoints instead)
    untrained = (
        select(m.OutputCheckpoint.output_id)
        .join(m.Checkpoint, m.Checkpoint.id == m.OutputCheckpoint.checkpoint_id)
        .where(m.OutputCheckpoint.output_id == m.Output.id, m.Checkpoint.trained == false())
    )
    stmt = (
        select(m.Output.job_id).distinct().where(m.Output.job_id.in_(job_ids), untrained.exists())
    )
    with reading(bind) as conn:
        return set(conn.execute(stmt).scalars())
