"""Engines and migrations for the catalog (SQLite embedded, PostgreSQL in production).

SQLite gets WAL, a 30 s busy timeout and ``BEGIN IMMEDIATE`` for every write transaction
(SQLAlchemy's pysqlite recipe): writers queue on the lock up front instead of failing or losing
updates (stack-notes 6.3). Reads can ask for a deferred ``BEGIN`` with the execution option
``catalog_read=True`` so they never wait for a writer in WAL mode.

Migrations run from code (no alembic.ini): ``migrate(engine)`` upgrades to head inside one
transaction; on PostgreSQL that transaction first takes an advisory lock, so concurrent
startups migrate one at a time. Alembic's version table is ``catalog_alembic_version`` so the
catalog can share a database with other Alembic users (Prefect's server).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

if TYPE_CHECKING:
    from schemas.catalog.catalog import Catalog

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "catalog_alembic_version"
# Key of the PostgreSQL advisory lock held while migrating ("svfxcat" as a 63-bit integer).
MIGRATION_LOCK_KEY = int.from_bytes(b"svfxcat", "big")
READ_OPTION = "catalog_read"
_HINT = "use sqlite:///path/to/catalog.db or postgresql+psycopg://user@host:5432/dbname"


def parse_url(url: str) -> URL:
    """The catalog URL with PostgreSQL pinned to psycopg 3; ValueError for anything else."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"catalog URL {url!r} is not a database URL; {_HINT}") from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend in ("postgresql", "postgres") and driver in ("", "psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and driver in ("", "pysqlite"):
        return parsed
    shown = parsed.render_as_string(hide_password=True)
    raise ValueError(f"unsupported catalog URL {shown!r}; {_HINT}")


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for the catalog at ``url``, tuned for its dialect (see the module docstring).

    A SQLite file's parent directory is created. Extra keyword arguments go to create_engine.
    """
    parsed = parse_url(url)
    if parsed.get_backend_name() == "postgresql":
        return create_engine(parsed, pool_pre_ping=True, **kwargs)
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"timeout": 30}, **kwargs)
    _sqlite_pragmas_and_immediate_begin(engine)
    return engine


def _sqlite_pragmas_and_immediate_begin(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite must not emit BEGIN itself; the "begin" hook below does it.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        read_only = connection.get_execution_options().get(READ_OPTION, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def alembic_config() -> Config:
    """Alembic's configuration, built in code from the migrations shipped in this package."""
    cfg = Config()
    # ConfigParser interpolates '%': escape it in the path.
    cfg.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    cfg.attributes["version_table"] = VERSION_TABLE
    return cfg


def migrate(engine: Engine) -> None:
    """Upgrade the catalog schema to the newest revision (a no-op when already there)."""
    cfg = alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")


_CATALOGS: dict[tuple[int, str], Catalog] = {}
_CATALOGS_LOCK = threading.Lock()


def open_catalog(url: str) -> Catalog:
    """The process's Catalog for ``url``: engine made and schema migrated on first use only.

    Keyed by process id too, so a forked child makes its own engine (pooled connections must
    not cross a fork).
    """
    from schemas.catalog.catalog import Catalog

    key = (os.getpid(), parse_url(url).render_as_string(hide_password=False))
    with _CATALOGS_LOCK:
        catalog = _CATALOGS.get(key)
        if catalog is None:
            engine = make_engine(url)
            migrate(engine)
            catalog = _CATALOGS[key] = Catalog(engine)
        return catalog
