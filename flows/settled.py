"""A run with nothing to compute, settled without a cluster: when the catalog and the disk
together (`flows.resume.decide_work`) say every present frame of a plan is done, the job is
registered, its frames recorded as skipped, the shot-level files checked and the job closed
here, in the submitting process, without starting Dask or the Prefect flow. A resubmit that
has nothing to do then answers in a second or two instead of the time a cluster and an
orchestrator take to start (docs/design/orchestration.md)."""

from __future__ import annotations

from schemas.catalog.writer import Catalog

from .resume import decide_work
from .shot_plan import ShotPlan
from .shot_result import ShotResult
from .shot_runner import run_planned_shot


def settle_without_cluster(plan: ShotPlan, catalog: Catalog) -> ShotResult | None:
    """The run's result when nothing is to be computed or adopted; None when there is work
    for a cluster (the caller runs the flow as usual). Raises JobConflict, as a run does,
    when a live job writes the same outputs."""
    work = decide_work(plan, catalog, adopt=False)  # frames to prove: the flow's to do
    if work.todo or not work.skipped:
        return None
    return run_planned_shot(plan, catalog, None)
