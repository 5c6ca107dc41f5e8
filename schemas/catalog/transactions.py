"""How the catalog's writer talks to its database: every write is one transaction
(``BEGIN IMMEDIATE`` on SQLite), and a transaction that fails on a transient database error (a
PostgreSQL restart, a dropped connection, SQLite busy) is simply run again, with backoff,
within a bounded time (``CATALOG_RETRY``); then ``CatalogUnavailable`` names the catalog. This
is safe because every write of the writer is idempotent (``schemas.catalog.writer``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import (
    DatabaseError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from schemas.catalog.engine import close_engine, describe
from schemas.catalog.errors import CatalogDamaged, CatalogUnavailable
from schemas.catalog.queries.paging import reading
from storage.retry import RetriesExhausted, RetryPolicy, with_retries

# Long enough for a database server to restart or fail over, short enough that a database
# that is really gone is reported while the user still watches.
CATALOG_RETRY = RetryPolicy(attempts=10_000, first_wait_s=0.25, max_wait_s=5.0, deadline_s=120.0)
# PostgreSQL error classes worth another try: connection exceptions, the server shutting
# down or starting up, too many connections, serialization failures and deadlocks.
_TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53", "40001", "40P01")
T = TypeVar("T")


class _GaveUp(RetriesExhausted):
    pass


def is_transient(exc: BaseException) -> bool:
    """Whether a database error may pass if the transaction is simply run again."""
    if isinstance(exc, DisconnectionError | PoolTimeout):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if type(orig).__module__.startswith("psycopg"):
        if sqlstate is None:  # no server answer at all: refused, reset, timed out
            return isinstance(exc, OperationalError)
        return str(sqlstate).startswith(_TRANSIENT_SQLSTATES)
    text = str(orig).lower()
    return isinstance(exc, OperationalError) and ("locked" in text or "busy" in text)


class CatalogTransactions:
    """One engine, and the retried transactions every part of the writer runs its work in."""

    def __init__(self, engine: Engine, retry: RetryPolicy = CATALOG_RETRY) -> None:
        self.engine = engine
        self.retry = retry
        self.where = describe(engine)

    def close(self) -> None:
        """Release the engine's connections; `open_catalog` then opens the catalog afresh."""
        close_engine(self.engine)

    def _write(self, work: Callable[[Connection], T], what: str) -> T:
        """``work`` in one write transaction, run again on transient errors (see above)."""

        def attempt() -> T:
            with self.engine.begin() as connection:
                return work(connection)

        return self._retrying(attempt, what)

    def _read(self, work: Callable[[Connection], T], what: str) -> T:
        def attempt() -> T:
            with reading(self.engine) as connection:
                return work(cast(Connection, connection))

        return self._retrying(attempt, what)

    def _retrying(self, attempt: Callable[[], T], what: str) -> T:
        try:
            return cast(
                T,
                with_retries(attempt, what, self.retry, error=_GaveUp, retryable=is_transient),
            )
        except _GaveUp as exc:
            raise CatalogUnavailable(
                self.where,
                f"unreachable: {exc} (frames written meanwhile are on disk, with "
                "their frame records, and are recorded by the next run)",
            ) from None
        except OperationalError as exc:
            reason = str(exc.orig)
            if "no such table" in reason or "no such column" in reason:
                raise CatalogDamaged(
                    self.where, f"its tables are gone ({reason}); it was wiped or replaced"
                ) from None
            raise
        except DatabaseError as exc:
            if self.engine.dialect.name != "sqlite" or isinstance(exc, IntegrityError):
                raise
            raise CatalogDamaged(  # "file is not a database", "disk image is malformed"
                self.where, f"the file is damaged ({exc.orig}); restore it from a backup"
            ) from None
