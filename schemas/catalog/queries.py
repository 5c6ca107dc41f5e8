"""Read-only questions to the catalog, answered as JSON-friendly lists of dicts.

Every function takes an Engine, Connection or Session first, then filters; filters travel as
bound parameters only. Timestamps are ISO 8601 strings in UTC. Lists that can grow long take
``limit`` and ``offset``; the ``count_*`` functions give the totals behind their pages.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    distinct,
    false,
    func,
    or_,
    select,
)
from sqlalchemy.orm import Session

from schemas.catalog import models as m
from schemas.catalog.db import READ_OPTION
from schemas.catalog.uris import normalise_uri

Bind = Engine | Connection | Session
DEFAULT_FLICKER_THRESHOLD = 3.0  # schemas.settings.Settings.qc_flicker_threshold's default


@contextmanager
def reading(bind: Bind) -> Iterator[Connection | Session]:
    """A connection for reads; an Engine's gets a deferred BEGIN on SQLite (see db.py)."""
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            connection.execution_options(**{READ_OPTION: True})
            yield connection
    else:
        yield bind


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _page(stmt: Select[Any], limit: int, offset: int) -> Select[Any]:
    if limit < 0 or offset < 0:
        raise ValueError(f"limit and offset must not be negative (got {limit}, {offset})")
    return stmt.limit(limit).offset(offset)


def _count(bind: Bind, stmt: Select[Any]) -> int:
    """How many rows ``stmt`` selects (its ORDER BY dropped): the total behind a page."""
    counted = select(func.count()).select_from(stmt.order_by(None).subquery())
    with reading(bind) as conn:
        return int(conn.execute(counted).scalar_one())


def join_shot(stmt: Select[Any], shot_id: Any) -> Select[Any]:
    """Join shot, sequence and show to ``stmt`` on its ``shot_id`` column."""
    return (
        stmt.join(m.Shot, m.Shot.id == shot_id)
        .join(m.Sequence, m.Sequence.id == m.Shot.sequence_id)
        .join(m.Show, m.Show.id == m.Sequence.show_id)
    )


def filter_shot(
    stmt: Select[Any], show: str | None, sequence: str | None, shot: str | None
) -> Select[Any]:
    """Keep rows of the named show/sequence/shot (None: any); needs join_shot first."""
    for column, value in ((m.Show.name, show), (m.Sequence.name, sequence), (m.Shot.name, shot)):
        if value is not None:
            stmt = stmt.where(column == value)
    return stmt


def with_shot(
    stmt: Select[Any],
    shot_id: Any,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
) -> Select[Any]:
    return filter_shot(join_shot(stmt, shot_id), show, sequence, shot)


_SHOT_NAMES = (
    m.Show.name.label("show"),
    m.Sequence.name.label("sequence"),
    m.Shot.name.label("shot"),
)
_OUTPUT_COLUMNS = (
    m.Output.id,
    *_SHOT_NAMES,
    m.Output.job_id,
    m.Output.pass_name,
    m.Output.frame,
    m.Output.kind,
    m.Output.uri,
    m.Output.part,
    m.Output.sha256,
    m.Output.size_bytes,
    m.Output.shape,
    m.Output.dtype,
    m.Output.cache_key,
    m.Output.plate_sha256,
    m.Output.provenance_id,
    m.Checkpoint.sha256.label("checkpoint_sha256"),
    m.Output.created_at,
    m.Output.flicker,
)


_CHECKPOINT_COLUMNS = (
    m.Checkpoint.sha256,
    m.Checkpoint.arch,
    m.Checkpoint.task,
    m.Checkpoint.path,
    m.Checkpoint.trained,
    m.Checkpoint.size_bytes,
    m.Checkpoint.created_at,
)


def _outputs_select() -> Select[Any]:
    stmt = (
        select(*_OUTPUT_COLUMNS)
        .select_from(m.Output)
        .outerjoin(m.Checkpoint, m.Checkpoint.id == m.Output.checkpoint_id)
    )
    return join_shot(stmt, m.Output.shot_id)


def _output_dict(row: Any) -> dict[str, Any]:
    out = dict(row._mapping)
    out.pop("provenance_id")
    out["part"] = out["part"] or None
    out["created_at"] = iso(out["created_at"])
    return out


def _shots_select(
    show: str | None, sequence: str | None, shot: str | None, *extra: Any
) -> Select[Any]:
    stmt = (
        select(m.Shot.id, *_SHOT_NAMES, *extra)
        .select_from(m.Shot)
        .join(m.Sequence, m.Sequence.id == m.Shot.sequence_id)
        .join(m.Show, m.Show.id == m.Sequence.show_id)
    )
    return filter_shot(stmt, show, sequence, shot)


def count_shots(
    bind: Bind, show: str | None = None, sequence: str | None = None, shot: str | None = None
) -> int:
    """How many shots ``shot_coverage`` pages through with these filters."""
    return _count(bind, _shots_select(show, sequence, shot))


def show_names(bind: Bind) -> list[str]:
    """Every show's name, sorted."""
    with reading(bind) as conn:
        return list(conn.execute(select(m.Show.name).order_by(m.Show.name)).scalars())


def shot_coverage(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    limit: int = 1000,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Per shot: the newest plate and its frame count, per pass the number of distinct frames
    with an EXR output (pose: a pose record; any job, any version), and the newest job's id
    and status."""
    newest_plate = (
        select(m.Plate.id)
        .where(m.Plate.shot_id == m.Shot.id)
        .order_by(m.Plate.updated_at.desc(), m.Plate.id.desc())
        .limit(1)
        .correlate(m.Shot)
        .scalar_subquery()
    )
    newest_job = (
        select(m.Job.id)
        .where(m.Job.shot_id == m.Shot.id)
        .order_by(m.Job.created_at.desc(), m.Job.id.desc())
        .limit(1)
        .correlate(m.Shot)
        .scalar_subquery()
    )
    stmt = _shots_select(
        show, sequence, shot, newest_plate.label("plate_id"), newest_job.label("job_id")
    ).order_by(m.Show.name, m.Sequence.name, m.Shot.name)
    with reading(bind) as conn:
        shots = conn.execute(_page(stmt, limit, offset)).all()
        plate_ids = [r.plate_id for r in shots if r.plate_id is not None]
        job_ids = [r.job_id for r in shots if r.job_id is not None]
        shot_ids = [r.id for r in shots]
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
            .where(m.Output.shot_id.in_(shot_ids), m.Output.kind.in_(("exr", "pose_json")))
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


def _shot_outputs_select(
    show: str, sequence: str, shot: str, pass_name: str | None, kind: str | None
) -> Select[Any]:
    stmt = filter_shot(_outputs_select(), show, sequence, shot)
    if pass_name is not None:
        stmt = stmt.where(m.Output.pass_name == pass_name)
    if kind is not None:
        stmt = stmt.where(m.Output.kind == kind)
    return stmt


def count_outputs(
    bind: Bind,
    show: str,
    sequence: str,
    shot: str,
    pass_name: str | None = None,
    kind: str | None = None,
) -> int:
    """How many outputs ``shot_outputs`` pages through with these filters."""
    return _count(bind, _shot_outputs_select(show, sequence, shot, pass_name, kind))


def shot_outputs(
    bind: Bind,
    show: str,
    sequence: str,
    shot: str,
    pass_name: str | None = None,
    kind: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """A shot's outputs, newest first."""
    stmt = _shot_outputs_select(show, sequence, shot, pass_name, kind)
    stmt = stmt.order_by(m.Output.created_at.desc(), m.Output.id.desc())
    with reading(bind) as conn:
        return [_output_dict(r) for r in conn.execute(_page(stmt, limit, offset))]


def output_provenance(bind: Bind, path: str, frame: int | None = None) -> dict[str, Any] | None:
    """Everything known about how the file at ``path`` was made, or None if the catalog does
    not know the file (a plain miss is an answer, not an error).

    ``path`` may be relative, absolute or ``file://``; it is normalised as the writer
    normalised it. ``frame`` narrows a Zarr array (one URI for all frames) to one frame.
    Keys: ``uri``, ``outputs`` (one per pass/part/frame, each with the sha256s of the
    checkpoints it depends on and its provenance digest), ``checkpoints``, ``provenance``,
    ``jobs`` and ``plate_frames`` (lists: usually one entry each).
    """
    uri = normalise_uri(path)
    stmt = _outputs_select().where(m.Output.uri == uri)
    if frame is not None:
        stmt = stmt.where(m.Output.frame == frame)
    stmt = stmt.order_by(m.Output.frame, m.Output.pass_name, m.Output.part)
    with reading(bind) as conn:
        rows = conn.execute(stmt).all()
        if not rows:
            return None
        output_ids = [r.id for r in rows]
        deps = conn.execute(
            select(m.OutputCheckpoint.output_id, *_CHECKPOINT_COLUMNS)
            .join(m.Checkpoint, m.Checkpoint.id == m.OutputCheckpoint.checkpoint_id)
            .where(m.OutputCheckpoint.output_id.in_(output_ids))
            .order_by(m.Checkpoint.sha256)
        ).all()
        provenance = conn.execute(
            select(m.Provenance.id, m.Provenance.digest, m.Provenance.data)
            .where(m.Provenance.id.in_({r.provenance_id for r in rows}))
            .order_by(m.Provenance.id)
        ).all()
        job_rows = conn.execute(_jobs_select().where(m.Job.id.in_({r.job_id for r in rows}))).all()
        wanted = {(j.plate_id, r.frame) for j in job_rows for r in rows if r.job_id == j.id}
        plate_rows = conn.execute(
            select(
                m.PlateFrame.plate_id,
                m.PlateFrame.frame,
                m.PlateFrame.uri,
                m.PlateFrame.sha256,
                m.PlateFrame.size_bytes,
                m.PlateFrame.fingerprint,
            )
            .where(
                m.PlateFrame.plate_id.in_({p for p, _ in wanted}),
                m.PlateFrame.frame.in_({f for _, f in wanted}),
            )
            .order_by(m.PlateFrame.frame)
        ).all()
    checkpoints: dict[str, dict[str, Any]] = {}
    by_output: dict[int, list[str]] = {}
    for dep in deps:
        ckpt = dict(dep._mapping)
        ckpt["created_at"] = iso(ckpt["created_at"])
        output_id = ckpt.pop("output_id")
        checkpoints[ckpt["sha256"]] = ckpt
        by_output.setdefault(output_id, []).append(ckpt["sha256"])
    digests = {p.id: p.digest for p in provenance}
    outputs = []
    for r in rows:
        out = _output_dict(r)
        out["checkpoints"] = by_output.get(r.id, [])
        out["provenance_digest"] = digests[r.provenance_id]
        outputs.append(out)
    return {
        "uri": uri,
        "outputs": outputs,
        "checkpoints": list(checkpoints.values()),
        "provenance": [{"digest": p.digest, "data": p.data} for p in provenance],
        "jobs": [_job_dict(j) for j in job_rows],
        "plate_frames": [
            {
                "frame": pf.frame,
                "uri": pf.uri or None,
                "sha256": pf.sha256,
                "size_bytes": pf.size_bytes,
                "fingerprint": pf.fingerprint,
            }
            for pf in plate_rows
            if (pf.plate_id, pf.frame) in wanted
        ],
    }


def _jobs_select() -> Select[Any]:
    stmt = (
        select(*m.Job.__table__.c, *_SHOT_NAMES, m.Plate.pattern.label("plate"))
        .select_from(m.Job)
        .join(m.Plate, m.Plate.id == m.Job.plate_id)
    )
    return join_shot(stmt, m.Job.shot_id)


def _job_dict(row: Any) -> dict[str, Any]:
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


def _jobs_filtered(
    show: str | None,
    sequence: str | None,
    shot: str | None,
    status: str | None,
    job_id: int | None,
) -> Select[Any]:
    stmt = filter_shot(_jobs_select(), show, sequence, shot)
    if status is not None:
        stmt = stmt.where(m.Job.status == status)
    if job_id is not None:
        stmt = stmt.where(m.Job.id == job_id)
    return stmt


def count_jobs(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    status: str | None = None,
) -> int:
    """How many jobs ``jobs`` pages through with these filters."""
    return _count(bind, _jobs_filtered(show, sequence, shot, status, None))


def jobs(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    status: str | None = None,
    job_id: int | None = None,
    limit: int = 50,
    offset: int = 0,
    flicker_threshold: float = DEFAULT_FLICKER_THRESHOLD,
) -> list[dict[str, Any]]:
    """Jobs, newest first, each with its failed frames (``failed_frames``: frame, error) and
    the frames temporal QC flags in its outputs (``flagged_frames``, see `flagged_frames`)."""
    stmt = _jobs_filtered(show, sequence, shot, status, job_id)
    stmt = stmt.order_by(m.Job.created_at.desc(), m.Job.id.desc())
    with reading(bind) as conn:
        rows = conn.execute(_page(stmt, limit, offset)).all()
        failed = conn.execute(
            select(m.JobFrame.job_id, m.JobFrame.frame, m.JobFrame.error)
            .where(m.JobFrame.job_id.in_([r.id for r in rows]), m.JobFrame.status == "failed")
            .order_by(m.JobFrame.job_id, m.JobFrame.frame)
        ).all()
    by_job: dict[int, list[dict[str, Any]]] = {}
    for f in failed:
        by_job.setdefault(f.job_id, []).append({"frame": f.frame, "error": f.error})
    flagged = flagged_frames(bind, [r.id for r in rows], flicker_threshold) if rows else {}
    result = []
    for r in rows:
        job = _job_dict(r)
        job["failed_frames"] = by_job.get(job["id"], [])
        job["flagged_frames"] = flagged.get(job["id"], [])
        result.append(job)
    return result


def flagged_frames(
    bind: Bind, job_ids: list[int], threshold: float
) -> dict[int, list[dict[str, Any]]]:
    """Per job: the EXR outputs in its output folder whose flicker score is above
    ``threshold``, by pass and frame (one query for all the jobs). Keys: pass_name, frame,
    flicker. The folder, not the job id, picks them (a resubmit scores the frames an earlier
    job made too); a job without a recorded folder, by its own outputs. Folders and URIs are
    stored normalised (``normalise_uri``), so a plain prefix comparison holds."""
    job, out = m.Job, m.Output
    folder = job.output_root.concat("/")
    in_folder = func.substr(out.uri, 1, func.length(folder)) == folder
    mine = or_(
        and_(job.output_root.is_not(None), in_folder),
        and_(job.output_root.is_(None), out.job_id == job.id),  # recorded before folders were
    )
    stmt = (
        select(job.id.label("job_id"), out.pass_name, out.frame, out.flicker)
        .distinct()  # one row per part of the EXR
        .select_from(job)
        .join(out, out.shot_id == job.shot_id)
        .where(job.id.in_(job_ids), out.kind == "exr", out.flicker > threshold, mine)
        .order_by(job.id, out.pass_name, out.frame)
    )
    found: dict[int, list[dict[str, Any]]] = {}
    with reading(bind) as conn:
        for row in conn.execute(stmt):
            found.setdefault(row.job_id, []).append(
                {"pass_name": row.pass_name, "frame": row.frame, "flicker": row.flicker}
            )
    return found


def _newest_of_pass_frame() -> Any:
    """1 on the newest output of each (pass, frame) of a select over outputs."""
    return (
        func.row_number()
        .over(
            partition_by=(m.Output.pass_name, m.Output.frame),
            order_by=(m.Output.created_at.desc(), m.Output.id.desc()),
        )
        .label("newest")
    )


def flicker_scores(
    bind: Bind, show: str, sequence: str, shot: str, pass_name: str | None = None
) -> list[dict[str, Any]]:
    """The temporal QC score of each (pass, frame) of the shot (the newest scored EXR
    output), with the id of the frame's newest preview for a link (None without one).
    Keys: pass_name, frame, flicker, uri, preview_id, preview_uri; by pass and frame."""
    newest = _newest_of_pass_frame()
    cols = (m.Output.pass_name, m.Output.frame, m.Output.flicker, m.Output.uri, newest)
    scored = with_shot(select(*cols), m.Output.shot_id, show, sequence, shot).where(
        m.Output.kind == "exr", m.Output.flicker.is_not(None)
    )
    if pass_name is not None:
        scored = scored.where(m.Output.pass_name == pass_name)
    pcols = (m.Output.id, m.Output.pass_name, m.Output.frame, m.Output.uri, newest)
    previews = with_shot(select(*pcols), m.Output.shot_id, show, sequence, shot).where(
        m.Output.kind == "preview"
    )
    s_ = scored.subquery()
    p_ = previews.subquery()
    stmt = (
        select(
            s_.c.pass_name,
            s_.c.frame,
            s_.c.flicker,
            s_.c.uri,
            p_.c.id.label("preview_id"),
            p_.c.uri.label("preview_uri"),
        )
        .outerjoin(
            p_,
            (p_.c.pass_name == s_.c.pass_name) & (p_.c.frame == s_.c.frame) & (p_.c.newest == 1),
        )
        .where(s_.c.newest == 1)
        .order_by(s_.c.pass_name, s_.c.frame)
    )
    with reading(bind) as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def _made_from(plate_sha256: str | None, checkpoint_sha256: str | None) -> ColumnElement[bool]:
    if plate_sha256 is None and checkpoint_sha256 is None:
        raise ValueError("invalidated_by needs plate_sha256 or checkpoint_sha256 (or both)")
    conditions = []
    if plate_sha256 is not None:
        conditions.append(m.Output.plate_sha256 == plate_sha256)
    if checkpoint_sha256 is not None:
        made_with = (
            select(m.OutputCheckpoint.output_id)
            .join(m.Checkpoint, m.Checkpoint.id == m.OutputCheckpoint.checkpoint_id)
            .where(m.Checkpoint.sha256 == checkpoint_sha256)
        )
        conditions.append(m.Output.id.in_(made_with))
    return or_(*conditions)


def count_invalidated_by(
    bind: Bind, plate_sha256: str | None = None, checkpoint_sha256: str | None = None
) -> int:
    """How many outputs ``invalidated_by`` pages through."""
    stmt = select(m.Output.id).where(_made_from(plate_sha256, checkpoint_sha256))
    return _count(bind, stmt)


def invalidated_by(
    bind: Bind,
    plate_sha256: str | None = None,
    checkpoint_sha256: str | None = None,
    limit: int = 1000,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Outputs made from a plate frame with this checksum, or with this checkpoint (directly or
    as an input, e.g. seg for pose): what a re-pulled plate or a new checkpoint makes stale."""
    stmt = (
        _outputs_select()
        .where(_made_from(plate_sha256, checkpoint_sha256))
        .order_by(
            m.Show.name,
            m.Sequence.name,
            m.Shot.name,
            m.Output.pass_name,
            m.Output.frame,
            m.Output.id,
        )
    )
    with reading(bind) as conn:
        return [_output_dict(r) for r in conn.execute(_page(stmt, limit, offset))]


# -- what the web pages ask ----------------------------------------------------------------
def shot_plates(bind: Bind, show: str, sequence: str, shot: str) -> list[dict[str, Any]]:
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


def untrained_jobs(bind: Bind, job_ids: list[int]) -> set[int]:
    """The jobs among ``job_ids`` with an output that depends on a checkpoint recorded as
    untrained (random weights), directly or as an input (seg for pose)."""
    if not job_ids:
        return set()
    stmt = (
        select(m.Output.job_id)
        .distinct()
        .join(m.OutputCheckpoint, m.OutputCheckpoint.output_id == m.Output.id)
        .join(m.Checkpoint, m.Checkpoint.id == m.OutputCheckpoint.checkpoint_id)
        .where(m.Output.job_id.in_(job_ids), m.Checkpoint.trained == false())
    )
    with reading(bind) as conn:
        return set(conn.execute(stmt).scalars())


def job_provenance(bind: Bind, job_id: int) -> list[dict[str, Any]]:
    """The distinct provenance records (digest, data) of a job's outputs."""
    used = select(m.Output.provenance_id).where(m.Output.job_id == job_id)
    stmt = (
        select(m.Provenance.digest, m.Provenance.data)
        .where(m.Provenance.id.in_(used))
        .order_by(m.Provenance.id)
    )
    with reading(bind) as conn:
        return [{"digest": r.digest, "data": r.data} for r in conn.execute(stmt)]


def preview_outputs(
    bind: Bind, show: str, sequence: str, shot: str, frames_per_pass: int = 8
) -> list[dict[str, Any]]:
    """Preview images of the shot's first ``frames_per_pass`` frames of each pass (the newest
    preview of each frame), ordered by pass and frame. Keys: id, pass_name, frame, uri."""
    newest = _newest_of_pass_frame()
    previews = with_shot(
        select(m.Output.id, m.Output.pass_name, m.Output.frame, m.Output.uri, newest),
        m.Output.shot_id,
        show,
        sequence,
        shot,
    ).where(m.Output.kind == "preview")
    latest = previews.subquery()
    rank = func.dense_rank().over(partition_by=latest.c.pass_name, order_by=latest.c.frame)
    ranked = (
        select(latest.c.id, latest.c.pass_name, latest.c.frame, latest.c.uri, rank.label("rank"))
        .where(latest.c.newest == 1)
        .subquery()
    )
    stmt = (
        select(ranked.c.id, ranked.c.pass_name, ranked.c.frame, ranked.c.uri)
        .where(ranked.c["rank"] <= frames_per_pass)
        .order_by(ranked.c.pass_name, ranked.c.frame)
    )
    with reading(bind) as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def output_file(bind: Bind, output_id: int) -> dict[str, Any] | None:
    """An output's id, kind, URI and sha256 by its catalog id (None when unknown)."""
    stmt = select(m.Output.id, m.Output.kind, m.Output.uri, m.Output.sha256).where(
        m.Output.id == output_id
    )
    with reading(bind) as conn:
        row = conn.execute(stmt).one_or_none()
    return dict(row._mapping) if row is not None else None
