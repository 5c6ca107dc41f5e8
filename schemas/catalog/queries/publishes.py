"""Publishes to production trackers (``publishes``), and what a publish reads of its job:
the models that made its outputs and the frames it finished."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, Select, func, select

from schemas.catalog import models as m
from schemas.catalog.queries.by_shot import SHOT_NAMES, filter_shot, join_shot, where_given
from schemas.catalog.queries.paging import Bind, Item, each_row, iso, newest_page, reading


def publishes_select() -> Select[Any]:
    stmt = select(*m.Publish.__table__.c, *SHOT_NAMES).select_from(m.Publish)
    return join_shot(stmt, m.Publish.shot_id)


def publish_dict(row: Row[Any]) -> Item:
    item = dict(row._mapping)
    item.pop("shot_id")
    for key in ("created_at", "updated_at", "published_at"):
        item[key] = iso(item[key])
    return item


def publishes_page(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    status: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Item], int]:
    """Publishes of the named show/sequence/shot (None: any) with this status (None: any),
    newest first; and the total."""
    stmt = filter_shot(publishes_select(), show, sequence, shot)
    stmt = where_given(stmt, (m.Publish.status, status))
    to_items = each_row(publish_dict)
    return newest_page(bind, stmt, m.Publish.updated_at, m.Publish.id, to_items, limit, offset)


def job_publishes(bind: Bind, job_id: int) -> list[Item]:
    """The job's publishes, one per tracker."""
    stmt = publishes_select().where(m.Publish.job_id == job_id).order_by(m.Publish.tracker)
    with reading(bind) as conn:
        return [publish_dict(r) for r in conn.execute(stmt)]


def pending_publishes(bind: Bind, tracker: str | None = None) -> list[Item]:
    """Publishes still pending (oldest first), of one tracker or all."""
    stmt = where_given(
        publishes_select().where(m.Publish.status == "pending"), (m.Publish.tracker, tracker)
    )
    with reading(bind) as conn:
        return [publish_dict(r) for r in conn.execute(stmt.order_by(m.Publish.id))]


def job_models(bind: Bind, job_id: int) -> list[Item]:
    """The checkpoints that made the outputs in the job's output folder (by any job: a run
    that found every frame done made none itself), one per pass: pass, family, arch, task,
    trained, sha256."""
    root = select(m.Job.output_root).where(m.Job.id == job_id).scalar_subquery()
    stmt = (
        select(
            m.Output.pass_name,
            m.Checkpoint.family,
            m.Checkpoint.arch,
            m.Checkpoint.task,
            m.Checkpoint.trained,
            m.Checkpoint.sha256,
        )
        .distinct()
        .join(m.Checkpoint, m.Checkpoint.id == m.Output.checkpoint_id)
        .where(
            m.Output.shot_id == select(m.Job.shot_id).where(m.Job.id == job_id).scalar_subquery(),
            func.substr(m.Output.uri, 1, func.length(root) + 1) == root + "/",
        )
        .order_by(m.Output.pass_name)
    )
    with reading(bind) as conn:
        seen: dict[str, Item] = {}
        for r in conn.execute(stmt):
            seen.setdefault(r.pass_name, dict(r._mapping))
        return list(seen.values())


def job_frame_range(bind: Bind, job_id: int) -> tuple[int, int] | None:
    """The first and last frame the job finished (done, or found done), or None."""
    stmt = select(func.min(m.JobFrame.frame), func.max(m.JobFrame.frame)).where(
        m.JobFrame.job_id == job_id, m.JobFrame.status.in_(("done", "skipped"))
    )
    with reading(bind) as conn:
        first, last = conn.execute(stmt).one()
    return None if first is None else (int(first), int(last))


def newest_job_of_version(
    bind: Bind, show: str, sequence: str, shot: str, version: str
) -> int | None:
    """The newest job of the shot that wrote ``version`` (its spec's), or None."""
    stmt = filter_shot(
        join_shot(select(m.Job.id, m.Job.spec).select_from(m.Job), m.Job.shot_id),
        show,
        sequence,
        shot,
    ).order_by(m.Job.created_at.desc(), m.Job.id.desc())
    with reading(bind) as conn:
        for row in conn.execute(stmt):
            if str((row.spec or {}).get("version") or "v001") == version:
                return int(row.id)
    return None


def job_output_root(bind: Bind, job_id: int) -> tuple[str | None, str | None]:
    """The job's output folder and one EXR it holds (its frame numbers tell their padding)."""
    with reading(bind) as conn:
        root = conn.execute(select(m.Job.output_root).where(m.Job.id == job_id)).scalar()
        if root is None:
            return None, None
        exr = conn.execute(
            select(m.Output.uri)
            .where(
                m.Output.kind == "exr",
                func.substr(m.Output.uri, 1, len(root) + 1) == root + "/",
            )
            .limit(1)
        ).scalar()
    return str(root), exr
