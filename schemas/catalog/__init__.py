"""The platform's catalog: shots, plates, jobs, outputs, checkpoints and provenance.

``open_catalog(url)`` gives the writer (``Catalog``); ``queries`` holds the read functions.
"""

from schemas.catalog.db import make_engine, migrate, open_catalog
from schemas.catalog.writer import Catalog

__all__ = ["Catalog", "make_engine", "migrate", "open_catalog"]
