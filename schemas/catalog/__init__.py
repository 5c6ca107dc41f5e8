"""The platform's catalog: shots, plates, jobs, outputs, checkpoints and provenance.

``open_catalog(url)`` gives the writer (``Catalog``); ``queries`` holds the read functions.
Layers, bottom up: ``engine`` (engines, migrations), ``models``, ``errors``, ``uris`` and
``lease``; the read ``queries``; the writer (``writer``, assembled from ``transactions``,
``upserts``, ``job_lifecycle``, ``chunk_recording``, ``qc_recording`` and ``planner_reads``);
``opening`` (``open_catalog``). No module imports one above it.
"""

from schemas.catalog.engine import make_engine, migrate
from schemas.catalog.opening import open_catalog
from schemas.catalog.writer import Catalog

__all__ = ["Catalog", "make_engine", "migrate", "open_catalog"]
