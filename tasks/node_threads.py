"""How a CPU node's cores are shared by sapiens-vfx's CPU workers: how many worker processes,
how many torch intra-op threads each runs, and what is left to each one's reading and
encoding. One rule, used wherever CPU workers start (`svfx cluster` and the embedded
LocalCluster, `svfx worker --gpus 0`, the Slurm recipe's `--gpus-per-job 0`) and inside each
worker (torch's threads, OpenEXR's pool), so they all take the same numbers.

**The cores** this process may use (`node_cores`) are the smallest of the limits that apply,
and the first of them on a tie: Slurm's allocation (``SLURM_CPUS_PER_TASK``, else
``SLURM_CPUS_ON_NODE``, else this node's entry of ``SLURM_JOB_CPUS_PER_NODE``), the cgroup CPU
quota (cgroup v2 ``cpu.max`` up the process's cgroup, v1 ``cpu.cfs_quota_us``: a container's
``--cpus``; rounded down, at least 1), the affinity mask (``taskset``, Slurm's binding, a
cpuset), ``os.cpu_count()``. The smallest, because each is a limit: Slurm's variables
inherited by a process bound to fewer CPUs must not win over the binding. They count logical
CPUs (two per core with SMT).

**The rule** (`plan_threads`), for ``C`` cores:

- *workers*: ``ceil(C / 16)``, so each gets 8 to 16 cores (the whole node up to 16). Every
  worker process holds its own copy of the models, so small workers multiply memory, and
  torch's matrix products on a 1024x768 tile keep 16 threads busy. Beyond 16 a second process
  overlaps one worker's serial stretches (tiling, Python between batches) with the other's
  model.
- *reading and encoding*: a worker with 12 cores or more keeps one for them, torch gets the
  rest; below 12 they share the torch threads' cores. The host's part of a frame is small
  beside the model's: a kept core mostly waits, while sharing one stalls every torch thread
  at the barrier after each operation whenever a writer holds a core. 12 is where keeping
  one starts to pay for the models the farm runs (docs/design/host-threads.md).
- *OpenEXR's pool* (``SVFX_EXR_THREADS``): the kept core (1), else 0: each EXR is encoded on
  its own writer thread, beside the model.

**Overrides**: ``SVFX_CPU_WORKERS``, ``SVFX_TORCH_THREADS``, ``SVFX_EXR_THREADS`` (and the
options of the commands that start workers, which win over them); an override leaves the
rule to choose the rest. A plan whose threads, workers x (torch + EXR threads), are more than
the cores is refused (`ThreadPlanError`, exit 2): oversubscribed torch threads wait on each
other at every barrier. The starters hand the plan to their workers in those variables
(`ThreadPlan.environment`), so a worker process reads back the plan it was started with.
No torch here: the CLI, the flows and the Slurm recipe import it to plan and print.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from core.errors import SvfxError

CORES_PER_WORKER = 16  # a worker's share at most: more cores, more workers
IO_CORE_FROM = 12  # a worker with this many cores keeps one for reading and encoding

WORKERS_ENV = "SVFX_CPU_WORKERS"
TORCH_ENV = "SVFX_TORCH_THREADS"
EXR_ENV = "SVFX_EXR_THREADS"

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


class ThreadPlanError(SvfxError, ValueError):
    """A thread count that is not a count, or a plan with more threads than the cores; the
    message names the numbers and the cores."""


@dataclass(frozen=True)
class NodeCores:
    """How many CPUs this process may use, and which limit said so."""

    count: int
    source: str  # "Slurm allocation, SLURM_CPUS_PER_TASK", "affinity mask", ...


@dataclass(frozen=True)
class ThreadPlan:
    """A CPU node's plan: ``workers`` processes, each running ``torch_threads`` intra-op
    threads and an OpenEXR pool of ``exr_threads`` (0: encoded on the writer threads)."""

    cores: NodeCores
    workers: int
    torch_threads: int
    exr_threads: int

    def describe(self) -> str:
        """One line: the numbers and where the core count came from."""
        if self.exr_threads:
            each = " each" if self.workers != 1 else ""
            io = f"{_n(self.exr_threads, 'core')}{each} for reading and encoding"
        else:
            io = "reading and encoding share their cores"
        return (
            f"CPU node: {_n(self.cores.count, 'core')} ({self.cores.source}): "
            f"{_n(self.workers, 'worker')} x {_n(self.torch_threads, 'torch thread')}, {io}"
        )

    def environment(self) -> dict[str, str]:
        """What a worker process is started with, so that it reads this plan back (and torch
        starts with its threads: OMP_NUM_THREADS is read when torch is imported)."""
        return {
            WORKERS_ENV: str(self.workers),
            TORCH_ENV: str(self.torch_threads),
            EXR_ENV: str(self.exr_threads),
            "OMP_NUM_THREADS": str(self.torch_threads),
        }


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


# -- the cores ---------------------------------------------------------------------------------
def slurm_cpus(environ: Mapping[str, str]) -> NodeCores | None:
    """Slurm's allocation to this task (or this node), from the job's environment."""
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return NodeCores(int(value), f"Slurm allocation, {name}")
    per_node = _expand_cpus_per_node(environ.get("SLURM_JOB_CPUS_PER_NODE", ""))
    if per_node:
        node = environ.get("SLURM_NODEID", "0").strip()
        index = int(node) if node.isdigit() and int(node) < len(per_node) else 0
        return NodeCores(per_node[index], "Slurm allocation, SLURM_JOB_CPUS_PER_NODE")
    return None


def _expand_cpus_per_node(text: str) -> list[int]:
    """``72(x2),36`` -> [72, 72, 36]; [] when it is not that form."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match or int(match[1]) == 0:
            return []
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


# Not dask.system.cpu_count or loky's: own cgroup only, a quota rounded up; psutil reads none.
def cgroup_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> NodeCores | None:
    """The CPU quota of this process's cgroup and its ancestors (the smallest), rounded down
    (a quota of 1.5 CPUs run on 2 threads is throttled), at least 1."""
    quotas: list[float] = []
    own = _own_cgroup_v2(proc_cgroup)
    if own is not None:
        folder = root / own.strip("/") if own.strip("/") else root
        while True:
            quota = _read_quota_v2(folder / "cpu.max")
            if quota is not None:
                quotas.append(quota)
            if folder == root or root not in folder.parents:
                break
            folder = folder.parent
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        quota = _read_quota_v1(v1)
        if quota is not None:
            quotas.append(quota)
    if not quotas:
        return None
    return NodeCores(max(1, math.floor(min(quotas))), "cgroup CPU quota")


def _own_cgroup_v2(proc_cgroup: Path) -> str | None:
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    return None


def _read_quota_v2(path: Path) -> float | None:
    """``cpu.max``: "max 100000" (no quota) or "QUOTA PERIOD" in microseconds."""
    try:
        quota, _, period = path.read_text().strip().partition(" ")
    except OSError:
        return None
    if quota == "max" or not quota.isdigit() or not period.strip().isdigit():
        return None
    return int(quota) / int(period) if int(period) else None


def _read_quota_v1(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def affinity_cpus() -> NodeCores | None:
    if not hasattr(os, "sched_getaffinity"):
        return None
    return NodeCores(len(os.sched_getaffinity(0)), "affinity mask")


def node_cores(
    environ: Mapping[str, str] | None = None,
    *,
    cgroup_root: Path = CGROUP_ROOT,
    proc_cgroup: Path = PROC_CGROUP,
    affinity: NodeCores | None = None,
) -> NodeCores:
    """The cores this process may use: the smallest limit, the first in the module's order
    on a tie (``affinity``: the mask's answer, for tests)."""
    environ = os.environ if environ is None else environ
    found = [
        slurm_cpus(environ),
        cgroup_cpus(cgroup_root, proc_cgroup),
        affinity or affinity_cpus(),
        NodeCores(os.cpu_count() or 1, "os.cpu_count()"),
    ]
    return min((f for f in found if f is not None), key=lambda f: f.count)  # first on a tie


# -- the plan ----------------------------------------------------------------------------------
def plan_threads(
    cores: NodeCores,
    *,
    workers: int | None = None,
    torch_threads: int | None = None,
    exr_threads: int | None = None,
) -> ThreadPlan:
    """The rule of the module's docstring for these cores; a number given is kept and the
    rule chooses the rest. ThreadPlanError when the threads are more than the cores."""
    count = cores.count
    where = f"{_n(count, 'core')} ({cores.source})"
    if workers is None:
        workers = math.ceil(count / CORES_PER_WORKER)
    if workers < 1:
        raise ThreadPlanError(f"{workers} CPU workers: at least 1")
    if workers > count:
        raise ThreadPlanError(f"{_n(workers, 'CPU worker')} are more than {where}")
    share = count // workers
    kept = 1 if share >= IO_CORE_FROM else 0
    if torch_threads is None:
        torch_threads = max(1, share - (exr_threads if exr_threads is not None else kept))
    if exr_threads is None:
        exr_threads = max(0, min(kept, share - torch_threads))
    if torch_threads < 1:
        raise ThreadPlanError(f"{torch_threads} torch threads: at least 1")
    if exr_threads < 0:
        raise ThreadPlanError(f"{exr_threads} EXR threads: at least 0")
    asked = workers * (torch_threads + exr_threads)
    if asked > count:
        each = (
            f"({torch_threads} torch + {exr_threads} EXR threads)"
            if exr_threads
            else _n(torch_threads, "torch thread")
        )
        raise ThreadPlanError(
            f"{_n(workers, 'CPU worker')} x {each} = {asked} threads, more than {where}"
        )
    return ThreadPlan(cores, workers, torch_threads, exr_threads)


def node_plan(
    environ: Mapping[str, str] | None = None,
    *,
    workers: int | None = None,
    torch_threads: int | None = None,
    exr_threads: int | None = None,
    cores: NodeCores | None = None,
) -> ThreadPlan:
    """This node's plan: the numbers given (a command's options), else the environment's
    overrides, else the rule, for `node_cores` (or ``cores``)."""
    environ = os.environ if environ is None else environ
    return plan_threads(
        cores or node_cores(environ),
        workers=workers if workers is not None else env_count(environ, WORKERS_ENV),
        torch_threads=torch_threads if torch_threads is not None else env_count(environ, TORCH_ENV),
        exr_threads=exr_threads if exr_threads is not None else env_count(environ, EXR_ENV),
    )


def env_count(environ: Mapping[str, str], name: str) -> int | None:
    """A whole number from the environment; None when unset or empty."""
    value = environ.get(name, "").strip()
    if not value:
        return None
    if not re.fullmatch(r"-?\d+", value):
        raise ThreadPlanError(f"{name}={value!r} is not a whole number of threads")
    return int(value)


# -- inside a worker ---------------------------------------------------------------------------
def worker_torch_threads(on_cpu: bool, environ: Mapping[str, str] | None = None) -> int | None:
    """The torch threads this worker process runs: a CPU worker its plan's; a GPU worker (its
    model is not on the CPU) only ``SVFX_TORCH_THREADS`` when set, else None (torch as is)."""
    environ = os.environ if environ is None else environ
    if on_cpu:
        return node_plan(environ).torch_threads
    return _at_most_the_cores(environ, TORCH_ENV, least=1)


def worker_exr_threads(on_cpu: bool, environ: Mapping[str, str] | None = None) -> int:
    """OpenEXR's pool in this worker process: a CPU worker's plan; a GPU worker's every core
    (its host has little else to do), unless ``SVFX_EXR_THREADS`` says."""
    environ = os.environ if environ is None else environ
    if on_cpu:
        return node_plan(environ).exr_threads
    explicit = _at_most_the_cores(environ, EXR_ENV, least=0)
    return node_cores(environ).count if explicit is None else explicit


def _at_most_the_cores(environ: Mapping[str, str], name: str, *, least: int) -> int | None:
    value = env_count(environ, name)
    if value is None:
        return None
    if value < least:
        raise ThreadPlanError(f"{name}={value}: at least {least}")
    cores = node_cores(environ)
    if value > cores.count:
        raise ThreadPlanError(
            f"{name}={value} is more than {_n(cores.count, 'core')} ({cores.source})"
        )
    return value
