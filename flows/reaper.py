"""Jobs left ``running`` in the catalog by a flow that died (machine lost, process killed),
closed as ``partial`` when some of their frames were recorded and ``failed`` otherwise, with
the reason, at the start of each scan:

- a job whose owner process is gone (its lease: `schemas.catalog.lease`) is closed, and its
  Prefect flow run, which nobody will ever finish, is set to Crashed, so the scan no longer
  counts its plate as in flight;
- a job whose Prefect flow run has ended (crashed, failed, cancelled) is closed.

Their unrecorded frames are redone (or, when on disk with their frame records, recorded) by
the next scan or submission."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from schemas.catalog import queries
from schemas.catalog.writer import Catalog

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
    """Close the catalog's running jobs whose process is gone or whose flow run has ended;
    returns what was closed."""
    reaped = _reap_expired_leases(catalog)
    running = {
        job["flow_run_id"]: job
        for job in queries.jobs_page(catalog.engine, status="running", limit=1000)[0]
        if job["flow_run_id"]
    }
    if not running:
        return reaped
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


def _reap_expired_leases(catalog: Catalog) -> list[dict[str, Any]]:
    from schemas.catalog.lease import owner_alive
    from schemas.catalog.models import utcnow

    now = utcnow()
    reaped = []
    for job in catalog.running_jobs():
        if not job["owner"] or owner_alive(job["owner"], job["heartbeat_at"], now):
            continue
        recorded = job["frames_done"] + job["frames_skipped"] + job["frames_failed"]
        status = "partial" if recorded else "failed"
        beat = job["heartbeat_at"].isoformat() if job["heartbeat_at"] else "never"
        message = (
            f"its process ({job['owner']}) ended without finishing, last heard of {beat}: "
            f"{recorded} of {job['frames_total']} frames recorded; the rest are redone by the "
            "next scan or submission"
        )
        catalog.finish_job(job["id"], status, message)
        if job["flow_run_id"]:
            _mark_crashed(job["flow_run_id"], message)
        log.warning("job %s: %s", job["id"], message)
        reaped.append({"job_id": job["id"], "status": status, "message": message})
    return reaped


def _mark_crashed(run_id: str, message: str) -> None:
    """Tell Prefect a run whose process is gone has crashed (nothing else will)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    try:
        run = UUID(run_id)
    except ValueError:
        return  # not a Prefect run
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run).state
            if state is not None and state.type.value in ("RUNNING", "PENDING", "SCHEDULED"):
                client.set_flow_run_state(run, Crashed(message=message), force=True)
    except Exception as exc:  # Prefect away: the run stays 'running' there, the job is closed
        log.warning("could not mark flow run %s crashed: %s", run_id, exc)
