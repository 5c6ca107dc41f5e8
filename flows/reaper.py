"""Jobs left ``running`` in the catalog by a flow that died (machine lost, process killed): a
job whose Prefect flow run has ended (crashed, failed, cancelled) is closed as ``partial`` when
some of its frames were recorded and ``failed`` otherwise, with the reason. Its unrecorded
frames have no checksum in the catalog, so the next scan or submission redoes exactly those.
Runs each scan, before anything is compared."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from schemas.catalog import queries
from schemas.catalog.catalog import Catalog

log = logging.getLogger("svfx.reaper")

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")


def flow_run_states(run_ids: list[str]) -> dict[str, str]:
    """flow-run id -> state type, for the runs Prefect knows."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    ids = []
    for run_id in run_ids:
        try:
            ids.append(UUID(run_id))
        except ValueError:
            continue  # not a Prefect run (an inline run id, a test's label)
    states: dict[str, str] = {}
    with get_client(sync_client=True) as client:
        for start in range(0, len(ids), 200):
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids[start : start + 200])),
                sort=FlowRunSort.ID_DESC,
                limit=200,
            )
            states.update({str(r.id): r.state.type.value for r in runs if r.state})
    return states


def reap_abandoned_jobs(catalog: Catalog) -> list[dict[str, Any]]:
    """Close the catalog's running jobs whose flow run has ended; returns what was closed."""
    running = {
        job["flow_run_id"]: job
        for job in queries.jobs(catalog.engine, status="running", limit=1000)
        if job["flow_run_id"]
    }
    if not running:
        return []
    reaped = []
    for run_id, state in flow_run_states(list(running)).items():
        if state not in ENDED:
            continue
        job = running[run_id]
        recorded = job["frames_done"] + job["frames_skipped"] + job["frames_failed"]
        status = "partial" if recorded else "failed"
        message = (
            f"flow run {run_id} ended {state} before the job finished: {recorded} of "
            f"{job['frames_total']} frames recorded; the rest are redone by the next scan "
            "or submission"
        )
        catalog.finish_job(job["id"], status, message)
        log.warning(
            "job %s (%s/%s/%s): %s", job["id"], job["show"], job["sequence"], job["shot"], message
        )
        reaped.append({"job_id": job["id"], "status": status, "message": message})
    return reaped
