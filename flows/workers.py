"""`svfx worker`: workers for an existing scheduler. One `dask worker` process per GPU,
each seeing only its GPU (``CUDA_VISIBLE_DEVICES``) and declaring ``GPU=1``, one process per
GPU, so one CUDA context each, with `flows.cluster.CHUNKS_PER_GPU` threads: chunks at once,
whose model stages take the device in turn (`tasks.chunk_worker`). With no GPU (``--gpus 0``)
the CPU workers of the node's plan (`tasks.node_threads`: how many, and each one's torch and
EXR threads), without the GPU resource. The processes are plain `dask worker` (nanny-managed:
restarted if they die); SIGINT and SIGTERM (docker stop, Kubernetes, Slurm) are passed on and
waited for."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from types import FrameType

from tasks.node_threads import ThreadPlan, node_plan

from .cluster import (
    CHUNKS_PER_GPU,
    local_gpu_count,
    scheduler_dashboard,
    scheduler_identity,
    worker_command_env,
)
from .refusals import ClusterError


def visible_gpus(gpus: str) -> list[str]:
    """The GPU ids to give one worker each, honouring a CUDA_VISIBLE_DEVICES already set
    (Slurm without device cgroups, or a user picking GPUs)."""
    if gpus != "auto" and not gpus.isdigit():
        raise ValueError(f"--gpus takes auto, a count, or 0 for one CPU worker; got {gpus!r}")
    if gpus != "auto" and int(gpus) == 0:
        return []  # one CPU worker: no need to look for GPUs
    already = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    already = [d for d in already if d]
    # the GPUs that exist, not as many ids as asked for: a worker declaring GPU=1 must have one
    pool = already or [str(i) for i in range(local_gpu_count())]
    count = len(pool) if gpus == "auto" else int(gpus)
    if count > len(pool):
        raise ValueError(f"asked for {count} GPU workers but only {len(pool)} GPUs are visible")
    return pool[:count]


def worker_commands(
    address: str,
    gpus: str,
    *,
    plan: ThreadPlan | None = None,
    nthreads: int = 1,
    memory_limit: str = "auto",
) -> list[tuple[list[str], dict[str, str]]]:
    """The command and extra environment of each worker process to start: one per GPU, or
    with none the CPU workers of ``plan`` (the node's, `tasks.node_threads`, when None), each
    with its threads in its environment. ``memory_limit`` "auto" is the node's memory split
    evenly among them (Dask's own "auto" would give each nthreads/cores of it). A GPU worker
    runs at least `CHUNKS_PER_GPU` threads."""
    devices = visible_gpus(gpus)
    if not devices:
        plan = plan or node_plan()
    count = len(devices) or (plan.workers if plan else 1)
    if memory_limit == "auto":
        memory_limit = f"{1 / count:.4f}"  # a fraction of the node's memory (Dask: <= 1)
    threads = nthreads if plan is not None else max(nthreads, CHUNKS_PER_GPU)
    base = [
        sys.executable,
        "-m",
        "distributed.cli.dask_worker",
        address,
        "--nthreads",
        str(threads),
        "--memory-limit",
        memory_limit,
    ]
    # unique per host and launch (two Slurm jobs on one node must not clash)
    tag = f"{socket.gethostname()}-{os.environ.get('SLURM_JOB_ID') or os.getpid()}"
    if plan is not None:
        env = worker_command_env(plan.environment())
        return [([*base, "--name", f"cpu{index}-{tag}"], env) for index in range(count)]
    return [
        (
            [*base, "--resources", "GPU=1", "--name", f"gpu{device}-{tag}"],
            {**worker_command_env(), "CUDA_VISIBLE_DEVICES": device},
        )
        for device in devices
    ]


def about_scheduler(address: str, timeout_s: float) -> list[str]:
    """What `svfx worker` says before it starts: the scheduler as it reports itself and where
    its dashboard is, or that it did not answer. The workers start either way: `dask worker`
    keeps trying to connect, and on a farm workers may come up before their scheduler."""
    hint = "the workers start anyway and keep trying to connect; dashboard unknown"
    try:
        identity = scheduler_identity(address, timeout_s, hint=hint)
    except ClusterError as exc:
        return [f"scheduler: {exc}"]
    workers = identity.get("n_workers", 0)
    return [
        f"scheduler: {address} ({workers} workers connected)",
        scheduler_dashboard(address, identity, timeout_s),
    ]


def run_workers(
    address: str,
    gpus: str,
    *,
    plan: ThreadPlan | None = None,
    nthreads: int = 1,
    memory_limit: str = "auto",
) -> int:
    commands = worker_commands(
        address, gpus, plan=plan, nthreads=nthreads, memory_limit=memory_limit
    )
    # Each worker in its own process group: a Ctrl-C in the terminal then reaches them once,
    # through `forward`. A second SIGINT makes `dask worker` abort instead of closing cleanly.
    procs = [
        subprocess.Popen(cmd, env={**os.environ, **env}, process_group=0) for cmd, env in commands
    ]

    def forward(signum: int, _frame: FrameType | None) -> None:
        # SIGHUP (the terminal closed) no longer reaches the workers' groups: close them
        sent = signal.SIGTERM if signum == signal.SIGHUP else signum
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(sent)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    return max((proc.wait() for proc in procs), default=0)
