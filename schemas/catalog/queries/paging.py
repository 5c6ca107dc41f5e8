"""How every read runs: a read connection (``reading``), ISO timestamps (``iso``) and pages
with the total behind them (``page``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Row, Select, func, select
from sqlalchemy.orm import Session

from schemas.catalog.engine import READ_OPTION

Bind = Engine | Connection | Session
Reader = Connection | Session
Item = dict[str, Any]
# A page's rows as items; reads more (per page, not per row) on the same connection if needed.
ToItems = Callable[[Reader, Sequence[Row[Any]]], list[Item]]


@contextmanager
def reading(bind: Bind) -> Iterator[Reader]:
    """A connection for reads; an Engine's gets a deferred BEGIN on SQLite (see engine.py)."""
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            connection.execution_options(**{READ_OPTION: True})
            yield connection
    else:
        yield bind


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def each_row(to_item: Callable[[Row[Any]], Item]) -> ToItems:
    """ToItems for a page that needs nothing but its own rows."""
    return lambda _conn, rows: [to_item(row) for row in rows]


def newest_page(
    bind: Bind, stmt: Select[Any], stamp: Any, key: Any, to_items: ToItems, limit: int, offset: int
) -> tuple[list[Item], int]:
    """A `page` of ``stmt`` newest first: by ``stamp``, then ``key`` (the id), descending."""
    return page(bind, stmt.order_by(stamp.desc(), key.desc()), to_items, limit, offset)


def page(
    bind: Bind, stmt: Select[Any], to_items: ToItems, limit: int, offset: int
) -> tuple[list[Item], int]:
    """The ``limit`` rows of ``stmt`` after ``offset`` as items, and how many rows ``stmt``
    selects in all. A short first page is the whole list: no COUNT is run for it."""
    if limit < 0 or offset < 0:
        raise ValueError(f"limit and offset must not be negative (got {limit}, {offset})")
    with reading(bind) as conn:
        rows = conn.execute(stmt.limit(limit).offset(offset)).all()
        items = to_items(conn, rows)
        if offset == 0 and len(rows) < limit:
            return items, len(rows)
        counted = select(func.count()).select_from(stmt.order_by(None).subquery())
        return items, int(conn.execute(counted).scalar_one())
