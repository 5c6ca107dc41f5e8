"""What a re-pulled plate frame or a new checkpoint makes stale: the outputs made from it."""

from __future__ import annotations

from sqlalchemy import ColumnElement, or_, select

from schemas.catalog import models as m
from schemas.catalog.queries.outputs import LIVE, output_rows
from schemas.catalog.queries.paging import Bind, Item, page


def _made_from(plate_sha256: str | None, checkpoint_sha256: str | None) -> ColumnElement[bool]:
    if plate_sha256 is None and checkpoint_sha256 is None:
        raise ValueError("invalidated_page needs plate_sha256 or checkpoint_sha256 (or both)")
    conditions = []
    if plate_sha256 is not None:
        conditions.append(m.Output.plate_sha256 == plate_sha256)
    if checkpoint_sha256 is not None:
        checkpoint = select(m.Checkpoint.id).where(m.Checkpoint.sha256 == checkpoint_sha256)
        made_with = select(m.OutputCheckpoint.output_id).where(
            m.OutputCheckpoint.output_id == m.Output.id,
            m.OutputCheckpoint.checkpoint_id.in_(checkpoint.scalar_subquery()),
        )
        conditions.append(made_with.exists())  # per output, in the order of the index below
    return or_(*conditions)


def invalidated_page(
    bind: Bind,
    plate_sha256: str | None = None,
    checkpoint_sha256: str | None = None,
    limit: int = 1000,
    offset: int = 0,
) -> tuple[list[Item], int]:
    """Outputs on disk made from a plate frame with this checksum, or with this checkpoint
    (directly or as an input, e.g. seg for pose), by shot (in the order the catalog first
    recorded them), pass and frame; and the total. The order is the outputs' own index's
    (shot id, pass, frame), so a page of a checkpoint's hundreds of thousands of outputs is
    read off the index rather than sorted whole."""
    keys = select(m.Output.id).select_from(m.Output)
    stmt = keys.where(_made_from(plate_sha256, checkpoint_sha256), LIVE).order_by(
        m.Output.shot_id, m.Output.pass_name, m.Output.frame, m.Output.id
    )
    return page(bind, stmt, output_rows, limit, offset)  # sorted on ids, read whole per page
