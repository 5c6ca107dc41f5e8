"""What a re-pulled plate frame or a new checkpoint makes stale: the outputs made from it."""

from __future__ import annotations

from sqlalchemy import ColumnElement, or_, select

from schemas.catalog import models as m
from schemas.catalog.queries.by_shot import join_shot
from schemas.catalog.queries.outputs import LIVE, output_rows
from schemas.catalog.queries.paging import Bind, Item, page


def _made_from(plate_sha256: str | None, checkpoint_sha256: str | None) -> ColumnElement[bool]:
    if plate_sha256 is None and checkpoint_sha256 is None:
        raise ValueError("invalidated_page needs plate_sha256 or checkpoint_sha256 (or both)")
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


def invalidated_page(
    bind: Bind,
    plate_sha256: str | None = None,
    checkpoint_sha256: str | None = None,
    limit: int = 1000,
    offset: int = 0,
) -> tuple[list[Item], int]:
    """Outputs on disk made from a plate frame with this checksum, or with this checkpoint
    (directly or as an input, e.g. seg for pose), by shot, pass and frame; and the total."""
    keys = select(m.Output.id).select_from(m.Output)
    stmt = (
        join_shot(keys, m.Output.shot_id)
        .where(_made_from(plate_sha256, checkpoint_sha256), LIVE)
        .order_by(
            m.Show.name,
            m.Sequence.name,
            m.Shot.name,
            m.Output.pass_name,
            m.Output.frame,
            m.Output.id,
        )
    )
    return page(bind, stmt, output_rows, limit, offset)  # sorted on ids, read whole per page
