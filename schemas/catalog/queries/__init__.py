"""Read-only questions to the catalog, answered as JSON-friendly lists of dicts.

Every function takes an Engine, Connection or Session first, then filters; filters travel as
bound parameters only. Timestamps are ISO 8601 strings in UTC. Lists that can grow long are
``*_page`` functions: they take ``limit`` and ``offset`` and return ``(items, total)``, the
total counted only when the page does not tell it (``paging.page``).
"""

from schemas.catalog.queries.by_shot import filter_shot, join_shot, with_shot
from schemas.catalog.queries.invalidation import invalidated_page
from schemas.catalog.queries.jobs import job, jobs_page, untrained_jobs
from schemas.catalog.queries.outputs import output_file, outputs_page, preview_outputs
from schemas.catalog.queries.paging import Bind, iso, page, reading
from schemas.catalog.queries.provenance import job_provenance, output_provenance
from schemas.catalog.queries.publishes import (
    job_frame_range,
    job_models,
    job_output_root,
    job_publishes,
    newest_job_of_version,
    pending_publishes,
    publishes_page,
)
from schemas.catalog.queries.qc import (
    DEFAULT_FLICKER_THRESHOLD,
    flagged_frames,
    flicker_scores,
    unscored,
)
from schemas.catalog.queries.shots import shot_exists, shot_plates, shots_page, show_names
from schemas.catalog.queries.usage import LEVELS, scope_exists, usage, version_files
from schemas.catalog.queries.versions import Version, shot_versions

__all__ = [
    "DEFAULT_FLICKER_THRESHOLD",
    "LEVELS",
    "Bind",
    "Version",
    "filter_shot",
    "flagged_frames",
    "flicker_scores",
    "invalidated_page",
    "iso",
    "job",
    "job_frame_range",
    "job_models",
    "job_output_root",
    "job_provenance",
    "job_publishes",
    "jobs_page",
    "join_shot",
    "newest_job_of_version",
    "output_file",
    "output_provenance",
    "outputs_page",
    "page",
    "pending_publishes",
    "preview_outputs",
    "publishes_page",
    "reading",
    "scope_exists",
    "shot_exists",
    "shot_plates",
    "shot_versions",
    "shots_page",
    "show_names",
    "unscored",
    "untrained_jobs",
    "usage",
    "version_files",
    "with_shot",
]
