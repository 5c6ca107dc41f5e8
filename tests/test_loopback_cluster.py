"""A real multi-process Dask cluster on loopback, started the way a farm starts one: a
`dask scheduler` process and two `svfx worker` processes (each starts one CPU `dask worker`),
then a 4-frame shot submitted with `svfx submit` and SVFX_DASK_ADDRESS pointing at it.

Also `flows.workers`: which worker processes `svfx worker` starts for which GPUs, and that
SIGTERM, SIGINT to its process group (Ctrl-C) and SIGHUP close them all, leaving no orphans.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from flows import workers
from flows.workers import visible_gpus, worker_commands
from tests.shot_helpers import make_plate

REPO = Path(__file__).resolve().parents[1]
ADDRESS = "tcp://scheduler.invalid:8786"


# -- which processes `svfx worker` starts ----------------------------------------------------
def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_auto_starts_one_gpu_worker_per_visible_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert visible_gpus("auto") == ["2", "3"]
    commands = worker_commands(ADDRESS, "auto")
    assert [env for _cmd, env in commands] == [
        {"CUDA_VISIBLE_DEVICES": "2"},
        {"CUDA_VISIBLE_DEVICES": "3"},
    ]
    for cmd, _env in commands:
        assert cmd[:4] == [sys.executable, "-m", "distributed.cli.dask_worker", ADDRESS]
        assert _flag(cmd, "--resources") == "GPU=1"
        assert _flag(cmd, "--nthreads") == "1"
    names = [_flag(cmd, "--name") for cmd, _env in commands]
    assert len(set(names)) == 2
    assert names[0].startswith("gpu2-") and names[1].startswith("gpu3-")


def test_a_count_takes_the_first_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", " 2, 3 ,")
    assert visible_gpus("1") == ["2"]
    ((cmd, env),) = worker_commands(ADDRESS, "1", nthreads=2, memory_limit="8GB")
    assert env == {"CUDA_VISIBLE_DEVICES": "2"}
    assert (_flag(cmd, "--nthreads"), _flag(cmd, "--memory-limit")) == ("2", "8GB")


def test_zero_gpus_gives_one_cpu_worker_without_the_gpu_resource(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(workers, "local_gpu_count", lambda: pytest.fail("looked for GPUs"))
    assert visible_gpus("0") == []
    ((cmd, env),) = worker_commands(ADDRESS, "0")
    assert env == {}
    assert "--resources" not in cmd and "GPU=1" not in cmd
    assert _flag(cmd, "--name").startswith("cpu-")


def test_asking_for_more_gpus_than_visible_is_an_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(ValueError, match="asked for 3 GPU workers but only 2 GPUs are visible"):
        worker_commands(ADDRESS, "3")
    # without CUDA_VISIBLE_DEVICES the GPUs that exist count, not the number asked for
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(workers, "local_gpu_count", lambda: 1)
    assert visible_gpus("auto") == ["0"]
    assert visible_gpus("1") == ["0"]
    with pytest.raises(ValueError, match="asked for 2 GPU workers but only 1 GPUs"):
        visible_gpus("2")
    monkeypatch.setattr(workers, "local_gpu_count", lambda: 0)
    assert visible_gpus("auto") == []  # no GPU at all: one CPU worker
    with pytest.raises(ValueError, match="--gpus takes auto, a count"):
        visible_gpus("two")


def test_svfx_worker_refuses_a_bad_gpu_count(monkeypatch, tmp_path):
    from cli.main import app as svfx_app

    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")

    def must_not_start(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(workers.subprocess, "Popen", must_not_start)
    result = CliRunner().invoke(svfx_app, ["worker", ADDRESS, "--gpus", "2"])
    assert result.exit_code == 2, result.output
    assert "asked for 2 GPU workers but only 1 GPUs are visible" in result.stderr


# -- processes on loopback ---------------------------------------------------------------------
def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SVFX_", "SLURM_"))}
    env.update(SVFX_HOME=str(home), CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", **extra)
    return env


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        # own session: the signals these tests send reach only what they are meant for
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes], known: list[psutil.Process] | None = None) -> None:
    """Terminate a process we started and everything under it, whatever state it is in;
    `known`: its descendants seen earlier (orphans are no longer found under it)."""
    family = list(known or [])
    with suppress(psutil.NoSuchProcess):
        family += [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in family:
        with suppress(psutil.NoSuchProcess):
            p.terminate()
    _gone, alive = psutil.wait_procs(family, timeout=15)
    for p in alive:
        with suppress(psutil.NoSuchProcess):
            p.kill()
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _scheduler(stack: ExitStack, tmp: Path) -> str:
    scheduler_file = tmp / "scheduler.json"
    proc = _start(
        [
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--scheduler-file",
            str(scheduler_file),
            "--no-dashboard",
        ],
        tmp / "scheduler.log",
        _env(tmp / "home"),
    )
    stack.callback(_stop, proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp / "scheduler.log").read_text()
        with suppress(OSError, ValueError, KeyError):
            return str(json.loads(scheduler_file.read_text())["address"])
        time.sleep(0.1)
    raise AssertionError("no scheduler file: " + (tmp / "scheduler.log").read_text())


def _svfx_worker(tmp: Path, address: str, name: str) -> subprocess.Popen[bytes]:
    return _start(
        ["-m", "cli", "worker", address, "--gpus", "0"],
        tmp / f"{name}.log",
        _env(tmp / "home"),
    )


def _descendants(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children(recursive=True)


def _dask_worker_pids(procs: list[psutil.Process]) -> set[int]:
    """The `dask worker` (nanny) processes among these."""
    found = set()
    for p in procs:
        with suppress(psutil.NoSuchProcess):
            if "distributed.cli.dask_worker" in p.cmdline():
                found.add(p.pid)
    return found


@pytest.fixture(scope="module")
def loopback(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A scheduler and two `svfx worker --gpus 0` processes on 127.0.0.1."""
    from distributed import Client

    tmp = tmp_path_factory.mktemp("loopback")
    with ExitStack() as stack:
        address = _scheduler(stack, tmp)
        procs, known = [], []
        for name in ("svfx-worker-a", "svfx-worker-b"):
            proc = _svfx_worker(tmp, address, name)
            stack.callback(_stop, proc, known)
            procs.append(proc)
        client = stack.enter_context(Client(address, timeout="30s"))
        try:
            client.wait_for_workers(2, timeout=120)
        except TimeoutError:
            logs = "\n".join(p.read_text()[-3000:] for p in sorted(tmp.glob("*.log")))
            raise AssertionError(f"the workers did not register:\n{logs}") from None
        known += [p for proc in procs for p in _descendants(proc)]
        yield {"address": address, "client": client, "procs": procs, "tmp": tmp}


def test_svfx_workers_register_with_their_names(loopback):
    import socket

    info = loopback["client"].scheduler_info(n_workers=-1)["workers"].values()
    hostname = socket.gethostname()
    assert sorted(w["name"] for w in info) == sorted(
        f"cpu-{hostname}-{p.pid}" for p in loopback["procs"]
    )
    assert all(not w.get("resources") for w in info)  # CPU workers: no GPU resource
    assert all(w["nthreads"] == 1 for w in info)


@pytest.mark.timeout(300)
def test_a_shot_submitted_with_svfx_dask_address_runs_on_those_workers(
    loopback, prefect_api, tmp_path, monkeypatch
):
    from sqlalchemy import select

    from cli.main import app as svfx_app
    from schemas.catalog import open_catalog
    from schemas.catalog.models import JobFrame
    from tasks.model_cache import resident_models

    client = loopback["client"]
    for name in ("SVFX_CATALOG_URL", "SVFX_CHECKPOINT_ROOT", "SVFX_OUTPUT_ROOT", "SVFX_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", str(tmp_path))
    monkeypatch.setenv("SVFX_DASK_ADDRESS", loopback["address"])  # no --dask-address
    (tmp_path / "prefect").mkdir()
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))

    def no_local_cluster(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("started a LocalCluster although SVFX_DASK_ADDRESS is set")

    monkeypatch.setattr("flows.cluster.start_local_cluster", no_local_cluster)
    assert all(models == [] for models in client.run(resident_models).values())

    pattern = make_plate(tmp_path / "plates", frames=4)
    result = CliRunner().invoke(
        svfx_app,
        [
            "submit",
            pattern,
            "--shot",
            "demo/sq010/sh030",
            "--colorspace",
            "lin_rec709",
            "--passes",
            "normal,seg",
            "--chunk-frames",
            "2",
            "--no-previews",
            "--json",
        ],
    )
    detail = f"{result.stdout}\n{result.stderr}"
    if result.exc_info and not isinstance(result.exception, SystemExit):
        detail += "".join(traceback.format_exception(*result.exc_info))
    assert result.exit_code == 0, detail
    summary = json.loads(result.stdout)
    assert summary["status"] == "complete", summary["failed"]
    assert sorted(summary["done"]) == [1001, 1002, 1003, 1004]
    assert summary["chunks"] == 2
    exrs = sorted(Path(summary["output_root"]).glob("*.exr"))
    assert len(exrs) == 4 and all(p.stat().st_size > 0 for p in exrs)

    # the chunks ran in the worker processes under the two `svfx worker`s
    worker_pids = client.run(os.getpid)  # address -> pid
    under_svfx = {p.pid for proc in loopback["procs"] for p in _descendants(proc)}
    assert set(worker_pids.values()) <= under_svfx
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    with catalog.engine.connect() as conn:
        ran_on = conn.execute(
            select(JobFrame.worker).where(JobFrame.job_id == summary["job_id"])
        ).scalars()
        ran_pids = {int(w.rpartition(":")[2]) for w in ran_on}
    assert ran_pids and ran_pids <= set(worker_pids.values())
    resident = client.run(resident_models)
    for address, pid in worker_pids.items():
        if pid in ran_pids:  # normal and seg stay loaded where a chunk ran
            assert len(resident[address]) == 2, resident


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "how",
    [
        pytest.param(lambda p: p.send_signal(signal.SIGTERM), id="SIGTERM"),
        # Ctrl-C in a terminal: SIGINT to the whole foreground process group
        pytest.param(lambda p: os.killpg(p.pid, signal.SIGINT), id="Ctrl-C"),
        pytest.param(lambda p: p.send_signal(signal.SIGHUP), id="SIGHUP"),
    ],
)
def test_svfx_worker_closes_its_workers_on_a_signal(loopback, how, tmp_path):
    """A third `svfx worker` joins, is told to stop, and leaves cleanly: exit code 0, its
    `dask worker` closed gracefully (the scheduler sees it go), no process left behind."""
    client = loopback["client"]
    proc = _svfx_worker(tmp_path, loopback["address"], "worker")
    family: list[psutil.Process] = []
    try:
        client.wait_for_workers(3, timeout=120)
        family += _descendants(proc)
        assert len(_dask_worker_pids(family)) == 1
        assert len(family) >= 2  # the nanny and its worker process (and a resource tracker)
        how(proc)
        assert proc.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()
        _gone, alive = psutil.wait_procs(family, timeout=30)
        assert alive == [], [p.cmdline() for p in alive]
        log = (tmp_path / "worker.log").read_text()
        assert "Nanny at" in log and "closed" in log
        assert "Aborted" not in log and "Traceback" not in log, log
        deadline = time.monotonic() + 30
        while len(client.scheduler_info(n_workers=-1)["workers"]) > 2:
            assert time.monotonic() < deadline, "the scheduler still lists the closed worker"
            time.sleep(0.2)
    finally:
        _stop(proc, family)


@pytest.mark.timeout(300)
def test_stopping_the_cluster_leaves_no_process_behind(tmp_path):
    """The same start and stop as the module's cluster, checked: every process gone."""
    from distributed import Client

    with ExitStack() as stack:
        address = _scheduler(stack, tmp_path)
        procs = [_svfx_worker(tmp_path, address, name) for name in ("a", "b")]
        family: list[psutil.Process] = []
        for proc in procs:
            stack.callback(_stop, proc, family)
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=120)
        family += [p for proc in procs for p in _descendants(proc)]
        assert len(_dask_worker_pids(family)) == 2
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(timeout=60) for proc in procs] == [0, 0]
        _gone, alive = psutil.wait_procs(family, timeout=30)
        assert alive == []
