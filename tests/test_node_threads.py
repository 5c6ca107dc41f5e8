"""A CPU node's thread plan (`tasks.node_threads`): the cores from each source (Slurm's
variables, the cgroup quota, the affinity mask, os.cpu_count), the rule's plan for a few node
sizes, the overrides, the refusal of more threads than cores (and by `svfx worker` and
`svfx cluster`: one line, exit 2), the line `svfx worker --gpus 0` prints and the worker
processes it starts with their plan, and what a worker process reads back."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows import workers
from flows.cluster import NANNY_SPAWN_ENV_VAR
from tasks import node_threads
from tasks.node_threads import (
    NodeCores,
    ThreadPlanError,
    cgroup_cpus,
    node_cores,
    node_plan,
    plan_threads,
    slurm_cpus,
    worker_exr_threads,
    worker_torch_threads,
)

ADDRESS = "tcp://scheduler.invalid:8786"
PLAN_ENV = ("SVFX_CPU_WORKERS", "SVFX_TORCH_THREADS", "SVFX_EXR_THREADS")


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*PLAN_ENV, NANNY_SPAWN_ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("SLURM_"):
            monkeypatch.delenv(name)


def _node(monkeypatch: pytest.MonkeyPatch, count: int, source: str = "affinity mask") -> None:
    """This process sees ``count`` cores."""
    monkeypatch.setattr(node_threads, "node_cores", lambda environ=None: NodeCores(count, source))


# -- the cores -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"SLURM_CPUS_PER_TASK": "12", "SLURM_CPUS_ON_NODE": "48"}, (12, "SLURM_CPUS_PER_TASK")),
        ({"SLURM_CPUS_ON_NODE": "48", "SLURM_JOB_CPUS_PER_NODE": "96"}, (48, "SLURM_CPUS_ON_NODE")),
        ({"SLURM_JOB_CPUS_PER_NODE": "72(x2),36", "SLURM_NODEID": "2"}, (36, "PER_NODE")),
        ({"SLURM_JOB_CPUS_PER_NODE": "72(x2),36", "SLURM_NODEID": "1"}, (72, "PER_NODE")),
        ({"SLURM_JOB_CPUS_PER_NODE": "16"}, (16, "SLURM_JOB_CPUS_PER_NODE")),
    ],
)
def test_slurm_allocation(environ: dict[str, str], expected: tuple[int, str]) -> None:
    found = slurm_cpus(environ)
    assert found is not None
    assert found.count == expected[0]
    assert found.source.startswith("Slurm allocation, ") and expected[1] in found.source


@pytest.mark.parametrize(
    "environ", [{}, {"SLURM_CPUS_PER_TASK": ""}, {"SLURM_JOB_CPUS_PER_NODE": "lots"}]
)
def test_no_slurm_allocation(environ: dict[str, str]) -> None:
    assert slurm_cpus(environ) is None


def _cgroup(tmp_path: Path, own: str, quotas: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for folder, text in quotas.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "cpu.max").write_text(text + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{own}\n")
    return root, proc


def test_cgroup_v2_quota_is_the_smallest_up_the_tree_rounded_down(tmp_path: Path) -> None:
    root, proc = _cgroup(
        tmp_path,
        "/kubepods/pod1/box",
        {
            ".": "max 100000",
            "kubepods": "800000 100000",
            "kubepods/pod1": "350000 100000",  # 3.5 CPUs: 3 threads, never throttled
            "kubepods/pod1/box": "max 100000",
        },
    )
    assert cgroup_cpus(root, proc) == NodeCores(3, "cgroup CPU quota")


def test_a_container_sees_its_own_cgroup_as_the_root(tmp_path: Path) -> None:
    root, proc = _cgroup(tmp_path, "/", {".": "200000 100000"})
    assert cgroup_cpus(root, proc) == NodeCores(2, "cgroup CPU quota")
    root, proc = _cgroup(tmp_path / "small", "/", {".": "50000 100000"})  # half a CPU: 1
    assert cgroup_cpus(root, proc) == NodeCores(1, "cgroup CPU quota")


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    folder = tmp_path / "cgroup" / "cpu,cpuacct"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("400000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(tmp_path / "cgroup", tmp_path / "none") == NodeCores(4, "cgroup CPU quota")
    (folder / "cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert cgroup_cpus(tmp_path / "cgroup", tmp_path / "none") is None


def test_no_quota(tmp_path: Path) -> None:
    root, proc = _cgroup(tmp_path, "/user.slice", {".": "max 100000", "user.slice": "max 100000"})
    assert cgroup_cpus(root, proc) is None
    assert cgroup_cpus(tmp_path / "absent", tmp_path / "absent-too") is None


def test_node_cores_takes_the_smallest_limit_and_the_first_on_a_tie(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node_threads.os, "cpu_count", lambda: 256)
    root, proc = _cgroup(tmp_path, "/", {".": "3200000 100000"})  # 32 CPUs
    mask = NodeCores(64, "affinity mask")

    def cores(environ: dict[str, str], root: Path = root) -> NodeCores:
        return node_cores(environ, cgroup_root=root, proc_cgroup=proc, affinity=mask)

    assert cores({"SLURM_CPUS_PER_TASK": "16"}).source == "Slurm allocation, SLURM_CPUS_PER_TASK"
    assert cores({"SLURM_CPUS_PER_TASK": "32"}).source.startswith("Slurm allocation")  # a tie
    assert cores({}) == NodeCores(32, "cgroup CPU quota")
    # Slurm's variables in a process bound to fewer CPUs: the binding wins
    assert cores({"SLURM_CPUS_PER_TASK": "128"}) == NodeCores(32, "cgroup CPU quota")
    assert cores({}, tmp_path / "no-cgroup") == mask
    monkeypatch.setattr(node_threads.os, "cpu_count", lambda: 8)
    assert cores({}, tmp_path / "no-cgroup") == NodeCores(8, "os.cpu_count()")


def test_this_process_cores_are_its_affinity_mask_here() -> None:
    """This machine: no Slurm, no quota; the mask is the process's own."""
    found = node_cores({})
    assert found.count == min(len(os.sched_getaffinity(0)), os.cpu_count() or 1)


# -- the plan --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cores", "plan"),
    [
        (1, (1, 1, 0)),
        (2, (1, 2, 0)),
        (8, (1, 8, 0)),
        (11, (1, 11, 0)),
        (12, (1, 11, 1)),
        (16, (1, 15, 1)),
        (17, (2, 8, 0)),
        (24, (2, 11, 1)),
        (32, (2, 15, 1)),
        (64, (4, 15, 1)),
        (96, (6, 15, 1)),
        (100, (7, 13, 1)),
    ],
)
def test_the_rule(cores: int, plan: tuple[int, int, int]) -> None:
    got = plan_threads(NodeCores(cores, "test"))
    assert (got.workers, got.torch_threads, got.exr_threads) == plan
    assert got.workers * (got.torch_threads + got.exr_threads) <= cores


def test_the_plan_line_and_environment() -> None:
    plan = plan_threads(NodeCores(32, "Slurm allocation, SLURM_CPUS_PER_TASK"))
    assert plan.describe() == (
        "CPU node: 32 cores (Slurm allocation, SLURM_CPUS_PER_TASK): 2 workers x 15 torch "
        "threads, 1 core each for reading and encoding"
    )
    assert plan.environment() == {
        "SVFX_CPU_WORKERS": "2",
        "SVFX_TORCH_THREADS": "15",
        "SVFX_EXR_THREADS": "1",
        "OMP_NUM_THREADS": "15",
    }
    small = plan_threads(NodeCores(1, "affinity mask"))
    assert small.describe() == (
        "CPU node: 1 core (affinity mask): 1 worker x 1 torch thread, reading and encoding "
        "share their cores"
    )
    # a worker process started with a plan's environment reads the same plan back
    assert node_plan(plan.environment(), cores=plan.cores) == plan


def test_an_override_keeps_its_number_and_the_rule_chooses_the_rest() -> None:
    cores = NodeCores(32, "test")

    def numbers(environ: dict[str, str], **given: int) -> tuple[int, int, int]:
        plan = node_plan(environ, cores=cores, **given)
        return plan.workers, plan.torch_threads, plan.exr_threads

    assert numbers({"SVFX_CPU_WORKERS": "4"}) == (4, 8, 0)
    assert numbers({"SVFX_CPU_WORKERS": "1"}) == (1, 31, 1)
    assert numbers({"SVFX_TORCH_THREADS": "16"}) == (2, 16, 0)  # no core left to keep
    assert numbers({"SVFX_TORCH_THREADS": "12"}) == (2, 12, 1)
    assert numbers({"SVFX_EXR_THREADS": "4"}) == (2, 12, 4)
    assert numbers({"SVFX_EXR_THREADS": "0"}) == (2, 16, 0)
    assert numbers({"SVFX_CPU_WORKERS": " 3 ", "SVFX_TORCH_THREADS": ""}) == (3, 10, 0)
    # a command's option wins over the environment
    assert numbers({"SVFX_CPU_WORKERS": "4"}, workers=8) == (8, 4, 0)
    assert numbers({"SVFX_TORCH_THREADS": "4"}, torch_threads=2) == (2, 2, 1)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"torch_threads": 16, "workers": 4},
            "4 CPU workers x 16 torch threads = 64 threads, more than 16 cores (test)",
        ),
        (
            {"torch_threads": 17},
            "1 CPU worker x 17 torch threads = 17 threads, more than 16 cores (test)",
        ),
        (
            {"torch_threads": 15, "exr_threads": 2},
            "1 CPU worker x (15 torch + 2 EXR threads) = 17 threads, more than 16 cores (test)",
        ),
        ({"workers": 17}, "17 CPU workers are more than 16 cores (test)"),
        ({"workers": 0}, "0 CPU workers: at least 1"),
        ({"torch_threads": 0}, "0 torch threads: at least 1"),
        ({"exr_threads": -1}, "-1 EXR threads: at least 0"),
    ],
)
def test_more_threads_than_cores_are_refused(given: dict[str, int], message: str) -> None:
    with pytest.raises(ThreadPlanError) as refused:
        plan_threads(NodeCores(16, "test"), **given)
    assert str(refused.value) == message
    assert refused.value.exit_code == 2


def test_an_override_that_is_not_a_count_is_refused_naming_it() -> None:
    with pytest.raises(ThreadPlanError, match=r"^SVFX_TORCH_THREADS='eight' is not a whole"):
        node_plan({"SVFX_TORCH_THREADS": "eight"}, cores=NodeCores(8, "test"))


# -- inside a worker process -----------------------------------------------------------------
def test_a_cpu_worker_reads_its_plan_and_a_gpu_worker_only_what_it_is_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _node(monkeypatch, 32)
    started = plan_threads(NodeCores(32, "affinity mask"), workers=4).environment()
    assert worker_torch_threads(True, started) == 8
    assert worker_exr_threads(True, started) == 0
    assert worker_torch_threads(True, {}) == 15  # a plain `dask worker`: the rule's plan
    assert worker_exr_threads(True, {}) == 1
    assert worker_torch_threads(False, {}) is None  # a GPU worker: torch as it is
    assert worker_exr_threads(False, {}) == 32  # its host has little else to do
    assert worker_torch_threads(False, {"SVFX_TORCH_THREADS": "4"}) == 4
    assert worker_exr_threads(False, {"SVFX_EXR_THREADS": "6"}) == 6
    with pytest.raises(ThreadPlanError, match=r"^SVFX_EXR_THREADS=64 is more than 32 cores"):
        worker_exr_threads(False, {"SVFX_EXR_THREADS": "64"})
    with pytest.raises(ThreadPlanError, match=r"^SVFX_TORCH_THREADS=0: at least 1$"):
        worker_torch_threads(False, {"SVFX_TORCH_THREADS": "0"})


# -- the worker processes `svfx worker --gpus 0` starts ---------------------------------------
def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_cpu_worker_commands_carry_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "local_gpu_count", lambda: pytest.fail("looked for GPUs"))
    plan = plan_threads(NodeCores(48, "test"))
    commands = workers.worker_commands(ADDRESS, "0", plan=plan)
    assert len(commands) == plan.workers == 3
    names = [_flag(cmd, "--name") for cmd, _env in commands]
    assert len(set(names)) == 3 and all(str(name).startswith("cpu") for name in names)
    for cmd, env in commands:
        assert "--resources" not in cmd
        assert _flag(cmd, "--nthreads") == "1"  # one chunk at a time: one model slot
        assert _flag(cmd, "--memory-limit") == "0.3333"  # the node's memory, a third each
        assert {k: env[k] for k in plan.environment()} == plan.environment()
        # the nanny hands them on (Dask's own OMP_NUM_THREADS=1 does not win)
        assert "'SVFX_TORCH_THREADS': '15'" in env[NANNY_SPAWN_ENV_VAR]
        assert "'OMP_NUM_THREADS': '15'" in env[NANNY_SPAWN_ENV_VAR]
    _node(monkeypatch, 2)
    ((cmd, env),) = workers.worker_commands(ADDRESS, "0", memory_limit="8GB")  # the node's
    assert _flag(cmd, "--memory-limit") == "8GB" and env["SVFX_TORCH_THREADS"] == "2"


# -- the commands ----------------------------------------------------------------------------
@pytest.fixture
def svfx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    from cli.main import app

    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("SVFX_DASK_CONNECT_TIMEOUT_S", "0.2")
    monkeypatch.setattr(workers, "local_gpu_count", lambda: 0)

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(app, list(args))

    return invoke


def test_svfx_worker_prints_the_plan_and_starts_its_workers(
    svfx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _node(monkeypatch, 16, "Slurm allocation, SLURM_CPUS_PER_TASK")
    started: list[Any] = []
    monkeypatch.setattr(
        workers, "run_workers", lambda address, gpus, **kw: started.append(kw["plan"]) or 0
    )
    result = svfx("worker", ADDRESS, "--gpus", "0")
    assert result.exit_code == 0, result.output
    line = (
        "CPU node: 16 cores (Slurm allocation, SLURM_CPUS_PER_TASK): 1 worker x 15 torch "
        "threads, 1 core for reading and encoding"
    )
    assert result.stdout.splitlines()[0] == line
    (plan,) = started
    assert (plan.workers, plan.torch_threads, plan.exr_threads) == (1, 15, 1)

    monkeypatch.setenv("SVFX_TORCH_THREADS", "4")  # the option wins over the environment
    result = svfx("worker", ADDRESS, "--gpus", "0", "--workers", "2", "--torch-threads", "7")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].endswith(
        ": 2 workers x 7 torch threads, reading and encoding share their cores"
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--torch-threads", "32"],
            {},
            "error: 1 CPU worker x 32 torch threads = 32 threads, more than 16 cores "
            "(affinity mask)",
        ),
        (
            [],
            {"SVFX_CPU_WORKERS": "4", "SVFX_TORCH_THREADS": "8"},
            "error: 4 CPU workers x 8 torch threads = 32 threads, more than 16 cores "
            "(affinity mask)",
        ),
        (["--workers", "20"], {}, "error: 20 CPU workers are more than 16 cores (affinity mask)"),
        ([], {"SVFX_EXR_THREADS": "x"}, "error: SVFX_EXR_THREADS='x' is not a whole number"),
    ],
)
def test_svfx_worker_refuses_more_threads_than_cores_in_one_line(
    svfx: Any,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    _node(monkeypatch, 16)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(workers, "run_workers", lambda *a, **kw: pytest.fail("started"))
    monkeypatch.setattr(workers, "about_scheduler", lambda *a: pytest.fail("asked"))
    result = svfx("worker", ADDRESS, "--gpus", "0", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(message), result.stderr


def test_svfx_worker_refuses_cpu_thread_options_for_gpu_workers(
    svfx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(workers, "run_workers", lambda *a, **kw: pytest.fail("started"))
    result = svfx("worker", ADDRESS, "--gpus", "1", "--torch-threads", "4")
    assert result.exit_code == 2, result.output
    assert "are for CPU workers (--gpus 0)" in result.stderr


def test_svfx_cluster_refuses_more_threads_than_cores(
    svfx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _node(monkeypatch, 2)
    monkeypatch.setenv("SVFX_TORCH_THREADS", "3")
    monkeypatch.setattr(
        "flows.cluster.start_local_cluster", lambda *a, **kw: pytest.fail("started")
    )
    result = svfx("cluster", "--gpus", "0")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        "error: 1 CPU worker x 3 torch threads = 3 threads, more than 2 cores (affinity mask)"
    )


def test_a_cpu_worker_process_sets_torch_and_openexr_from_its_plan(tmp_path: Path) -> None:
    """What the chunk worker does with the plan it was started with, in a process of its own
    (both settings are per process): torch's threads (`tasks.model_cache`) and OpenEXR's pool
    (`tasks.chunk_worker.size_encoder_threads`)."""
    import subprocess
    import sys

    code = (
        "import torch, OpenEXR\n"
        "from tasks.model_cache import _limit_threads\n"
        "from tasks.chunk_worker import size_encoder_threads\n"
        "_limit_threads()\n"
        "print(torch.get_num_threads(), size_encoder_threads(on_cpu=True),"
        " OpenEXR.global_thread_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SVFX_", "SLURM_"))}
    repo = str(Path(__file__).resolve().parents[1])
    env.update(
        PYTHONPATH=os.pathsep.join([repo, env.get("PYTHONPATH", "")]),
        SVFX_DEVICE="cpu",
        SVFX_CPU_WORKERS="1",
        SVFX_TORCH_THREADS="1",  # within this machine's cores, whatever it has
        SVFX_EXR_THREADS="1",
        OMP_NUM_THREADS="3",  # not what torch ends with: the plan is
    )
    if node_cores().count < 2:
        env["SVFX_EXR_THREADS"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    exr = env["SVFX_EXR_THREADS"]
    assert done.stdout.split() == ["1", exr, exr]
