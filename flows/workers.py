"""`svfx worker`: GPU workers for an existing scheduler. One `dask worker` process per GPU,
each seeing only its GPU (``CUDA_VISIBLE_DEVICES``) and declaring ``GPU=1``, one thread, so
two chunks never share a CUDA context. With no GPU (``--gpus 0``) one CPU worker without the
GPU resource. The processes are plain `dask worker` (nanny-managed: restarted if they die)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from .cluster import local_gpu_count


def worker_commands(
    address: str, gpus: str, *, nthreads: int = 1, memory_limit: str = "auto"
) -> list[tuple[list[str], dict[str, str]]]:
    """The command and extra environment of each worker process to start."""
    count = local_gpu_count() if gpus == "auto" else int(gpus)
    base = [
        sys.executable,
        "-m",
        "distributed.cli.dask_worker",
        address,
        "--nthreads",
        str(nthreads),
        "--memory-limit",
        memory_limit,
    ]
    if count == 0:
        return [([*base, "--name", f"cpu-{os.getpid()}"], {})]
    return [
        (
            [*base, "--resources", "GPU=1", "--name", f"gpu{i}-{os.uname().nodename}"],
            {"CUDA_VISIBLE_DEVICES": str(i)},
        )
        for i in range(count)
    ]


def run_workers(address: str, gpus: str, *, nthreads: int = 1, memory_limit: str = "auto") -> int:
    procs = [
        subprocess.Popen(cmd, env={**os.environ, **env})
        for cmd, env in worker_commands(address, gpus, nthreads=nthreads, memory_limit=memory_limit)
    ]
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.send_signal(signal.SIGINT)
        codes = [p.wait() for p in procs]
    return max(codes, default=0)
