"""Handing shots to whatever runs them, for the bucket scan and the catalog API.

``DeploymentSubmitter`` creates flow runs of the served ``process-shot`` deployment (``svfx
serve`` or a work pool runs them) and asks Prefect which runs are still in flight, so a scan
never submits the same plate twice while a run for it is pending or running.
``InlineSubmitter`` runs ``process_shot`` in this process, one shot after another (``svfx
scan`` by hand, with no server). Both take a validated ``ShotSpec``. ``run_shot_here`` runs
one shot in this process against a Prefect API it makes sure of (``svfx submit``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from core.errors import SvfxError
from schemas.catalog.uris import normalise_uri
from schemas.settings import Settings
from schemas.spec import ShotSpec

from .orchestrator import prefect_api
from .progress import Listener, listening

log = logging.getLogger("svfx.submit")

PROCESS_SHOT_DEPLOYMENT = "process-shot/process-shot"
# Prefect state types of a run that has not finished yet (it holds its plate).
IN_FLIGHT_STATES = ("SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING")


class Submitter(Protocol):
    def in_flight(self) -> dict[str, str]:
        """Normalised plate pattern -> run id, for every run not yet finished."""
        ...

    def submit(self, spec: ShotSpec, *, reason: str) -> str:
        """Start (or queue) one run of ``process_shot``; returns its run id."""
        ...


def plate_key(pattern: str) -> str:
    """How a plate is named across scans, catalog rows and flow-run parameters."""
    return normalise_uri(pattern)


def run_tags(spec: ShotSpec) -> list[str]:
    return ["svfx", f"show:{spec.show}", f"shot:{spec.shot_path}"]


def runs_in_flight(
    flow_name: str = "process-shot", stale_after_s: float = 24 * 3600
) -> dict[str, str]:
    """Normalised plate pattern -> flow-run id for every run of ``flow_name`` that has not
    finished, under the Prefect API in effect (a server, or the local ephemeral database that
    every process on this host shares). A run still ``RUNNING`` after ``stale_after_s`` is
    taken for one whose process died without telling Prefect, and is logged, not counted."""
    from datetime import UTC, datetime

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    running: dict[str, str] = {}
    states = FlowRunFilterStateType(any_=[StateType(s) for s in IN_FLIGHT_STATES])
    now = datetime.now(UTC)
    with get_client(sync_client=True) as client:
        offset = 0
        while True:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=states)),
                sort=FlowRunSort.ID_DESC,  # the sync client sends no default
                limit=200,
                offset=offset,
            )
            for run in runs:
                plate = ((run.parameters or {}).get("spec") or {}).get("plate")
                started = run.start_time
                if started and (now - started).total_seconds() > stale_after_s:
                    log.warning(
                        "flow run %s for %s has been running since %s: taken for dead",
                        run.id,
                        plate,
                        started,
                    )
                    continue
                if plate:
                    running[plate_key(str(plate))] = str(run.id)
            if len(runs) < 200:
                return running
            offset += len(runs)


class DeploymentSubmitter:
    """Flow runs of a served deployment, through the Prefect API in effect."""

    def __init__(self, deployment: str = PROCESS_SHOT_DEPLOYMENT) -> None:
        self.deployment = deployment

    def in_flight(self) -> dict[str, str]:
        return runs_in_flight(self.deployment.partition("/")[0])

    def submit(self, spec: ShotSpec, *, reason: str) -> str:
        from prefect.deployments import run_deployment

        run = run_deployment(
            self.deployment,
            parameters={"spec": spec.model_dump(mode="json")},
            timeout=0,  # queue it; the served deployment or work pool runs it
            tags=run_tags(spec),
            flow_run_name=f"{spec.shot_path} ({reason})",
            as_subflow=False,  # a scan's submissions outlive the scan
        )
        return str(run.id)


class InlineSubmitter:
    """Runs each shot to the end before returning (no server, no work pool)."""

    def __init__(
        self,
        dask_address: str | None = None,
        run: Callable[[dict[str, Any], str | None], dict[str, Any]] | None = None,
    ) -> None:
        """``run(spec, dask_address)`` runs one shot (default: the ``process_shot`` flow;
        ``svfx scan`` passes the one with a progress bar)."""
        self.dask_address = dask_address
        self.run = run
        self.results: list[dict[str, Any]] = []

    def in_flight(self) -> dict[str, str]:
        return runs_in_flight()  # other processes' runs (this one's are finished)

    def submit(self, spec: ShotSpec, *, reason: str) -> str:
        from .process_shot import process_shot

        log.info("%s: running inline (%s)", spec.shot_path, reason)
        run = self.run or process_shot
        result = run(spec.model_dump(mode="json"), self.dask_address)
        self.results.append(result)
        if result.get("job_id") is None:  # refused before any work
            raise SubmissionRefused(str(result.get("error") or "refused"))
        return f"inline-{result.get('job_id')}"


def run_shot_here(
    spec: dict[str, Any], dask_address: str | None, settings: Settings, on_progress: Listener
) -> dict[str, Any]:
    """Run the process-shot flow here, against the configured Prefect API or an embedded
    one that lives as long as this call (`flows.orchestrator`), telling ``on_progress`` how
    the shot goes; OrchestratorError when there is no Prefect API to run against."""
    from .process_shot import process_shot

    with (
        prefect_api(settings.home / "prefect", settings.prefect_start_timeout_s),
        listening(on_progress),
    ):
        return dict(process_shot(spec, dask_address))


class SubmissionRefused(SvfxError):
    """An inline run that refused its shot (the reason is the message)."""
