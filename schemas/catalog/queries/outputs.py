"""Outputs: pages of them by shot, pass and kind, a shot's previews, one output's file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, Select, func, select

from schemas.catalog import models as m
from schemas.catalog.queries.by_shot import (
    SHOT_NAMES,
    filter_shot,
    join_shot,
    where_given,
    with_shot,
)
from schemas.catalog.queries.paging import Bind, Item, Reader, iso, newest_page, reading

OUTPUT_COLUMNS = (
    m.Output.id,
    *SHOT_NAMES,
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
    m.Deletion.started_at.label("deleted_at"),
)

# An output whose file is on disk: no deletion removed it (its row stays for provenance).
LIVE = m.Output.deletion_id.is_(None)


def outputs_select() -> Select[Any]:
    """Every output with OUTPUT_COLUMNS (its shot's names, its checkpoint's sha256, when a
    deletion removed its file), deleted ones included: filter on ``LIVE`` for the others."""
    stmt = (
        select(*OUTPUT_COLUMNS)
        .select_from(m.Output)
        .outerjoin(m.Checkpoint, m.Checkpoint.id == m.Output.checkpoint_id)
        .outerjoin(m.Deletion, m.Deletion.id == m.Output.deletion_id)
    )
    return join_shot(stmt, m.Output.shot_id)


def output_dict(row: Row[Any]) -> Item:
    """A row of ``outputs_select`` as an output item."""
    out = dict(row._mapping)
    out.pop("provenance_id")
    out["part"] = out["part"] or None
    out["created_at"] = iso(out["created_at"])
    out["deleted_at"] = iso(out["deleted_at"])
    return out


def outputs_page(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    pass_name: str | None = None,
    kind: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[Item], int]:
    """Outputs on disk, newest first, of the named show/sequence/shot, pass and kind (None:
    any), and the total."""
    keys = select(m.Output.id).select_from(m.Output).where(LIVE)
    if (show, sequence, shot) != (None, None, None):
        keys = filter_shot(join_shot(keys, m.Output.shot_id), show, sequence, shot)
    keys = where_given(keys, (m.Output.pass_name, pass_name), (m.Output.kind, kind))
    return newest_page(bind, keys, m.Output.created_at, m.Output.id, output_rows, limit, offset)


def output_rows(conn: Reader, keys: Sequence[Row[Any]]) -> list[Item]:
    """The output items of a page found by id (``keys``' ``id``), in the page's order: the
    page is chosen, sorted and counted on the ids alone, and only its rows are read whole
    (sorting every wide row, joins and all, to keep one page of them made large pages slow)."""
    ids = [key.id for key in keys]
    if not ids:
        return []
    rows = conn.execute(outputs_select().where(m.Output.id.in_(ids))).all()
    found = {row.id: output_dict(row) for row in rows}
    return [found[output_id] for output_id in ids]


def newest_of_pass_frame(*within: Any) -> Any:
    """1 on the newest output of each (pass, frame) of a select over outputs (of each value
    of the columns ``within`` too: a version's folder, ...)."""
    return (
        func.row_number()
        .over(
            partition_by=(*within, m.Output.pass_name, m.Output.frame),
            order_by=(m.Output.created_at.desc(), m.Output.id.desc()),
        )
        .label("newest")
    )


def preview_outputs(
    bind: Bind, show: str, sequence: str, shot: str, frames_per_pass: int = 8
) -> list[Item]:
    """Preview images of the shot's first ``frames_per_pass`` frames of each pass (the newest
    preview of each frame), ordered by pass and frame. Keys: id, pass_name, frame, uri."""
    newest = newest_of_pass_frame()
    previews = with_shot(
        select(m.Output.id, m.Output.pass_name, m.Output.frame, m.Output.uri, newest),
        m.Output.shot_id,
        show,
        sequence,
        shot,
    ).where(m.Output.kind == "preview", LIVE)
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


def output_file(bind: Bind, output_id: int) -> Item | None:
    """An output's id, kind, URI and sha256 by its catalog id (None when unknown or its file
    was deleted)."""
    stmt = select(m.Output.id, m.Output.kind, m.Output.uri, m.Output.sha256).where(
        m.Output.id == output_id, LIVE
    )
    with reading(bind) as conn:
        row = conn.execute(stmt).one_or_none()
    return dict(row._mapping) if row is not None else None
