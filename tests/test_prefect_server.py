"""Prefect as in production: a real `prefect server start` on PostgreSQL (`tests.prefect_server`)
and a real `svfx serve` process registered with it, as a studio runs them.

One server, one `svfx serve` and one Dask LocalCluster (its address in SVFX_DASK_ADDRESS, as a
farm's scheduler would be) for the module; the catalog is a throwaway PostgreSQL database too,
models are the tiny UNTRAINED ones, plates for the scan sit in a bucket on moto's S3 server.

- a shot submitted through the served `process-shot` deployment by the Prefect API, as a
  studio's tools would, runs to `Completed`, its catalog job is `complete`, and the flow's
  progress, table and markdown artifacts are in the server;
- Prefect's own client (`read_artifacts`) and CLI (`prefect artifact inspect`) read a run's
  artifacts back, as docs/operations/prefect-server.md tells a studio to watch a shot;
- the served `scan-plates` runs on its schedule, finds the plate in the bucket and queues a
  `process-shot` run for it, which completes;
- a Prefect server that is down: `svfx serve` and `svfx submit` each end with one line naming
  the URL and exit 2, and nothing is left half-submitted in the catalog.

The second and third fail if the pins of pyproject.toml are relaxed: Prefect 3.8.8's scheduler
fires no schedule under SQLAlchemy 2.1, and its server refuses its client's null filters under
FastAPI >= 0.151.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID, uuid4

import pytest

from bench.common import free_port
from schemas.catalog import open_catalog, queries
from tests.prefect_server import (
    PG_HOST,
    PrefectServer,
    log_tail,
    running_prefect_server,
    stop_process_group,
    throwaway_database,
)
from tests.shot_helpers import make_plate, spec_data

pytestmark = [pytest.mark.prefect_server, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parent.parent
SCAN_SHOT = "ab/sq010/sh010"
SCAN_KEYS = f"{SCAN_SHOT}/plates/bg01"  # under the prefix, as the default template names them
SCAN_INTERVAL_S = 20  # the first scheduled scan comes this long after `svfx serve` registers
SCHEDULER_GRACE_S = 30  # the server creates a schedule's runs within seconds (every 5 s)
RUN_TIMEOUT_S = 300.0  # a tiny shot takes well under a minute even on a busy 2-core machine
T = TypeVar("T")


@dataclass
class Served:
    """The running `svfx serve` and what it was given."""

    process: subprocess.Popen[bytes]
    server: PrefectServer
    home: Path
    log: Path
    catalog_url: str
    scan_prefix: str
    registered_at: float = 0.0  # time.monotonic() when both deployments were there

    def why(self) -> str:
        """For failure messages: the last lines of the serve process (it logs its flow runs)
        and of the server (its services' errors show only there)."""
        return f"svfx serve log ({self.log}):\n{log_tail(self.log, 60)}\n{self.server.log_tail()}"


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without SVFX_*/PREFECT_* (a test harness's API URL, the
    user's profile), plus a home and a PREFECT_HOME of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SVFX_", "PREFECT_"))}
    env.update(
        SVFX_HOME=str(home),
        SVFX_ALLOWED_ROOTS=str(home),
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    env.update(extra)
    return env


def wait_for(
    what: str, check: Callable[[], T | None], timeout_s: float, why: Callable[[], str]
) -> T:
    """Poll ``check`` until it returns something; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f} s\n{why()}", pytrace=False)
        time.sleep(1.0)


# -- fixtures: server, client settings, cluster, bucket, `svfx serve` -------------------------
@pytest.fixture(scope="module")
def prefect_server() -> Iterator[PrefectServer]:
    """The server, and this process's Prefect client pointed at it (and at a home of its own)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with (
        running_prefect_server() as server,
        tempfile.TemporaryDirectory(prefix="svfx-prefect-client-") as client_home,
        temporary_settings(updates={PREFECT_API_URL: server.api_url, PREFECT_HOME: client_home}),
    ):
        yield server


@pytest.fixture(scope="module")
def dask_address(s3_endpoint: str) -> Iterator[str]:
    """A LocalCluster for the served flows, spawned after `s3_endpoint` set the AWS_*
    variables so its workers read the bucket; its address goes to SVFX_DASK_ADDRESS."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},  # not 8787: it may be taken
        silence_logs=logging.WARNING,
    ) as local:
        yield local.scheduler_address


@pytest.fixture(scope="module")
def bucket(s3_endpoint: str) -> Iterator[str]:
    import s3fs

    fs = s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": s3_endpoint}, key="testing", secret="testing"
    )
    name = f"serve-{uuid4().hex[:12]}"
    fs.mkdir(name)
    try:
        yield f"s3://{name}"
    finally:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(name, recursive=True)


@pytest.fixture(scope="module")
def served(
    prefect_server: PrefectServer,
    dask_address: str,
    bucket: str,
    s3_endpoint: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    """`svfx serve` against the server, watching ``<bucket>/incoming`` (a 2-frame plate is
    there already) every SCAN_INTERVAL_S seconds; ready once both deployments are registered."""
    import s3fs

    home = tmp_path_factory.mktemp("serve")
    prefix = f"{bucket}/incoming"
    fs = s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": s3_endpoint}, key="testing", secret="testing"
    )
    for frame in sorted(Path(make_plate(home / "scan-plate", frames=2)).parent.glob("*.exr")):
        fs.put_file(str(frame), f"{prefix}/{SCAN_KEYS}/{frame.name}")
    with throwaway_database("svfx_catalog") as (user, name):
        catalog_url = f"postgresql+psycopg://{user}@{PG_HOST}/{name}"
        env = clean_env(
            home,
            PREFECT_API_URL=prefect_server.api_url,
            # how often the runner asks for runs to start (default 10 s): tests wait less
            PREFECT_RUNNER_POLL_FREQUENCY="2",
            SVFX_ALLOWED_ROOTS=f"{home},{bucket}",
            SVFX_CATALOG_URL=catalog_url,
            SVFX_DASK_ADDRESS=dask_address,
            SVFX_S3_ENDPOINT_URL=s3_endpoint,
            SVFX_OUTPUT_ROOT=str(home / "out"),
            SVFX_SCAN_PREFIXES=prefix,
            SVFX_SCAN_INTERVAL_S=str(SCAN_INTERVAL_S),
            SVFX_SCAN_SETTLE_S="0",
            SVFX_SCAN_PASSES="matte",
        )
        log = home / "serve.log"
        with open(log, "wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "cli", "serve"],
                cwd=REPO,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        serving = Served(process, prefect_server, home, log, catalog_url, prefix)
        try:
            wait_for("deployments registered", registered(serving), 120, serving.why)
            serving.registered_at = time.monotonic()
            yield serving
        finally:
            stop_process_group(process)


def registered(serving: Served) -> Callable[[], bool | None]:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    def check() -> bool | None:
        if serving.process.poll() is not None:
            pytest.fail(f"svfx serve exited {serving.process.returncode}\n{serving.why()}")
        with get_client(sync_client=True) as client:
            try:
                for name in ("process-shot/process-shot", "scan-plates/scan-plates"):
                    client.read_deployment_by_name(name)
            except ObjectNotFound:
                return None
        return True

    return check


def final_run(run_id: UUID | str, serving: Served) -> Any:
    """The flow run once it reaches a final state (bounded)."""
    from prefect.client.orchestration import get_client

    def check() -> Any:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(UUID(str(run_id)))
        return run if run.state is not None and run.state.is_final() else None

    return wait_for(f"final state of flow run {run_id}", check, RUN_TIMEOUT_S, serving.why)


def artifacts_of(run_id: UUID) -> list[Any]:
    """The run's artifacts as the server lists them. Not ``client.read_artifacts``: in Prefect
    3.8.8 it sends ``null`` for every filter and paging field left out, which this server
    refuses (422), and an empty task-run filter, to avoid that, drops flow-level artifacts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.client.schemas.objects import Artifact

    only_this_run = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
    body = {"artifacts": only_this_run.model_dump(mode="json", exclude_unset=True), "limit": 200}
    with get_client(sync_client=True) as client:
        response = client.request("POST", "/artifacts/filter", json=body)
    response.raise_for_status()
    return Artifact.model_validate_list(response.json())


def job_of(serving: Served, run_id: UUID) -> dict[str, Any]:
    catalog = open_catalog(serving.catalog_url)
    try:
        jobs, _ = queries.jobs_page(catalog.engine, limit=50)
    finally:
        catalog.close()
    (job,) = [j for j in jobs if j["flow_run_id"] == str(run_id)]
    return job


# -- a. a shot through the served deployment --------------------------------------------------
@pytest.mark.slow
def test_a_shot_submitted_to_the_deployment_completes_with_its_artifacts(served: Served) -> None:
    """What a studio's tools do: create a run of `process-shot/process-shot` with the spec as
    its parameter, and watch it in Prefect."""
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment

    plate = make_plate(served.home / "plates", frames=2)
    spec = spec_data(plate, served.home / "out", passes=["matte"], previews=False)
    run = run_deployment(
        "process-shot/process-shot",
        parameters={"spec": spec},
        timeout=0,  # queue it: `svfx serve` runs it
        as_subflow=False,
        flow_run_name="demo/sq010/sh010 (studio tool)",
    )
    final = final_run(run.id, served)
    assert final.state.type == StateType.COMPLETED, (final.state, served.why())

    job = job_of(served, run.id)
    assert job["status"] == "complete", job
    assert (job["frames_total"], job["frames_done"]) == (2, 2)

    artifacts = {a.type: a for a in artifacts_of(run.id)}
    assert set(artifacts) >= {"progress", "table", "markdown"}, artifacts
    assert float(artifacts["progress"].data) == 100.0
    table = artifacts["table"].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert [(r["frame"], r["status"]) for r in rows] == [(1001, "done"), (1002, "done")]
    summary = artifacts["markdown"].data
    assert summary.startswith("# demo/sq010/sh010: complete")
    assert f"job {job['id']}; 2 done" in summary


# -- d. Prefect's own client and CLI reading what the flows publish -----------------------------
def test_prefects_client_and_cli_read_a_runs_artifacts(
    prefect_server: PrefectServer, tmp_path: Path
) -> None:
    """What a studio's tools and the docs' `prefect artifact inspect` do to watch a shot:
    read a flow run's artifacts back from the server. (FastAPI >= 0.151 breaks this on
    Prefect 3.8.8's server: it refuses the nulls the client sends; pyproject pins <0.151.)"""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    @flow(name="svfx-artifact-probe")
    def probe() -> None:
        """Never run: only its flow run is created, to hang an artifact on."""

    key = f"svfx-probe-{uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(probe)
        client.create_artifact(
            ArtifactCreate(key=key, type="markdown", data="# probe", flow_run_id=run.id)
        )
        found = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])), limit=10
        )
    assert [(a.key, a.data) for a in found] == [(key, "# probe")]
    shown = subprocess.run(
        [sys.executable, "-m", "prefect", "artifact", "inspect", key],
        env=clean_env(tmp_path, PREFECT_API_URL=prefect_server.api_url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0 and "# probe" in shown.stdout, shown.stdout + shown.stderr


# -- b. the scheduled scan ---------------------------------------------------------------------
def test_the_scheduled_scan_runs_and_queues_the_plate_it_finds(served: Served) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    def runs_of(flow: str) -> list[Any]:
        with get_client(sync_client=True) as client:
            return client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])),
                sort=FlowRunSort.ID_DESC,  # the sync client sends no default
                limit=200,
            )

    def scheduled_scans() -> list[Any] | None:
        return [r for r in runs_of("scan-plates") if r.auto_scheduled] or None

    # the server's scheduler creates the runs within seconds of the deployment's registration
    # (its recent-deployments loop runs every 5 s)
    while not scheduled_scans():
        if time.monotonic() > served.registered_at + SCHEDULER_GRACE_S:
            pytest.fail(
                f"the server scheduled no scan-plates run within {SCHEDULER_GRACE_S} s of the "
                f"deployment's registration\n{served.why()}",
                pytrace=False,
            )
        time.sleep(1.0)

    def finished_scan() -> Any:
        done = [r for r in scheduled_scans() or [] if r.state is not None and r.state.is_final()]
        return min(done, key=lambda r: r.expected_start_time) if done else None

    scan = wait_for("finished scheduled scan-plates run", finished_scan, 180, served.why)
    assert scan.state.type == StateType.COMPLETED, (scan.state, served.why())
    (report,) = [a for a in artifacts_of(scan.id) if a.key == "svfx-scan-report"]
    plate = f"{served.scan_prefix}/{SCAN_KEYS}/astronaut.####.exr"
    assert f"submitted (new): {SCAN_SHOT}/bg01 {plate}" in report.data, report.data

    queued = [r for r in runs_of("process-shot") if r.parameters["spec"]["plate"] == plate]
    assert len(queued) == 1, queued  # later scans saw it in flight or up to date
    assert f"run {queued[0].id}" in report.data
    final = final_run(queued[0].id, served)
    assert final.state.type == StateType.COMPLETED, (final.state, served.why())
    job = job_of(served, queued[0].id)
    assert job["status"] == "complete" and job["submitter"] == "svfx-scan", job


# -- c. a Prefect server that is down ----------------------------------------------------------
def test_a_server_that_is_down_is_one_line_and_exit_2_with_nothing_submitted(
    tmp_path: Path,
) -> None:
    down = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    plate = make_plate(tmp_path / "plates", frames=1)
    env = clean_env(tmp_path, PREFECT_API_URL=down, SVFX_LOCAL_WORKERS="1")
    submit = [
        "submit", plate, "--shot", "demo/sq010/sh010", "--colorspace", "lin_rec709",
        "--passes", "matte", "--output", str(tmp_path / "out"), "--no-previews", "--json",
    ]  # fmt: skip
    commands = {"serve": ["serve"], "submit": submit}
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", "cli", *args],
            cwd=REPO,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        for name, args in commands.items()
    }
    for name, process in started.items():
        try:
            _out, err = process.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            stop_process_group(process)
            pytest.fail(f"svfx {name} still running 180 s after its Prefect API was found down")
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert process.returncode == 2, (name, err)
        assert len(errors) == 1, (name, err)
        assert down in errors[0] and "does not answer" in errors[0], (name, err)
        assert "Traceback" not in err, (name, err)

    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        jobs, total = queries.jobs_page(catalog.engine, limit=10)
    finally:
        catalog.close()
    assert (jobs, total) == ([], 0), "a job was registered for a run that never started"
