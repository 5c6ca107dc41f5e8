"""Engines and migrations for the catalog (SQLite embedded, PostgreSQL in production).

SQLite gets WAL, a 30 s busy timeout and ``BEGIN IMMEDIATE`` for every write transaction
(SQLAlchemy's pysqlite recipe): writers queue on the lock up front instead of failing or losing
updates (stack-notes 6.3). Reads can ask for a deferred ``BEGIN`` with the execution option
``catalog_read=True`` so they never wait for a writer in WAL mode.

A SQLite catalog file is created on first use only: afterwards connections open it with
``mode=rw`` and every transaction first checks that the file is still the one opened (same
device and inode, not emptied), so a catalog deleted, replaced or wiped while a shot runs is
refused by name instead of being silently recreated empty. A file that is not a SQLite
database (truncated, overwritten) is refused by name too (``CatalogDamaged``).

Migrations run from code (no alembic.ini): ``migrate(engine)`` upgrades to head inside one
transaction; on PostgreSQL that transaction first takes an advisory lock, so concurrent
startups migrate one at a time. Alembic's version table is ``catalog_alembic_version`` so the
catalog can share a database with other Alembic users (Prefect's server).
"""

from __future__ import annotations

import sqlite3
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from core.errors import missing_extra
from schemas.catalog.errors import CatalogDamaged, CatalogError

if TYPE_CHECKING:
    from alembic.config import Config

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

    A SQLite file (and its parent directory) is created if missing; from then on the engine
    only opens that file. Extra keyword arguments go to create_engine.
    """
    parsed = parse_url(url)
    if parsed.get_backend_name() == "postgresql":
        if missing := missing_extra("psycopg", "postgres"):
            shown = parsed.render_as_string(hide_password=True)
            raise CatalogError(shown, f"a PostgreSQL catalog needs psycopg, and {missing}")
        return create_engine(parsed, pool_pre_ping=True, **kwargs)
    database = parsed.database or ""
    sqlite_file = None
    if database and database != ":memory:" and not database.startswith("file:"):
        sqlite_file = SqliteFile.create(Path(database).expanduser().resolve())
        parsed = parsed.set(database=f"file:{quote(str(sqlite_file.path))}").update_query_dict(
            {"mode": "rw", "uri": "true"}
        )
    engine = create_engine(parsed, connect_args={"timeout": 30}, **kwargs)
    _sqlite_pragmas_and_immediate_begin(engine, sqlite_file)
    if sqlite_file is not None:
        _SQLITE_FILES[engine] = sqlite_file
    return engine


_SQLITE_FILES: weakref.WeakKeyDictionary[Engine, SqliteFile] = weakref.WeakKeyDictionary()


class SqliteFile:
    """The catalog's SQLite file as first opened (device, inode): a transaction on a file
    that was since deleted, replaced or emptied is refused."""

    def __init__(self, path: Path) -> None:
        self.path = path
        info = path.stat()
        self.identity = (info.st_dev, info.st_ino)

    @classmethod
    def create(cls, path: Path) -> SqliteFile:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            sqlite3.connect(path).close()  # an empty database file: migrations fill it
        return cls(path)

    def check(self) -> None:
        try:
            info = self.path.stat()
        except FileNotFoundError:
            raise CatalogDamaged(
                str(self.path),
                "the file was deleted while in use; refusing to start an empty catalog "
                "mid-job (restore it from a backup, or run again to start a new one)",
            ) from None
        if (info.st_dev, info.st_ino) != self.identity:
            raise CatalogDamaged(
                str(self.path), "the file was replaced by another while in use; run again"
            )
        if info.st_size == 0:
            raise CatalogDamaged(str(self.path), "the file was emptied while in use")


def _sqlite_pragmas_and_immediate_begin(engine: Engine, sqlite_file: SqliteFile | None) -> None:
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
        if sqlite_file is not None:
            sqlite_file.check()
        read_only = connection.get_execution_options().get(READ_OPTION, False)
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def describe(engine: Engine) -> str:
    """The catalog as a user knows it: the SQLite file, or the URL without its password."""
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database:
        return unquote(url.database.removeprefix("file:"))
    return url.render_as_string(hide_password=True)


def alembic_config() -> Config:
    """Alembic's configuration, built in code from the migrations shipped in this package.
    Alembic is imported only here and in `migrate`: it costs a third of a second, and most
    commands (a catalog query, `svfx --help`) never migrate."""
    from alembic.config import Config

    cfg = Config()
    # ConfigParser interpolates '%': escape it in the path.
    cfg.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    cfg.attributes["version_table"] = VERSION_TABLE
    return cfg


def head_revision() -> str:
    """The newest migration's revision: migrations are files ``NNNN_<what>.py`` whose revision
    is their number (tests/test_catalog.py holds every file to it)."""
    return max(p.name.split("_", 1)[0] for p in (MIGRATIONS / "versions").glob("[0-9]*_*.py"))


def at_head(engine: Engine) -> bool:
    """Whether the catalog's schema is already the newest, read without Alembic (importing
    and running it costs most of a quick command's time); False when the version table is
    missing or unreadable, which `migrate` then deals with."""
    try:
        with engine.connect() as connection:
            found = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    except DBAPIError:
        return False
    return [row[0] for row in found] == [head_revision()]


def migrate(engine: Engine) -> None:
    """Upgrade the catalog schema to the newest revision (a no-op when already there)."""
    if at_head(engine):
        return
    from alembic import command

    cfg = alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")


_CLOSED: weakref.WeakSet[Engine] = weakref.WeakSet()


def close_engine(engine: Engine) -> None:
    """Release ``engine``'s connections for good: ``still_usable`` says False from then on."""
    _CLOSED.add(engine)
    engine.dispose()


def still_usable(engine: Engine) -> bool:
    """Whether ``engine`` may be handed out again: not closed, and its SQLite file (if it has
    one) still the file it opened (not deleted, replaced or emptied since)."""
    if engine in _CLOSED:
        return False
    sqlite_file = _SQLITE_FILES.get(engine)
    try:
        if sqlite_file is not None:
            sqlite_file.check()
    except CatalogDamaged:
        return False
    return True
