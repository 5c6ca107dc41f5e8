"""Worker processes start with the platform's allocator settings, and a worker that Dask
paused for memory it had freed but kept resumes (`flows.worker_memory`).

Real LocalClusters: glibc reads its MALLOC_* settings when a process starts, so the test
reads each worker's environment as the process started (/proc/<pid>/environ), not
os.environ, which Dask's `env=` fills in only once the process runs.
"""

from __future__ import annotations

import ast
import os
import sys
import time

import dask
import pytest
from distributed import Client, LocalCluster

from flows.allocator import ALLOCATOR_ENV
from flows.cluster import (
    NANNY_SPAWN_ENV_VAR,
    PROFILE_ENV_VAR,
    dask_client,
    nannies_spawning_with,
    nanny_spawn_env,
    worker_command_env,
)
from flows.worker_memory import PLUGIN_NAME, return_freed_memory
from schemas.settings import Settings
from tasks.node_threads import node_plan
from tests.worker_helpers import start_env

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's allocator and /proc are Linux's"
)


@pytest.fixture(autouse=True)
def _default_allocator(monkeypatch):
    for key in [*ALLOCATOR_ENV, NANNY_SPAWN_ENV_VAR, PROFILE_ENV_VAR]:
        monkeypatch.delenv(key, raising=False)


def _profiling(dask_worker) -> bool:
    """Whether Dask's statistical profiler samples this worker (it keeps a call tree a
    second for 1,000 seconds: the workers' RSS drift)."""
    return "profile" in dask_worker.periodic_callbacks


def _plugin_trims(dask_worker) -> int | None:
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return None if plugin is None else plugin.trims


def test_the_embedded_cluster_starts_its_workers_with_the_allocator_settings(tmp_path):
    settings = Settings(home=tmp_path, local_workers=1)
    ours = [*ALLOCATOR_ENV, *node_plan(workers=1).environment()]
    before = {key: os.environ.get(key) for key in ours}
    with dask_client(settings) as client:
        (started,) = client.run(start_env).values()
        (trims,) = client.run(_plugin_trims).values()
        (profiling,) = client.run(_profiling).values()
    assert profiling is False
    for key, value in ALLOCATOR_ENV.items():
        assert started.get(key) == value, key  # Dask's own MALLOC_TRIM_THRESHOLD_ does not win
    plan = node_plan(workers=1).environment()  # the node's plan (tests/test_node_threads.py)
    assert {key: started.get(key) for key in plan} == plan
    assert trims == 0  # the plugin is in place, and nothing was above the pause fraction
    assert {key: os.environ.get(key) for key in ours} == before  # the nanny's writes: undone


def test_the_users_own_allocator_setting_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    with nannies_spawning_with(nanny_spawn_env()), LocalCluster(
        n_workers=1, threads_per_worker=1, dashboard_address=None
    ) as cluster, Client(cluster) as client:  # fmt: skip
        (started,) = client.run(start_env).values()
    assert started["MALLOC_TRIM_THRESHOLD_"] == "131072"
    assert started["MALLOC_ARENA_MAX"] == ALLOCATOR_ENV["MALLOC_ARENA_MAX"]


def test_svfx_worker_commands_have_their_nanny_pass_the_settings_on(monkeypatch):
    env = worker_command_env()
    spawned = ast.literal_eval(env.pop(NANNY_SPAWN_ENV_VAR))
    assert env.pop(PROFILE_ENV_VAR) == "False"  # the nanny reads it and hands it on
    assert env == ALLOCATOR_ENV
    dasks = {k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()}
    assert spawned == {**dasks, **ALLOCATOR_ENV}
    assert spawned["OMP_NUM_THREADS"] == "1"  # Dask's own defaults stay
    monkeypatch.setenv(NANNY_SPAWN_ENV_VAR, "{}")  # the user's own config variable stays
    assert NANNY_SPAWN_ENV_VAR not in worker_command_env()
    monkeypatch.setenv(PROFILE_ENV_VAR, "True")
    assert PROFILE_ENV_VAR not in worker_command_env()


def test_the_users_profiler_setting_wins(monkeypatch):
    monkeypatch.setenv(PROFILE_ENV_VAR, "True")  # what this process's config then says:
    profile = {"distributed.worker.profile.enabled": True}
    with dask.config.set(profile), nannies_spawning_with(nanny_spawn_env()), LocalCluster(
        n_workers=1, threads_per_worker=1, dashboard_address=None
    ) as cluster, Client(cluster) as client:  # fmt: skip
        (profiling,) = client.run(_profiling).values()
    assert profiling is True


def _allocate_and_free(megabytes: int) -> int:
    import numpy as np

    blocks = [np.ones(16 << 20, dtype=np.uint8) for _ in range(megabytes // 16)]
    return len(blocks)


def _resident_mb() -> int:
    import psutil

    return psutil.Process().memory_info().rss >> 20


@pytest.mark.timeout(120)
def test_a_worker_paused_by_memory_it_freed_and_kept_resumes():
    """With freed blocks kept, a worker that once went above its pause fraction stays above
    it; without the plugin the second task below never runs (the worker stays paused)."""
    memory = {"distributed.worker.memory.pause": 0.5, "distributed.worker.memory.terminate": False}
    with dask.config.set(memory), nannies_spawning_with(nanny_spawn_env()):
        cluster = LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit="1GiB", dashboard_address=None
        )
    with cluster, Client(cluster) as client:
        return_freed_memory(client)
        assert client.submit(_allocate_and_free, 640, pure=False).result() == 40  # above half
        started = time.monotonic()
        resident = client.submit(_resident_mb, pure=False).result(timeout=30)
        (trims,) = client.run(_plugin_trims).values()
        (dropped,) = client.run(_dask_memory_warnings_dropped).values()
    assert time.monotonic() - started < 30
    assert dropped >= 1  # the "Pausing worker" line, said in our words instead
    assert resident < 512, resident  # back under the pause fraction of 1 GiB
    assert trims >= 1


def _dask_memory_warnings_dropped() -> int:
    import logging

    from flows.memory_warnings import OurMemoryWarning

    (ours,) = [
        f
        for f in logging.getLogger("distributed.worker.memory").filters
        if isinstance(f, OurMemoryWarning)
    ]
    return ours.dropped
