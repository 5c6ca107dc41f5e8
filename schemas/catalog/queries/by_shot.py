"""Rows of a shot by its names: join show, sequence and shot to a select and filter on them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select

from schemas.catalog import models as m

SHOT_NAMES = (
    m.Show.name.label("show"),
    m.Sequence.name.label("sequence"),
    m.Shot.name.label("shot"),
)


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
    return where_given(stmt, (m.Show.name, show), (m.Sequence.name, sequence), (m.Shot.name, shot))


def where_given(stmt: Select[Any], *equal: tuple[Any, Any]) -> Select[Any]:
    """Keep rows whose column equals the value beside it, for each value given (None: any)."""
    for column, value in equal:
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
