"""Temporal QC: flicker scores per pass and frame, and the frames a job's outputs flag."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import ColumnElement, and_, func, or_, select

from schemas.catalog import models as m
from schemas.catalog.queries.by_shot import with_shot
from schemas.catalog.queries.outputs import LIVE, newest_of_pass_frame
from schemas.catalog.queries.paging import Bind, Item, reading

DEFAULT_FLICKER_THRESHOLD = 3.0  # schemas.settings.Settings.qc_flicker_threshold's default


def flagged_frames(bind: Bind, job_ids: list[int], threshold: float) -> dict[int, list[Item]]:
    """Per job: the EXR outputs in its output folder whose flicker score is above
    ``threshold``, by pass and frame (one query for all the jobs). Keys: pass_name, frame,
    flicker. The folder, not the job id, picks them (a resubmit scores the frames an earlier
    job made too); a job without a recorded folder, by its own outputs. Folders and URIs are
    stored normalised (``normalise_uri``), so a plain prefix comparison holds."""
    job, out = m.Job, m.Output
    stmt = (
        select(job.id.label("job_id"), out.pass_name, out.frame, out.flicker)
        .distinct()  # one row per part of the EXR
        .select_from(job)
        .join(out, out.shot_id == job.shot_id)
        .where(
            job.id.in_(job_ids), out.kind == "exr", out.flicker > threshold, _in_job_folder(), LIVE
        )
        .order_by(job.id, out.pass_name, out.frame)
    )
    found: dict[int, list[Item]] = {}
    with reading(bind) as conn:
        for row in conn.execute(stmt):
            found.setdefault(row.job_id, []).append(
                {"pass_name": row.pass_name, "frame": row.frame, "flicker": row.flicker}
            )
    return found


def unscored(bind: Bind, job_id: int, pass_names: Iterable[str], method: str) -> bool:
    """Whether an EXR output of those passes in the job's output folder has no flicker score
    made by ``method`` (none at all, or one of another method): its version's QC is to run
    again, even where the run remade no frame."""
    job, out = m.Job, m.Output
    stmt = (
        select(out.id)
        .select_from(job)
        .join(out, out.shot_id == job.shot_id)
        .where(
            job.id == job_id,
            out.kind == "exr",
            LIVE,
            out.pass_name.in_(list(pass_names)),
            or_(out.flicker.is_(None), out.flicker_method.is_distinct_from(method)),
            _in_job_folder(),
        )
        .limit(1)
    )
    with reading(bind) as conn:
        return conn.execute(stmt).first() is not None


def _in_job_folder() -> ColumnElement[bool]:
    """An output is the job's version's: in its output folder (a resubmit's frames made by an
    earlier job too), or, for a job without a recorded folder, its own. Folders and URIs are
    stored normalised (``normalise_uri``), so a plain prefix comparison holds."""
    job, out = m.Job, m.Output
    folder = job.output_root.concat("/")
    in_folder = func.substr(out.uri, 1, func.length(folder)) == folder
    return or_(
        and_(job.output_root.is_not(None), in_folder),
        and_(job.output_root.is_(None), out.job_id == job.id),  # recorded before folders were
    )


def flicker_scores(
    bind: Bind, show: str, sequence: str, shot: str, pass_name: str | None = None
) -> list[Item]:
    """The temporal QC score of each (pass, frame) of each version of the shot (its output
    folder; the newest scored EXR output there), with the id of the frame's newest preview
    for a link (None without one). Keys: pass_name, frame, flicker, flicker_method, uri,
    job_id, output_root, preview_id, preview_uri; by pass, version and frame."""
    in_version = newest_of_pass_frame(m.Job.output_root)
    cols = (
        m.Output.pass_name,
        m.Output.frame,
        m.Output.flicker,
        m.Output.flicker_method,
        m.Output.uri,
        m.Output.job_id,
        m.Job.output_root,
        in_version,
    )
    scored = (
        with_shot(select(*cols), m.Output.shot_id, show, sequence, shot)
        .join(m.Job, m.Job.id == m.Output.job_id)
        .where(m.Output.kind == "exr", m.Output.flicker.is_not(None), LIVE)
    )
    if pass_name is not None:
        scored = scored.where(m.Output.pass_name == pass_name)
    pcols = (
        m.Output.id, m.Output.pass_name, m.Output.frame, m.Output.uri, m.Job.output_root,
        in_version,
    )  # fmt: skip
    previews = (
        with_shot(select(*pcols), m.Output.shot_id, show, sequence, shot)
        .join(m.Job, m.Job.id == m.Output.job_id)
        .where(m.Output.kind == "preview", LIVE)
    )
    s_ = scored.subquery()
    p_ = previews.subquery()
    stmt = (
        select(
            s_.c.pass_name,
            s_.c.frame,
            s_.c.flicker,
            s_.c.flicker_method,
            s_.c.uri,
            s_.c.job_id,
            s_.c.output_root,
            p_.c.id.label("preview_id"),
            p_.c.uri.label("preview_uri"),
        )
        .outerjoin(
            p_,
            (p_.c.pass_name == s_.c.pass_name)
            & (p_.c.frame == s_.c.frame)
            & p_.c.output_root.is_not_distinct_from(s_.c.output_root)  # NULL: older jobs
            & (p_.c.newest == 1),
        )
        .where(s_.c.newest == 1)
        .order_by(s_.c.pass_name, s_.c.output_root, s_.c.frame)
    )
    with reading(bind) as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]
