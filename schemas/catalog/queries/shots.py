"""Shows and shots: which exist, each shot's coverage per pass, a shot's plates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, ScalarSelect, Select, distinct, func, select

from schemas.catalog import models as m
from schemas.catalog.queries.by_shot import SHOT_NAMES, filter_shot, with_shot
from schemas.catalog.queries.paging import Bind, Item, Reader, iso, page, reading


def _shots(show: str | None, sequence: str | None, shot: str | None) -> Select[Any]:
    """The shots with these names (None: any), by show, sequence and shot name."""
    stmt = (
        select(m.Shot.id, *SHOT_NAMES)
        .select_from(m.Shot)
        .join(m.Sequence, m.Sequence.id == m.Shot.sequence_id)
        .join(m.Show, m.Show.id == m.Sequence.show_id)
        .order_by(m.Show.name, m.Sequence.name, m.Shot.name)
    )
    return filter_shot(stmt, show, sequence, shot)


def show_names(bind: Bind) -> list[str]:
    """Every show's name, sorted."""
    with reading(bind) as conn:
        return list(conn.execute(select(m.Show.name).order_by(m.Show.name)).scalars())


def shot_exists(bind: Bind, show: str, sequence: str, shot: str) -> bool:
    """Whether the catalog has the shot show/sequence/shot."""
    with reading(bind) as conn:
        return conn.execute(_shots(show, sequence, shot).limit(1)).first() is not None


def shots_page(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    limit: int = 1000,
    offset: int = 0,
) -> tuple[list[Item], int]:
    """Shots by name with their coverage, and the total. Per shot: the newest plate and its
    frame count, per pass the number of distinct frames with an EXR output (pose: a pose
    record; any job, any version), and the newest job's id and status."""
    stmt = _shots(show, sequence, shot).add_columns(
        _newest(m.Plate, m.Plate.updated_at).label("plate_id"),
        _newest(m.Job, m.Job.created_at).label("job_id"),
    )
    return page(bind, stmt, _coverage, limit, offset)


def _newest(model: type[m.Plate] | type[m.Job], stamp: Any) -> ScalarSelect[int]:
    """The id of the shot's newest ``model`` row by ``stamp`` (then id), for a select over
    shots."""
    return (
        select(model.id)
        .where(model.shot_id == m.Shot.id)
        .order_by(stamp.desc(), model.id.desc())
        .limit(1)
        .correlate(m.Shot)
        .scalar_subquery()
    )


def _coverage(conn: Reader, shots: Sequence[Row[Any]]) -> list[Item]:
    plate_ids = [r.plate_id for r in shots if r.plate_id is not None]
    job_ids = [r.job_id for r in shots if r.job_id is not None]
    plates = {
        r.id: (r.pattern, r.frames)
        for r in conn.execute(
            select(m.Plate.id, m.Plate.pattern, func.count(m.PlateFrame.id).label("frames"))
            .outerjoin(m.PlateFrame, m.PlateFrame.plate_id == m.Plate.id)
            .where(m.Plate.id.in_(plate_ids))
            .group_by(m.Plate.id, m.Plate.pattern)
        )
    }
    found = conn.execute(select(m.Job.id, m.Job.status).where(m.Job.id.in_(job_ids)))
    statuses = {job_id: status for job_id, status in found}
    passes: dict[int, dict[str, int]] = {}
    counts = conn.execute(
        select(m.Output.shot_id, m.Output.pass_name, func.count(distinct(m.Output.frame)))
        .where(m.Output.shot_id.in_([r.id for r in shots]))
        .where(m.Output.kind.in_(("exr", "pose_json")), m.Output.deletion_id.is_(None))
        .group_by(m.Output.shot_id, m.Output.pass_name)
    )
    for shot_id, pass_name, frames in counts:
        passes.setdefault(shot_id, {})[pass_name] = frames
    result = []
    for r in shots:
        pattern, frames = plates.get(r.plate_id, (None, 0))
        result.append(
            {
                "show": r.show,
                "sequence": r.sequence,
                "shot": r.shot,
                "plate": pattern,
                "plate_frames": frames,
                "passes": dict(sorted(passes.get(r.id, {}).items())),
                "job_id": r.job_id,
                "job_status": statuses.get(r.job_id),
            }
        )
    return result


def shot_plates(bind: Bind, show: str, sequence: str, shot: str) -> list[Item]:
    """The shot's plates, newest first, each with the number of frames recorded."""
    stmt = (
        select(
            m.Plate.id,
            m.Plate.pattern,
            m.Plate.first_frame,
            m.Plate.last_frame,
            m.Plate.width,
            m.Plate.height,
            m.Plate.data_window,
            m.Plate.display_window,
            m.Plate.pixel_aspect,
            m.Plate.colorspace,
            m.Plate.colorspace_guessed,
            m.Plate.created_at,
            m.Plate.updated_at,
            func.count(m.PlateFrame.id).label("frames"),
        )
        .select_from(m.Plate)
        .outerjoin(m.PlateFrame, m.PlateFrame.plate_id == m.Plate.id)
        .group_by(m.Plate.id)
        .order_by(m.Plate.updated_at.desc(), m.Plate.id.desc())
    )
    stmt = with_shot(stmt, m.Plate.shot_id, show, sequence, shot)
    with reading(bind) as conn:
        rows = [dict(r._mapping) for r in conn.execute(stmt)]
    for row in rows:
        row["created_at"], row["updated_at"] = iso(row["created_at"]), iso(row["updated_at"])
    return rows
