"""A real multi-process Dask cluster on loopback, started the way a farm starts one: a
`dask scheduler` process and two `svfx worker` processes (each starts one CPU `dask worker`),
then a 4-frame shot submitted with `svfx submit` and SVFX_DASK_ADDRESS pointing at it.

Also `flows.workers`: which worker processes `svfx worker` starts for which GPUs, and that
SIGTERM, SIGINT to its process group (Ctrl-C) and SIGHUP close them all, leaving no orphans;
where `svfx cluster` and `svfx worker` say the dashboard is; and `--cluster ADDRESS` at a
closed loopback port: one line naming it, exit 2, nothing registered or handed to Prefect.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
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
from flows.allocator import ALLOCATOR_ENV
from flows.cluster import CHUNKS_PER_GPU, NANNY_SPAWN_ENV_VAR, PROFILE_ENV_VAR
from flows.workers import visible_gpus, worker_commands
from tasks.node_threads import NodeCores, node_plan, plan_threads
from tests.shot_helpers import make_plate
from tests.worker_helpers import start_env

REPO = Path(__file__).resolve().parents[1]
ADDRESS = "tcp://scheduler.invalid:8786"


# -- which processes `svfx worker` starts ----------------------------------------------------
def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


@pytest.fixture(autouse=True)
def _default_allocator(monkeypatch):
    for key in [*ALLOCATOR_ENV, NANNY_SPAWN_ENV_VAR, PROFILE_ENV_VAR]:
        monkeypatch.delenv(key, raising=False)


def _set_here(env: dict[str, str]) -> dict[str, str]:
    """A worker command's environment less the config variables that have its nanny pass the
    allocator settings on and its worker not profile (tests/test_worker_memory.py checks
    those)."""
    assert "MALLOC_ARENA_MAX" in env.pop(NANNY_SPAWN_ENV_VAR)
    assert env.pop(PROFILE_ENV_VAR) == "False"
    return env


def test_auto_starts_one_gpu_worker_per_visible_device(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert visible_gpus("auto") == ["2", "3"]
    commands = worker_commands(ADDRESS, "auto")
    assert [_set_here(env) for _cmd, env in commands] == [
        {**ALLOCATOR_ENV, "CUDA_VISIBLE_DEVICES": "2"},
        {**ALLOCATOR_ENV, "CUDA_VISIBLE_DEVICES": "3"},
    ]
    for cmd, _env in commands:
        assert cmd[:4] == [sys.executable, "-m", "distributed.cli.dask_worker", ADDRESS]
        assert _flag(cmd, "--resources") == "GPU=1"
        assert _flag(cmd, "--nthreads") == str(CHUNKS_PER_GPU)  # chunks at once per GPU
    names = [_flag(cmd, "--name") for cmd, _env in commands]
    assert len(set(names)) == 2
    assert names[0].startswith("gpu2-") and names[1].startswith("gpu3-")


def test_a_count_takes_the_first_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", " 2, 3 ,")
    assert visible_gpus("1") == ["2"]
    ((cmd, env),) = worker_commands(ADDRESS, "1", nthreads=2, memory_limit="8GB")
    assert _set_here(env) == {**ALLOCATOR_ENV, "CUDA_VISIBLE_DEVICES": "2"}
    assert (_flag(cmd, "--nthreads"), _flag(cmd, "--memory-limit")) == ("2", "8GB")


def test_zero_gpus_gives_the_nodes_cpu_workers_without_the_gpu_resource(monkeypatch):
    """With --gpus 0 the node's thread plan (tests/test_node_threads.py): here one worker."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(workers, "local_gpu_count", lambda: pytest.fail("looked for GPUs"))
    assert visible_gpus("0") == []
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # the user's own setting stays
    plan = plan_threads(NodeCores(2, "test"))
    ((cmd, env),) = worker_commands(ADDRESS, "0", plan=plan)
    allocator = {k: v for k, v in ALLOCATOR_ENV.items() if k != "MALLOC_ARENA_MAX"}
    assert _set_here(env) == {**allocator, **plan.environment()}
    assert "--resources" not in cmd and "GPU=1" not in cmd
    assert _flag(cmd, "--name").startswith("cpu0-")


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
            preexec_fn=_ctrl_c_as_in_a_terminal,
        )


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT handled as the default: a test suite started in the background by a
    non-interactive shell (`pytest &`) runs with SIGINT ignored, which its children inherit,
    and the Ctrl-C these tests send would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
        f"cpu0-{hostname}-{p.pid}" for p in loopback["procs"]
    )
    assert all(not w.get("resources") for w in info)  # CPU workers: no GPU resource
    assert all(w["nthreads"] == 1 for w in info)
    # the processes the nannies spawned started with the allocator settings (glibc reads them
    # then), not with Dask's own MALLOC_TRIM_THRESHOLD_
    # and with the node's thread plan, which each `svfx worker` printed first
    plan = node_plan(_env(loopback["tmp"]))
    for started in loopback["client"].run(start_env).values():
        assert {key: started.get(key) for key in ALLOCATOR_ENV} == ALLOCATOR_ENV
        assert {key: started.get(key) for key in plan.environment()} == plan.environment()
    for name in ("svfx-worker-a", "svfx-worker-b"):
        log = (loopback["tmp"] / f"{name}.log").read_text()
        assert log.startswith(plan.describe() + "\n"), log


@pytest.mark.timeout(300)
@pytest.mark.slow
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


# -- --cluster at an address where nothing answers ---------------------------------------------
@pytest.fixture
def closed_port() -> Iterator[str]:
    """A loopback address nothing listens on: the port is bound (so nobody else takes it
    meanwhile) but not listening, so connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"tcp://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def cluster_home(tmp_path, monkeypatch) -> Path:
    """SVFX_HOME in tmp_path, no scheduler configured, and no Prefect run allowed: a command
    refused for its --cluster must never reach the flow."""
    from tests.test_cli import _svfx_env

    _svfx_env(monkeypatch, tmp_path / "home", tmp_path)
    monkeypatch.setenv("SVFX_DASK_CONNECT_TIMEOUT_S", "1")

    def no_flow(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("the shot was handed to the flow")

    monkeypatch.setattr("cli.submit.run_shot_here", no_flow)
    monkeypatch.setattr("cli.scan.scan_with_catalog", no_flow)
    return tmp_path


def _refused_for(result: Any, address: str) -> None:
    detail = f"exit {result.exit_code}\n{result.stdout}\n{result.stderr}"
    if result.exc_info and not isinstance(result.exception, SystemExit):
        detail += "".join(traceback.format_exception(*result.exc_info))
    assert result.exit_code == 2, detail
    assert isinstance(result.exception, SystemExit), detail  # no traceback
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: the Dask scheduler at {address} did not answer within 1 s")
    assert "(Connection refused)" in line and "--cluster" in line, line
    assert not result.stdout


@pytest.mark.parametrize("option", ["--cluster", "--dask-address"])
def test_submit_to_a_closed_port_is_refused_before_anything_is_registered(
    cluster_home, closed_port, option
):
    from cli.main import app as svfx_app

    pattern = make_plate(cluster_home / "plates", frames=2)
    args = ["submit", pattern, "--shot", "demo/sq010/sh010", "--colorspace", "lin_rec709"]
    result = CliRunner().invoke(svfx_app, [*args, option, closed_port])
    _refused_for(result, closed_port)
    # refused before the catalog was even opened: no job, no database
    assert not (cluster_home / "home" / "catalog.db").exists()


def test_svfx_dask_address_at_a_closed_port_is_refused_too(cluster_home, closed_port, monkeypatch):
    from cli.main import app as svfx_app

    monkeypatch.setenv("SVFX_DASK_ADDRESS", closed_port)
    pattern = make_plate(cluster_home / "plates", frames=2)
    result = CliRunner().invoke(svfx_app, ["submit", pattern, "--shot", "demo/sq010/sh010"])
    _refused_for(result, closed_port)
    assert not (cluster_home / "home" / "catalog.db").exists()


def test_scan_and_submit_edit_to_a_closed_port_are_refused(cluster_home, closed_port):
    from cli.main import app as svfx_app
    from tests.test_submit_edit import clip, sequence_ref, write_otio

    runner = CliRunner()
    scan = runner.invoke(svfx_app, ["scan", "s3://plates/incoming", "--cluster", closed_port])
    _refused_for(scan, closed_port)

    pattern = make_plate(cluster_home / "sh010", frames=2)
    cut = write_otio(cluster_home / "cut.otio", clip("sh010", sequence_ref(pattern, 1001, 2), 0, 2))
    edit = runner.invoke(
        svfx_app,
        [
            "submit-edit", str(cut), "--show", "abc", "--seq", "sq010", "--json",
            "--passes", "matte", "--colorspace", "lin_rec709", "--cluster", closed_port,
        ],
    )  # fmt: skip
    _refused_for(edit, closed_port)
    assert not (cluster_home / "home" / "catalog.db").exists()


def test_svfx_worker_starts_its_workers_even_before_the_scheduler_answers(
    cluster_home, closed_port, monkeypatch
):
    """On a farm workers may come up before their scheduler: `svfx worker` says it did not
    answer, then starts them anyway (`dask worker` keeps trying)."""
    from cli.main import app as svfx_app

    started = []
    monkeypatch.setattr(
        workers, "run_workers", lambda address, gpus, **_kw: started.append(address) or 0
    )
    result = CliRunner().invoke(svfx_app, ["worker", closed_port, "--gpus", "0"])
    assert result.exit_code == 0, result.output
    assert started == [closed_port]
    assert f"the Dask scheduler at {closed_port} did not answer within 1 s" in result.stdout
    assert "the workers start anyway" in result.stdout and "dashboard unknown" in result.stdout


# -- where the dashboard is --------------------------------------------------------------------
def test_svfx_worker_says_the_scheduler_has_no_dashboard(loopback):
    """The module's scheduler runs with --no-dashboard: both `svfx worker`s said so."""
    for name in ("svfx-worker-a", "svfx-worker-b"):
        log = (loopback["tmp"] / f"{name}.log").read_text()
        assert f"scheduler: {loopback['address']} (" in log, log
        assert "no dashboard (the scheduler has it turned off: --no-dashboard)" in log, log


def _read_until(proc: subprocess.Popen[bytes], log: Path, marker: str) -> str:
    deadline = time.monotonic() + 120
    while marker not in (text := log.read_text()):
        assert proc.poll() is None, text
        assert time.monotonic() < deadline, text
        time.sleep(0.1)
    return text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dashboard", [True, False], ids=["dashboard", "no-dashboard"])
def test_svfx_cluster_and_svfx_worker_say_where_the_dashboard_is(tmp_path, monkeypatch, dashboard):
    """`svfx cluster` prints its scheduler's dashboard link, or "no dashboard" and why (bokeh
    missing, or --no-dashboard); `svfx worker` pointed at it reports the same, as the
    scheduler itself says (its identity, then its /status page)."""
    from distributed import Client

    from cli.main import app as svfx_app
    from flows.cluster import local_dashboard_missing

    args = ["-m", "cli", "cluster", "--workers", "1", "--gpus", "0"]
    proc = _start(
        [*args] if dashboard else [*args, "--no-dashboard"], tmp_path / "c.log", _env(tmp_path)
    )
    family: list[psutil.Process] = []
    try:
        text = _read_until(proc, tmp_path / "c.log", "Ctrl-C to stop.")
        family += _descendants(proc)
        printed = re.search(r"^scheduler: (\S+)$", text, re.M)
        assert printed, text
        address = printed[1]
        assert f"svfx submit --cluster {address} ..." in text
        missing = local_dashboard_missing()  # the same venv as the subprocess
        with Client(address, timeout="30s") as client:
            link = client.dashboard_link
        if not dashboard:
            assert "no dashboard (--no-dashboard)" in text, text
        elif missing:
            assert f"no dashboard ({missing})" in text, text
        else:
            assert f"dashboard: {link}" in text, text

        monkeypatch.setenv("SVFX_HOME", str(tmp_path / "home"))
        monkeypatch.setattr(workers, "run_workers", lambda *_a, **_kw: 0)
        result = CliRunner().invoke(svfx_app, ["worker", address, "--gpus", "0"])
        assert result.exit_code == 0, result.output
        connected = rf"^scheduler: {re.escape(address)} \(\d+ workers connected\)$"
        assert re.search(connected, result.stdout, re.M), result.stdout
        if dashboard and not missing:
            assert f"dashboard: {link}" in result.stdout
        else:  # svfx cluster turns it off rather than open a port with no dashboard on it
            assert "no dashboard (the scheduler has it turned off" in result.stdout

        proc.send_signal(signal.SIGINT)  # Ctrl-C: the cluster closes
        assert proc.wait(timeout=60) == 0, (tmp_path / "c.log").read_text()
    finally:
        _stop(proc, family)
