"""``open_catalog``: the process's one Catalog per URL, its schema migrated on first use."""

from __future__ import annotations

import os
import threading
from dataclasses import replace

from sqlalchemy import Engine
from sqlalchemy.exc import DatabaseError, OperationalError

from schemas.catalog.engine import describe, make_engine, migrate, parse_url, still_usable
from schemas.catalog.errors import CatalogDamaged
from schemas.catalog.writer import Catalog

_CATALOGS: dict[tuple[int, str], Catalog] = {}
_CATALOGS_LOCK = threading.Lock()


def open_catalog(url: str, *, retry_s: float | None = None) -> Catalog:
    """The process's Catalog for ``url``: engine made and schema migrated on first use only.

    Keyed by process id too, so a forked child makes its own engine (pooled connections must
    not cross a fork). A cached catalog that was closed, or whose SQLite file was since
    deleted or replaced, is opened afresh (a new run starts a new catalog; a run in progress
    keeps refusing). Raises CatalogDamaged for a file that is not a SQLite database
    (truncated, overwritten). ``retry_s`` bounds how long each write waits for the database
    (a restart, a lock).
    """
    key = (os.getpid(), parse_url(url).render_as_string(hide_password=False))
    with _CATALOGS_LOCK:
        catalog = _CATALOGS.get(key)
        if catalog is not None and not still_usable(catalog.engine):
            del _CATALOGS[key]
            catalog.engine.dispose()
            catalog = None
        if catalog is None:
            catalog = _CATALOGS[key] = Catalog(_migrated_engine(url))
    if retry_s is not None:
        return catalog.with_retry(replace(catalog.retry, deadline_s=retry_s))
    return catalog


def _migrated_engine(url: str) -> Engine:
    engine = make_engine(url)
    try:
        migrate(engine)
    except OperationalError:
        engine.dispose()
        raise
    except DatabaseError as exc:  # "file is not a database", "malformed"
        engine.dispose()
        reason = str(getattr(exc, "orig", None) or exc)
        raise CatalogDamaged(
            describe(engine),
            f"not a readable catalog ({reason}); restore it from a backup or move it aside "
            "to start a new one",
        ) from None
    return engine
