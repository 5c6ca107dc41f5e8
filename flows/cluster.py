"""Connecting to Dask: an existing scheduler (``SVFX_DASK_ADDRESS``), or a LocalCluster.

GPU workers carry the Dask resource ``GPU=1`` (one worker per GPU, one thread each); chunks
are submitted with ``resources={"GPU": 1}`` when such workers exist. A CPU-only LocalCluster
has no GPU resource: each worker process is one model slot, and torch gets an even share of
the cores so the workers do not fight over them.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any

from distributed import Client, LocalCluster

from schemas.settings import Settings

from .refusals import ClusterError

CONNECT_TIMEOUT_S = 30


def local_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install: run on the CPU, and say so in the log
        return 0


def start_local_cluster(
    n_workers: int | None = None, *, gpus: int | None = None, dashboard: bool = False
) -> LocalCluster:
    """A LocalCluster: one worker per GPU (with GPU=1) when GPUs exist, else CPU workers."""
    gpus = local_gpu_count() if gpus is None else gpus
    dashboard_address = ":8787" if dashboard else None
    if gpus > 0:
        try:
            from dask_cuda import LocalCUDACluster

            return LocalCUDACluster(
                n_workers=gpus,
                threads_per_worker=1,
                resources={"GPU": 1},
                dashboard_address=dashboard_address,
            )
        except ImportError:
            pass  # without dask-cuda: one plain worker per GPU, pinned below
    workers = gpus or n_workers or 2
    cores = os.cpu_count() or 1
    threads = max(1, cores // workers)
    env = {"SVFX_TORCH_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    cluster = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=dashboard_address,
        # without a dashboard the scheduler still serves /health on a port, 8787 unless told:
        # a free one, so two runs at once never warn "port 8787 is already in use"
        scheduler_kwargs=None if dashboard else {"dashboard_address": "127.0.0.1:0"},
        resources={"GPU": 1} if gpus else None,
        env=env,
        silence_logs=logging.WARNING,
    )
    return cluster


def gpu_slots(client: Client) -> int:
    """How many workers declare a GPU resource (0 on CPU-only clusters)."""
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    return sum(1 for w in workers if w.get("resources", {}).get("GPU", 0) >= 1)


def worker_count(client: Client) -> int:
    return len(client.scheduler_info(n_workers=-1)["workers"])


@contextmanager
def dask_client(settings: Settings, address: str | None = None) -> Any:
    """A client to the configured scheduler, or to a LocalCluster started (and closed) here."""
    address = address or settings.dask_address
    if address:
        try:
            client = Client(address, timeout=f"{CONNECT_TIMEOUT_S}s")
        except (OSError, TimeoutError) as exc:
            raise ClusterError(
                f"the Dask scheduler at {address} did not answer within {CONNECT_TIMEOUT_S} s "
                f"({exc}); start it (`svfx cluster`) or fix SVFX_DASK_ADDRESS / --dask-address"
            ) from None
        try:
            yield client
        finally:
            client.close()
        return
    cluster = start_local_cluster(settings.local_workers)
    client = Client(cluster)
    try:
        yield client
    finally:
        with _closing_quietly():
            client.close()
            cluster.close()


@contextmanager
def _closing_quietly() -> Any:
    """Shutting down a LocalCluster we started, comms closing under a message in flight are
    expected (CommClosedError, StreamClosedError) and logged by distributed and asyncio with
    tracebacks that say nothing to the user: hold those loggers to CRITICAL meanwhile."""
    names = ("distributed", "asyncio", "tornado")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
