"""The infra/slurm recipe for real, on a one-node Slurm cluster of the test's own
(tests/slurm_server.py): the recipe's SLURMCluster (built by `cluster_kwargs`,
`build_cluster`, `start_workers`, as `slurm_cluster.py` does) submits its Dask workers with
sbatch, and tiny shots (tiny UNTRAINED models) run through the platform on them.

- the command as a studio runs it: `slurm_cluster.py --jobs 1` prints the address, `svfx
  submit` with SVFX_DASK_ADDRESS set completes on the Slurm job's worker, SIGTERM (handled
  as Ctrl-C) exits 0 and the job leaves the queue;
- a shot submitted with `svfx submit --dask-address <the recipe's scheduler>` completes on
  the Slurm jobs' workers, every frame catalogued `done`;
- `scancel` of a busy worker job mid-shot: Dask moves its chunk to the other job, and every
  frame is written exactly once (one EXR file, one EXR row per pass, one frame record);
- adapting with minimum 0: the recipe submits a job for a shot on an empty cluster, and the
  Slurm queue is empty again once the shot is done;
- a partition that does not exist: one line naming it, exit status 2, nothing queued.

This node has no GPU, so the workers are started with `--gpus-per-job 0`: no `--gres`
directive and no `GPU` resource, and the platform (flows.cluster.gpu_slots) submits chunks
with no resource requirement, as on a CPU-only LocalCluster. The GPU variant of the same
job (`--gres=gpu:1`, `--resources GPU=1`) is checked without Slurm in tests/test_infra.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from distributed import Client
from sqlalchemy import func, select

from flows.cluster import gpu_slots
from flows.planning import plan_shot
from flows.shot_result import ShotResult
from flows.shot_runner import run_planned_shot
from schemas.catalog import open_catalog
from schemas.catalog.models import JobFrame, Output
from schemas.settings import Settings
from schemas.spec import parse_spec
from schemas.summaries import ChunkSummary
from tests.shot_helpers import make_plate, settings_for, spec_data
from tests.slurm_server import SlurmServer, slurm_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "infra" / "slurm" / "slurm_cluster.py"
PARTITION = "gpu"
JOBS = 2
FRAMES_4 = [1001, 1002, 1003, 1004]
WAIT_S = 120.0  # a worker job from sbatch to registered (python, dask, torch imports)


def load_recipe() -> ModuleType:
    """infra/slurm/slurm_cluster.py is a script, not a package module: load it by path (no
    __pycache__ written under infra/)."""
    spec = importlib.util.spec_from_file_location("svfx_infra_slurm_cluster_real", RECIPE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module


def recipe_args(logs: Path, *extra: str) -> list[str]:
    """The recipe's options for this 2-core node: CPU-only workers, 1 core and 2 GB each,
    this interpreter (the package is installed in its environment), on loopback."""
    return [
        f"--queue={PARTITION}",
        "--gpus-per-job=0",
        "--cores=1",
        "--memory=2GB",
        "--walltime=00:20:00",  # under the partition's MaxTime
        f"--python={sys.executable}",
        "--interface=lo",
        "--scheduler-port=0",
        "--dashboard-address=127.0.0.1:0",
        f"--log-directory={logs}",
        # one torch thread per worker: two workers share the two cores
        "--env=SVFX_TORCH_THREADS=1",
        "--env=OMP_NUM_THREADS=1",
        *extra,
    ]


@dataclass
class Farm:
    """The recipe's cluster on the test Slurm, with what the tests ask of it."""

    slurm: SlurmServer
    recipe: ModuleType
    cluster: Any  # dask_jobqueue.SLURMCluster
    client: Client
    logs: Path

    def options(self, *extra: str) -> argparse.Namespace:
        return self.recipe.parse_args(recipe_args(self.logs, *extra))

    def diagnostics(self) -> str:
        queue = self.slurm.run("squeue", "-o", "%i %j %T %r").stdout
        jobs = "\n".join(
            f"--- {p.name}:\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.logs.glob("*"))
        )
        return f"squeue:\n{queue}\njob logs:\n{jobs}\n{self.slurm.logs()}"

    def wait_for_workers(self, n: int) -> None:
        try:
            self.client.wait_for_workers(n, timeout=WAIT_S)
        except TimeoutError:
            raise AssertionError(
                f"{n} Slurm worker(s) did not register within {WAIT_S:.0f}s\n{self.diagnostics()}"
            ) from None

    def worker_jobs(self) -> dict[str, str]:
        """Worker address -> the Slurm job it runs in (SLURM_JOB_ID in its environment)."""
        return self.client.run(os.getenv, "SLURM_JOB_ID")

    def wait_until_queue(self, expected: set[str], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while set(self.slurm.job_ids()) != expected:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: squeue still lists {self.slurm.job_ids()} after "
                    f"{WAIT_S:.0f}s, expected {sorted(expected)}\n{self.diagnostics()}"
                )
            time.sleep(0.5)


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmServer]:
    """The one-node Slurm cluster, SLURM_CONF set for this module's tests."""
    with slurm_cluster(PARTITION) as server:
        yield server


@pytest.fixture(scope="module")
def farm(slurm: SlurmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    """The recipe's SLURMCluster (its scheduler in this process) with JOBS worker jobs."""
    logs = tmp_path_factory.mktemp("slurm-job-logs")
    recipe = load_recipe()
    options = recipe.parse_args(recipe_args(logs, f"--jobs={JOBS}"))
    cluster = recipe.build_cluster(recipe.cluster_kwargs(options))
    try:
        recipe.start_workers(cluster, options)
        with Client(cluster) as client:
            farm = Farm(slurm, recipe, cluster, client, logs)
            farm.wait_for_workers(JOBS)
            yield farm
    finally:
        cluster.close()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", str(tmp_path))
    for name in ("SVFX_CATALOG_URL", "SVFX_CHECKPOINT_ROOT", "SVFX_OUTPUT_ROOT", "SVFX_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _run_shot(
    home: Path, settings: Settings, client: Client, frames: int, **callbacks: Any
) -> ShotResult:
    pattern = make_plate(home / "plates", frames=frames)
    spec = parse_spec(spec_data(pattern, home / "out", passes="matte", chunk_frames=2))
    catalog = open_catalog(settings.catalog)
    return run_planned_shot(plan_shot(spec, settings), catalog, client, window=4, **callbacks)


def _svfx_submit(home: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> dict[str, Any]:
    """`svfx submit` of a 4-frame plate (matte, chunks of 2) with `--json`; its summary."""
    from typer.testing import CliRunner

    from cli.main import app as svfx_app

    monkeypatch.setattr(
        "flows.cluster.start_local_cluster",
        lambda *a, **k: pytest.fail("started a LocalCluster instead of using the Slurm workers"),
    )
    (home / "prefect").mkdir()
    monkeypatch.setenv("PREFECT_HOME", str(home / "prefect"))
    pattern = make_plate(home / "plates", frames=4)
    args = ["submit", pattern, "--shot", "demo/sq010/sh040", "--colorspace", "lin_rec709"]
    args += ["--passes", "matte", "--chunk-frames", "2", "--no-previews", "--json", *extra]
    result = CliRunner().invoke(svfx_app, args)
    detail = f"{result.stdout}\n{result.stderr}"
    if result.exc_info and not isinstance(result.exception, SystemExit):
        detail += "".join(traceback.format_exception(*result.exc_info))
    assert result.exit_code == 0, detail
    summary: dict[str, Any] = json.loads(result.stdout)
    assert summary["status"] == "complete", summary["failed"]
    assert sorted(summary["done"]) == FRAMES_4
    assert len(list(Path(summary["output_root"]).glob("*.exr"))) == 4
    return summary


def _frame_records(home: Path, job_id: int) -> list[tuple[int, str, str]]:
    """(frame, status, worker host:pid) of every frame record of the job."""
    catalog = open_catalog(f"sqlite:///{home / 'catalog.db'}")
    with catalog.engine.connect() as conn:
        rows = conn.execute(
            select(JobFrame.frame, JobFrame.status, JobFrame.worker).where(
                JobFrame.job_id == job_id
            )
        ).all()
    return sorted((frame, status, worker or "") for frame, status, worker in rows)


def _wait_for_line(proc: subprocess.Popen[bytes], out: Path, prefix: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for line in out.read_text().splitlines():
            if line.startswith(prefix):
                return line
        assert proc.poll() is None, f"the recipe exited with {proc.returncode}:\n{out.read_text()}"
        time.sleep(0.2)
    raise AssertionError(f"no {prefix!r} line within {WAIT_S:.0f}s:\n{out.read_text()}")


def test_the_recipe_as_a_studio_runs_it_from_start_to_ctrl_c(
    slurm: SlurmServer, home: Path, prefect_api: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`slurm_cluster.py --jobs 1` in its own process, `export SVFX_DASK_ADDRESS=...` from
    what it prints, `svfx submit`, then SIGTERM (as Ctrl-C): the worker job is cancelled.
    First in the module, while the node's two cores are free of the other tests' jobs."""
    name = "svfx-recipe-cli"
    out, logs = home / "recipe.out", home / "job-logs"
    args = recipe_args(logs, f"--job-name={name}", "--jobs=1")
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(RECIPE), *args],
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        export = _wait_for_line(proc, out, "export SVFX_DASK_ADDRESS=")
        address = export.partition("=")[2]
        assert address.startswith("tcp://127.0.0.1:"), export
        monkeypatch.setenv("SVFX_DASK_ADDRESS", address)
        deadline = time.monotonic() + WAIT_S
        while slurm.run("squeue", "-h", "-n", name, "-o", "%T").stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, (
                f"the recipe's worker job is not running after {WAIT_S:.0f}s\n"
                + slurm.run("squeue", "-o", "%i %j %T %r").stdout
            )
            time.sleep(0.5)
        summary = _svfx_submit(home, monkeypatch)
        records = _frame_records(home, summary["job_id"])
        assert [(f, status) for f, status, _ in records] == [(f, "done") for f in FRAMES_4]
        queued = slurm.run("squeue", "-h", "-n", name, "-o", "%i").stdout.split()
        assert len(queued) == 1, queued
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=WAIT_S)
    assert code == 0, out.read_text()
    assert "# closing: cancelling the worker jobs" in out.read_text()
    deadline = time.monotonic() + WAIT_S
    while slurm.run("squeue", "-h", "-n", name, "-o", "%i").stdout.strip():
        assert time.monotonic() < deadline, f"job {name} still queued after the recipe ended"
        time.sleep(0.5)


def test_a_shot_submitted_to_the_recipes_scheduler_runs_on_the_slurm_jobs(
    farm: Farm, home: Path, prefect_api: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = farm.worker_jobs()
    assert len(jobs) == JOBS and set(jobs.values()) == set(farm.slurm.job_ids())
    info = farm.client.scheduler_info(n_workers=-1)["workers"].values()
    assert all(w["nthreads"] == 1 for w in info)
    assert gpu_slots(farm.client) == 0  # --gpus-per-job 0: no worker claims a GPU

    summary = _svfx_submit(home, monkeypatch, "--dask-address", farm.cluster.scheduler_address)
    records = _frame_records(home, summary["job_id"])
    assert [(f, status) for f, status, _ in records] == [(f, "done") for f in FRAMES_4]
    # the chunks ran in the workers of the Slurm jobs (worker = host:pid)
    slurm_pids = set(farm.client.run(os.getpid).values())
    assert {int(worker.rpartition(":")[2]) for *_, worker in records} <= slurm_pids


def _times_processing(farm: Farm, key: str) -> int:
    """How often the scheduler (in this process) sent the task to a worker."""
    return sum(1 for t in farm.cluster.scheduler.story(key) if t[2] == "processing")


def test_scancel_of_a_worker_job_mid_shot_still_writes_every_frame_once(
    farm: Farm, home: Path
) -> None:
    farm.wait_for_workers(JOBS)
    before = set(farm.slurm.job_ids())
    settings = settings_for(home)
    cancelled: list[str] = []
    moved: list[str] = []  # chunk keys the cancelled worker held

    def scancel_the_job_that_just_delivered(summary: ChunkSummary) -> None:
        """The worker that delivered this chunk has just started its next one (or holds
        it): cancel its Slurm job, so that chunk is certainly still in flight."""
        if cancelled:
            return
        pid = int(summary.worker.rpartition(":")[2])
        pids = farm.client.run(os.getpid)  # address -> pid
        address = next((a for a, p in pids.items() if p == pid), None)
        keys = farm.client.processing([address])[address] if address else []
        if not keys:
            return  # nothing left for it: wait for the next chunk to land
        job = farm.client.run(os.getenv, "SLURM_JOB_ID", workers=[address])[address]
        done = farm.slurm.run("scancel", job)
        assert done.returncode == 0, done.stderr
        cancelled.append(job)
        moved.extend(keys)

    frames = list(range(1001, 1009))
    result = _run_shot(
        home, settings, farm.client, len(frames), on_chunk=scancel_the_job_that_just_delivered
    )
    assert cancelled, "the worker that delivered a chunk never had another: nothing cancelled"
    assert result.status == "complete", result.failed
    assert sorted(result.done) == frames
    # Dask handed the cancelled worker's chunk to the other job: it went to `processing` twice
    starts = {key: _times_processing(farm, key) for key in moved}
    assert any(n >= 2 for n in starts.values()), starts

    catalog = open_catalog(settings.catalog)
    with catalog.engine.connect() as conn:
        exr_rows = conn.execute(
            select(Output.frame, Output.pass_name, func.count())
            .where(Output.kind == "exr")
            .group_by(Output.frame, Output.pass_name)
        ).all()
        duplicates = conn.execute(
            select(Output.uri, Output.part, Output.frame, Output.pass_name)
            .group_by(Output.uri, Output.part, Output.frame, Output.pass_name)
            .having(func.count() > 1)
        ).all()
        records = conn.execute(
            select(JobFrame.frame, JobFrame.status).where(JobFrame.job_id == result.job_id)
        ).all()
    assert sorted((frame, n) for frame, _pass, n in exr_rows) == [(f, 1) for f in frames]
    assert duplicates == []
    assert sorted(records) == [(f, "done") for f in frames]
    on_disk = sorted(Path(result.output_root).glob("*.exr"))
    assert [int(p.name.split(".")[-2]) for p in on_disk] == frames

    # the cancelled job leaves the queue; the other one stays (a fixed scale, no adapt)
    farm.wait_until_queue(before - set(cancelled), "after scancel")


def test_adapting_from_zero_starts_a_job_for_a_shot_and_scales_back_to_zero(
    farm: Farm, home: Path
) -> None:
    options = farm.options("--jobs=0", f"--adapt-max={JOBS}")
    farm.recipe.start_workers(farm.cluster, options, interval="500ms", wait_count=2)
    farm.wait_until_queue(set(), "idle with adapt(minimum=0) before the shot")
    assert farm.client.scheduler_info(n_workers=-1)["workers"] == {}

    frames = list(range(1001, 1005))
    result = _run_shot(home, settings_for(home), farm.client, len(frames))
    assert result.status == "complete", result.failed
    assert sorted(result.done) == frames

    farm.wait_until_queue(set(), "idle with adapt(minimum=0) after the shot")
    assert farm.client.scheduler_info(n_workers=-1)["workers"] == {}


def test_a_partition_that_does_not_exist_is_one_line_and_exit_2(
    slurm: SlurmServer, tmp_path: Path
) -> None:
    name = "svfx-bad-partition"
    args = recipe_args(tmp_path, "--queue=nosuch", f"--job-name={name}", "--jobs=1")
    done = subprocess.run(
        [sys.executable, str(RECIPE), *args],
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and "partition 'nosuch'" in lines[0], lines[0]
    assert "Invalid partition name" in lines[0]
    assert "SVFX_DASK_ADDRESS" not in done.stdout  # no scheduler address offered
    queued = slurm.run("squeue", "-h", "-n", name, "-o", "%i")
    assert queued.returncode == 0 and queued.stdout.strip() == ""
