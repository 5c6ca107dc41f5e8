"""A job already running on a shot's outputs, as a new submission finds it: whether its
process is alive (its lease, `schemas.catalog.lease`), whether it runs the same work, and
following it to its end instead of computing every frame twice (`svfx submit`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from schemas.catalog import Catalog
from schemas.catalog.lease import owner_alive
from schemas.catalog.models import utcnow

# spec fields that do not change the work: who asked for it
NOT_WORK = ("submitter",)


def live_job(catalog: Catalog, output_root: str) -> dict[str, Any] | None:
    """A running job on ``output_root`` whose process is alive."""
    now = utcnow()
    for job in catalog.running_jobs(output_root):
        if job["owner"] and owner_alive(job["owner"], job["heartbeat_at"], now):
            return job
    return None


def same_work(theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    """Two specs (as JSON) that make the same outputs from the same inputs."""
    return {k: v for k, v in theirs.items() if k not in NOT_WORK} == {
        k: v for k, v in ours.items() if k not in NOT_WORK
    }


def follow_job(
    catalog: Catalog,
    job_id: int,
    output_root: str,
    on_update: Callable[[dict[str, Any]], None],
    poll_s: float = 1.0,
) -> dict[str, Any]:
    """Poll the job, passing each reading to ``on_update``, until it ends or its process dies;
    returns the last reading (still 'running' when its process is gone)."""
    while True:
        job = catalog.job(job_id)
        on_update(job)
        if job["status"] != "running":
            return job
        rows = [r for r in catalog.running_jobs(output_root) if r["id"] == job_id]
        owner = rows[0]["owner"] if rows else None
        if owner and not owner_alive(owner, rows[0]["heartbeat_at"], utcnow()):
            return job
        time.sleep(poll_s)
