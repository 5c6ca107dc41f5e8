"""The scan end to end on moto's S3 server: plates uploaded to a bucket, each scan runs
``process_shot`` for what is new or changed (tiny UNTRAINED models, a LocalCluster of two
worker processes, outputs written to the same bucket), and the catalog keeps count.

One sequence goes through the life a watched bucket sees:
1. four of five frames uploaded (1004 still on its way): processed, the job ends ``partial``
   naming 1004, never ``complete``;
2. a second scan submits nothing;
3. 1004 arrives: only 1004 is computed, the job ends ``complete``;
4. 1002's object is replaced: only 1002 is computed;
5. 1003 changes and 1005 is deleted after the listing: 1003 is computed, 1005 is reported
   missing by frame number, the rest of the shot is unaffected.
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import s3fs
from distributed import Client, LocalCluster

from flows.scan import ScanDefaults, scan_bucket
from flows.submission import InlineSubmitter
from schemas.catalog import open_catalog, queries
from schemas.settings import load_settings
from schemas.spec import ShotSpec
from tests.shot_helpers import make_plate

pytestmark = pytest.mark.timeout(400)

TEMPLATE = "{show}/{seq}/{shot}/plates/{plate}/{name}.####.exr"
PLATE_DIR = "ab/sq010/sh010/plates/bg01"


@pytest.fixture(scope="module")
def cluster(s3_endpoint: str):
    """Spawned after `s3_endpoint` set the AWS_* variables, so the workers inherit them."""
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as local,
        Client(local),
    ):
        yield local.scheduler_address


class DeletingSubmitter(InlineSubmitter):
    """Deletes objects between the scan's listing and the run (an object deleted mid-scan)."""

    def __init__(self, address: str, fs: s3fs.S3FileSystem, doomed: list[str]) -> None:
        super().__init__(address)
        self.fs, self.doomed = fs, doomed

    def submit(self, spec: ShotSpec, *, reason: str) -> str:
        for key in self.doomed:
            self.fs.rm(key)
        return super().submit(spec, reason=reason)


@pytest.mark.slow
def test_a_watched_bucket_through_five_scans(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_endpoint: str,
    s3_bucket: tuple[str, dict[str, Any]],
    prefect_api: None,
    cluster: str,
) -> None:
    url, options = s3_bucket
    fs = s3fs.S3FileSystem(**options)
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", f"{tmp_path},{url}")
    monkeypatch.setenv("SVFX_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.delenv("SVFX_CATALOG_URL", raising=False)
    monkeypatch.delenv("SVFX_CHECKPOINT_ROOT", raising=False)
    settings = load_settings()
    catalog = open_catalog(settings.catalog)
    local = Path(make_plate(tmp_path / "plates", frames=5)).parent
    files = {int(p.name.split(".")[-2]): p for p in sorted(local.glob("*.exr"))}
    key = {frame: f"{url}/{PLATE_DIR}/{p.name}" for frame, p in files.items()}
    defaults = ScanDefaults(
        output_root=f"{url}/out", colorspace="lin_rec709", settle_seconds=0, max_in_flight=2
    )

    def scan(submitter: InlineSubmitter | None = None) -> tuple[Any, InlineSubmitter]:
        submitter = submitter or InlineSubmitter(cluster)
        report = scan_bucket(
            [url],
            TEMPLATE,
            catalog=catalog,
            submitter=submitter,
            settings=settings,
            defaults=defaults,
        )
        assert report.errors == []
        return report, submitter

    # 1. 1004 is still uploading: the job covers 1001-1005 and ends partial, naming 1004
    for frame in (1001, 1002, 1003, 1005):
        fs.put_file(str(files[frame]), key[frame])
    report, ran = scan()
    assert [(d.action, d.redo) for d in report.sequences] == [("new", [1001, 1002, 1003, 1005])]
    (result,) = ran.results
    assert result["status"] == "partial"
    assert sorted(result["done"]) == [1001, 1002, 1003, 1005]
    assert list(result["failed"]) == [1004] and "1004" in result["failed"][1004]
    out = f"{url}/out/ab/sq010/sh010/bg01/sapiens2_v001"
    exrs = sorted(p for p in fs.ls(out, detail=False) if p.endswith(".exr"))
    assert [p.rsplit(".", 2)[-2] for p in exrs] == ["1001", "1002", "1003", "1005"]
    shots = queries.shots_page(catalog.engine, show="ab")[0]
    assert shots[0]["job_status"] == "partial" and shots[0]["passes"]["normal"] == 4

    # 2. nothing new: nothing submitted, no model work
    report, ran = scan()
    assert report.nothing_new and ran.results == []
    assert [d.action for d in report.sequences] == ["up to date"]

    # 3. 1004 arrives: only it is computed, and the shot is complete
    fs.put_file(str(files[1004]), key[1004])
    report, ran = scan()
    assert [(d.action, d.redo) for d in report.sequences] == [("changed", [1004])]
    (result,) = ran.results
    assert result["status"] == "complete"
    assert result["done"] == [1004] and sorted(result["skipped"]) == [1001, 1002, 1003, 1005]

    # 4. a re-pulled frame: 1002's object replaced by other bytes
    fs.put_file(str(files[1001]), key[1002])
    report, ran = scan()
    assert [(d.action, d.redo) for d in report.sequences] == [("changed", [1002])]
    (result,) = ran.results
    assert result["done"] == [1002] and result["status"] == "complete"
    exr = fs.cat(f"{out}/sh010_bg01_sapiens2_v001.1002.exr")
    recorded = queries.output_provenance(catalog.engine, f"{out}/sh010_bg01_sapiens2_v001.1002.exr")
    assert recorded is not None
    assert {o["sha256"] for o in recorded["outputs"]} == {hashlib.sha256(exr).hexdigest()}

    # 5. 1003 changes, 1005 vanishes after the listing: reported by frame, the rest goes on
    fs.put_file(str(files[1004]), key[1003])
    fs.put_file(str(files[1004]), key[1005])
    report, ran = scan(DeletingSubmitter(cluster, fs, [key[1005]]))
    assert [(d.action, d.redo) for d in report.sequences] == [("changed", [1003, 1005])]
    (result,) = ran.results
    assert result["status"] == "partial"
    assert result["done"] == [1003] and list(result["failed"]) == [1005]
    jobs, _ = queries.jobs_page(catalog.engine, show="ab", limit=10)  # newest first
    # (scan 2 made none)
    assert [j["status"] for j in jobs] == ["partial", "complete", "complete", "partial"]
    assert [f["frame"] for f in jobs[0]["failed_frames"]] == [1005]
    assert "missing" in jobs[0]["failed_frames"][0]["error"]


def test_served_deployments_queue_runs_that_hold_their_plate(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_endpoint: str,
    s3_bucket: tuple[str, dict[str, Any]],
    prefect_api: None,
) -> None:
    """`svfx serve`'s deployments registered with Prefect: a scan queues a process-shot run
    (nobody runs it here), the next scan sees it in flight and queues nothing, and once the
    run is cancelled the plate is free again. The scan deployment carries its schedule."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    from flows.scheduled import deployments
    from flows.submission import DeploymentSubmitter

    url, options = s3_bucket
    fs = s3fs.S3FileSystem(**options)
    fs.pipe({f"{url}/{PLATE_DIR}/p.{f}.exr": b"x" for f in (1001, 1002)})
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", f"{tmp_path},{url}")
    monkeypatch.setenv("SVFX_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("SVFX_SCAN_PREFIXES", url)
    monkeypatch.setenv("SVFX_SCAN_INTERVAL_S", "600")
    monkeypatch.setenv("SVFX_SCAN_MAX_IN_FLIGHT", "3")
    settings = load_settings()
    served = deployments(settings)
    assert [d.name for d in served] == ["process-shot", "scan-plates"]
    for deployment in served:
        deployment.apply()
    with get_client(sync_client=True) as client:
        scan_deployment = client.read_deployment_by_name("scan-plates/scan-plates")
        shot_deployment = client.read_deployment_by_name("process-shot/process-shot")
    assert scan_deployment.schedules[0].schedule.interval.total_seconds() == 600
    assert scan_deployment.parameters["prefixes"] == [url]
    assert shot_deployment.global_concurrency_limit.limit == 3

    catalog = open_catalog(settings.catalog)

    def scan() -> Any:
        return scan_bucket(
            [url],
            TEMPLATE,
            catalog=catalog,
            submitter=DeploymentSubmitter(),
            settings=settings,
            defaults=ScanDefaults(settle_seconds=0),
        )

    first = scan()
    assert [d.action for d in first.sequences] == ["new"]
    run_id = first.sequences[0].run_id
    assert run_id
    second = scan()
    assert [(d.action, d.run_id) for d in second.sequences] == [("in flight", run_id)]
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        assert run.parameters["spec"]["plate"] == f"{url}/{PLATE_DIR}/p.####.exr"
        assert "shot:ab/sq010/sh010" in run.tags
        client.set_flow_run_state(run_id, Cancelled(), force=True)
    third = scan()
    assert [d.action for d in third.sequences] == ["new"] and third.sequences[0].run_id != run_id


def test_jobs_whose_flow_died_are_closed_with_the_reason(tmp_path: Path, prefect_api: None) -> None:
    """A catalog job left `running` by a crashed flow run is closed (partial: some frames were
    recorded), one whose run is still going is left alone."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed, Running

    from flows.process_shot import process_shot
    from flows.reaper import reap_abandoned_jobs
    from tests.catalog_fixtures import make_chunk, make_plate, make_spec

    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    with get_client(sync_client=True) as client:
        dead = client.create_flow_run(process_shot, parameters={"spec": {}}, state=Running())
        alive = client.create_flow_run(process_shot, parameters={"spec": {}}, state=Running())
        client.set_flow_run_state(dead.id, Crashed(message="worker node lost"), force=True)
    jobs = {}
    for name, run in (("sh0010", dead), ("sh0020", alive)):
        spec = make_spec(tmp_path, shot=name)
        jobs[name] = catalog.register_job(spec, make_plate(spec, range(1, 5)), str(run.id))
        catalog.record_chunk(jobs[name], make_chunk(spec, [1, 2]))

    reaped = reap_abandoned_jobs(catalog)
    assert [r["job_id"] for r in reaped] == [jobs["sh0010"]]
    closed = catalog.job(jobs["sh0010"])
    assert closed["status"] == "partial" and closed["finished_at"]
    assert f"flow run {dead.id} ended CRASHED" in closed["message"]
    assert "2 of 4 frames recorded" in closed["message"]
    assert catalog.job(jobs["sh0020"])["status"] == "running"
    assert reap_abandoned_jobs(catalog) == []  # nothing left to close


def test_a_job_whose_process_died_is_closed_and_its_run_marked_crashed(
    tmp_path: Path, prefect_api: None
) -> None:
    """`svfx submit` killed outright: its Prefect run stays Running for ever and its job too,
    so a scan would take the plate for in flight. The reaper sees the dead owner, closes the
    job and tells Prefect the run crashed."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from flows.process_shot import process_shot
    from flows.reaper import reap_abandoned_jobs
    from flows.submission import runs_in_flight
    from tests.catalog_fixtures import make_plate, make_spec

    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    spec = make_spec(tmp_path, shot="sh0030")
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(
            process_shot, parameters={"spec": spec.model_dump(mode="json")}, state=Running()
        )
    dead_process = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_process.wait()
    owner = f"{socket.gethostname()}:{dead_process.pid}::gone"
    job = catalog.register_job(
        spec, make_plate(spec, range(1, 5)), str(run.id), output_root=str(tmp_path), owner=owner
    )
    assert spec.plate in " ".join(runs_in_flight())

    reaped = reap_abandoned_jobs(catalog)
    assert [r["job_id"] for r in reaped] == [job]
    closed = catalog.job(job)
    assert closed["status"] == "failed" and "ended without finishing" in closed["message"]
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.id).state.type.value == "CRASHED"
    assert str(run.id) not in runs_in_flight().values()
