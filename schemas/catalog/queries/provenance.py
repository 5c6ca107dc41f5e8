"""How outputs were made: everything known about the file at a path, a job's provenance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, select

from schemas.catalog import models as m
from schemas.catalog.queries.jobs import job_dict, jobs_select
from schemas.catalog.queries.outputs import output_dict, outputs_select
from schemas.catalog.queries.paging import Bind, Item, Reader, iso, reading
from schemas.catalog.uris import normalise_uri

_CHECKPOINT_COLUMNS = (
    m.Checkpoint.sha256,
    m.Checkpoint.arch,
    m.Checkpoint.task,
    m.Checkpoint.family,
    m.Checkpoint.path,
    m.Checkpoint.trained,
    m.Checkpoint.size_bytes,
    m.Checkpoint.created_at,
)


def output_provenance(bind: Bind, path: str, frame: int | None = None) -> Item | None:
    """Everything known about how the file at ``path`` was made, or None if the catalog does
    not know the file (a plain miss is an answer, not an error).

    ``path`` may be relative, absolute or ``file://``; it is normalised as the writer
    normalised it. ``frame`` narrows a Zarr array (one URI for all frames) to one frame.
    Keys: ``uri``, ``outputs`` (one per pass/part/frame, each with the sha256s of the
    checkpoints it depends on, its provenance digest and ``made_from``, the outputs a
    stabilised output was fused from), ``checkpoints``, ``provenance``,
    ``jobs`` and ``plate_frames`` (lists: usually one entry each).
    """
    uri = normalise_uri(path)
    stmt = outputs_select().where(m.Output.uri == uri)
    if frame is not None:
        stmt = stmt.where(m.Output.frame == frame)
    stmt = stmt.order_by(m.Output.frame, m.Output.pass_name, m.Output.part)
    with reading(bind) as conn:
        rows = conn.execute(stmt).all()
        if not rows:
            return None
        output_ids = [r.id for r in rows]
        checkpoints, by_output = _checkpoints(conn, output_ids)
        provenance = conn.execute(
            select(m.Provenance.id, m.Provenance.digest, m.Provenance.data)
            .where(m.Provenance.id.in_({r.provenance_id for r in rows}))
            .order_by(m.Provenance.id)
        ).all()
        sources = _sources(conn, output_ids)
        job_rows = conn.execute(jobs_select().where(m.Job.id.in_({r.job_id for r in rows}))).all()
        plate_frames = _plate_frames(conn, rows, job_rows)
    digests = {p.id: p.digest for p in provenance}
    outputs = []
    for r in rows:
        out = output_dict(r)
        out["checkpoints"] = by_output.get(r.id, [])
        out["made_from"] = sources.get(r.id, [])  # outputs it was fused from (stabilised)
        out["provenance_digest"] = digests[r.provenance_id]
        outputs.append(out)
    return {
        "uri": uri,
        "outputs": outputs,
        "checkpoints": checkpoints,
        "provenance": [{"digest": p.digest, "data": p.data} for p in provenance],
        "jobs": [job_dict(j) for j in job_rows],
        "plate_frames": plate_frames,
    }


def _checkpoints(conn: Reader, output_ids: list[int]) -> tuple[list[Item], dict[int, list[str]]]:
    """The checkpoints the outputs depend on (each once, by sha256) and, per output id, the
    sha256s of its checkpoints."""
    deps = conn.execute(
        select(m.OutputCheckpoint.output_id, *_CHECKPOINT_COLUMNS)
        .join(m.Checkpoint, m.Checkpoint.id == m.OutputCheckpoint.checkpoint_id)
        .where(m.OutputCheckpoint.output_id.in_(output_ids))
        .order_by(m.Checkpoint.sha256)
    ).all()
    checkpoints: dict[str, Item] = {}
    by_output: dict[int, list[str]] = {}
    for dep in deps:
        ckpt = dict(dep._mapping)
        ckpt["created_at"] = iso(ckpt["created_at"])
        output_id = ckpt.pop("output_id")
        checkpoints[ckpt["sha256"]] = ckpt
        by_output.setdefault(output_id, []).append(ckpt["sha256"])
    return list(checkpoints.values()), by_output


def _sources(conn: Reader, output_ids: list[int]) -> dict[int, list[Item]]:
    """Per output id, the outputs it was fused from (a stabilised output's per-frame ones)."""
    made_from = conn.execute(
        select(
            m.OutputSource.output_id,
            m.Output.id,
            m.Output.uri,
            m.Output.frame,
            m.Output.pass_name,
            m.Output.kind,
            m.Output.sha256,
            m.Deletion.started_at.label("deleted_at"),
        )
        .join(m.Output, m.Output.id == m.OutputSource.source_output_id)
        .outerjoin(m.Deletion, m.Deletion.id == m.Output.deletion_id)
        .where(m.OutputSource.output_id.in_(output_ids))
        .order_by(m.Output.frame, m.Output.kind, m.Output.uri)
    ).all()
    sources: dict[int, list[Item]] = {}
    for src in made_from:
        sources.setdefault(src.output_id, []).append(
            {
                "id": src.id,
                "uri": src.uri,
                "frame": src.frame,
                "pass_name": src.pass_name,
                "kind": src.kind,
                "sha256": src.sha256,
                "deleted_at": iso(src.deleted_at),  # None while its file is on disk
            }
        )
    return sources


def _plate_frames(
    conn: Reader, rows: Sequence[Row[Any]], job_rows: Sequence[Row[Any]]
) -> list[Item]:
    """The plate frames the outputs were made from: each output's frame of its job's plate."""
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
    return [
        {
            "frame": pf.frame,
            "uri": pf.uri or None,
            "sha256": pf.sha256,
            "size_bytes": pf.size_bytes,
            "fingerprint": pf.fingerprint,
        }
        for pf in plate_rows
        if (pf.plate_id, pf.frame) in wanted
    ]


def job_provenance(bind: Bind, job_id: int) -> list[Item]:
    """The distinct provenance records (digest, data) of a job's outputs."""
    used = select(m.Output.provenance_id).where(m.Output.job_id == job_id)
    stmt = (
        select(m.Provenance.digest, m.Provenance.data)
        .where(m.Provenance.id.in_(used))
        .order_by(m.Provenance.id)
    )
    with reading(bind) as conn:
        return [{"digest": r.digest, "data": r.data} for r in conn.execute(stmt)]
