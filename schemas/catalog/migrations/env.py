"""Alembic environment for the catalog. Run through ``schemas.catalog.engine.migrate``, which
hands over an open connection in ``config.attributes["connection"]``; a ``sqlalchemy.url`` main
option works too (for ``alembic`` on the command line with a hand-made config)."""

from __future__ import annotations

from typing import Any

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy.engine import Connection

from schemas.catalog.engine import VERSION_TABLE, make_engine
from schemas.catalog.models import Base, UTCDateTime

config = context.config
target_metadata = Base.metadata
version_table = config.attributes.get("version_table", VERSION_TABLE)


def _render_item(kind: str, item: Any, autogen_context: AutogenContext) -> str | bool:
    """Revisions must not import models: UTCDateTime only converts in Python, so the column
    is a plain timezone-aware DateTime."""
    if kind == "type" and isinstance(item, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=version_table,
        # SQLite cannot ALTER most things: batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        version_table=version_table,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError(
            "no database to migrate: pass a connection in config.attributes['connection'] "
            "or set sqlalchemy.url"
        )
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
