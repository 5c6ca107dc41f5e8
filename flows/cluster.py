"""Connecting to Dask: an existing scheduler (``SVFX_DASK_ADDRESS``), or a LocalCluster.

GPU workers carry the Dask resource ``GPU=1`` (one worker per GPU, one process, so one CUDA
context) and run `CHUNKS_PER_GPU` chunks at once, each submitted with that share of the GPU
resource (`chunk_dispatch_shape`): one chunk's model stage has the device while the other
sets up and reads its first frames, or writes its last (`tasks.chunk_worker` takes the device
stages in turn), so the device does not wait for a chunk to drain and the next to fill. A
CPU-only LocalCluster
has no GPU resource: each worker process is one model slot, and the node's cores are shared
among them as `tasks.node_threads` plans (workers, torch threads, EXR threads), handed to each
worker process in its environment.

Commands prove a scheduler answers (``scheduler_identity``, within a few seconds) before they
register or submit anything, and say where its dashboard is (``scheduler_dashboard``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dask
from distributed import Client, LocalCluster

from schemas.settings import Settings
from tasks.node_threads import ThreadPlan, node_cores, node_plan

from .allocator import allocator_env, allocator_settings
from .refusals import ClusterError
from .worker_memory import return_freed_memory

# The flow's own connection, once the command has proven the scheduler answers (or, under
# `svfx serve`, riding out a scheduler restart).
CONNECT_TIMEOUT_S = 30
START_HINT = (
    "start it (`svfx cluster`, or a recipe under infra/) or fix --cluster / SVFX_DASK_ADDRESS"
)
CONNECT_HINT = f"{START_HINT}; SVFX_DASK_CONNECT_TIMEOUT_S gives it longer"


# Chunks a GPU worker runs at once: two, so that one's device stage covers the other's start
# and end (a chunk of one GPU worker at a time leaves the device idle while its last frames
# are written, and again while the next chunk sets up and reads its first ones); more would
# only hold more frames in memory.
CHUNKS_PER_GPU = 2

NANNY_SPAWN_ENV_VAR = "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"
_SPAWN_ENV_KEY = "distributed.nanny.pre-spawn-environ"

# Dask's statistical profiler keeps a history of sampled call trees, Python objects a worker
# gains for its first minutes whatever it runs: it was the whole of our workers' steady RSS
# growth (docs/design/allocator.md). Off on the workers this platform starts (the dashboard's
# Profile page is then empty); DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True turns it back on.
PROFILE_KEY = "distributed.worker.profile.enabled"
PROFILE_ENV_VAR = "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"


def worker_dask_config() -> dict[str, Any]:
    """Dask config for the workers this platform starts: the profiler off, unless the user's
    environment says otherwise."""
    return {} if PROFILE_ENV_VAR in os.environ else {PROFILE_KEY: False}


def nanny_spawn_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """What a nanny puts in the environment of the worker process it spawns: Dask's own
    (OMP_NUM_THREADS=1, ...), the allocator settings, then `extra`."""
    spawn = {str(k): str(v) for k, v in (dask.config.get(_SPAWN_ENV_KEY, None) or {}).items()}
    return {**spawn, **allocator_settings(), **(extra or {})}


@contextmanager
def nannies_spawning_with(env: dict[str, str]) -> Iterator[None]:
    """Dask config under which the nannies created meanwhile (a LocalCluster's) spawn their
    worker processes with `env` in their environment from the start, and hand them
    `worker_dask_config`. A nanny writes `env` into this process's own environment to do so;
    what that was is put back afterwards."""
    before = {key: os.environ.get(key) for key in env}
    try:
        with dask.config.set({_SPAWN_ENV_KEY: env, **worker_dask_config()}):
            yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def worker_command_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `svfx worker` adds for a `dask worker` command: the allocator
    settings and `extra` (a CPU worker's thread plan), the config variable that has its
    nanny pass them (with Dask's own, whose OMP_NUM_THREADS=1 `extra` may replace) to the
    worker process it spawns, and the profiler off (`worker_dask_config`). A config variable
    the user has set is left as it is."""
    env = {**allocator_env(), **(extra or {})}
    if NANNY_SPAWN_ENV_VAR not in os.environ:
        env[NANNY_SPAWN_ENV_VAR] = repr(nanny_spawn_env(extra))
    if PROFILE_ENV_VAR not in os.environ:
        env[PROFILE_ENV_VAR] = "False"
    return env


def local_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install: run on the CPU, and say so in the log
        return 0


def start_local_cluster(
    n_workers: int | None = None,
    *,
    gpus: int | None = None,
    dashboard: bool = False,
    plan: ThreadPlan | None = None,
) -> LocalCluster:
    """A LocalCluster: one worker per GPU (with GPU=1) when GPUs exist, else the CPU workers
    of the node's plan (`tasks.node_threads`; ``n_workers`` of them when given, or ``plan``
    as the caller printed it), each started with its torch and EXR threads. ThreadPlanError
    when the threads asked for are more than the cores."""
    gpus = local_gpu_count() if gpus is None else gpus
    dashboard_address = ":8787" if dashboard else None
    if gpus > 0:
        try:
            from dask_cuda import LocalCUDACluster

            with nannies_spawning_with(nanny_spawn_env()):
                return LocalCUDACluster(
                    n_workers=gpus,
                    threads_per_worker=CHUNKS_PER_GPU,
                    resources={"GPU": 1},
                    dashboard_address=dashboard_address,
                )
        except ImportError:
            pass  # without dask-cuda: one plain worker per GPU
        threads = str(max(1, node_cores().count // gpus))
        workers, extra = gpus, {"SVFX_TORCH_THREADS": threads, "OMP_NUM_THREADS": threads}
    else:
        plan = plan or node_plan(workers=n_workers)
        workers, extra = plan.workers, plan.environment()
    with nannies_spawning_with(nanny_spawn_env(extra)):
        return LocalCluster(
            n_workers=workers,
            threads_per_worker=CHUNKS_PER_GPU if gpus else 1,
            processes=True,
            dashboard_address=dashboard_address,
            # without a dashboard the scheduler still serves /health on a port, 8787 unless told:
            # a free one, so two runs at once never warn "port 8787 is already in use"
            scheduler_kwargs=None if dashboard else {"dashboard_address": "127.0.0.1:0"},
            resources={"GPU": 1} if gpus else None,
            silence_logs=logging.WARNING,
        )


def gpu_slots(client: Client) -> int:
    """How many workers declare a GPU resource (0 on CPU-only clusters)."""
    workers = client.scheduler_info(n_workers=-1)["workers"].values()
    return sum(1 for w in workers if w.get("resources", {}).get("GPU", 0) >= 1)


def worker_count(client: Client) -> int:
    return len(client.scheduler_info(n_workers=-1)["workers"])


def chunk_dispatch_shape(client: Client) -> tuple[int, dict[str, float] | None]:
    """How chunks go out to this cluster: the window of chunks in flight and the resources
    each asks for. With GPU workers, each chunk takes ``1 / CHUNKS_PER_GPU`` of a GPU, and
    the window holds one more chunk per GPU than run at once, so a worker finishing a chunk
    starts the next without waiting for the flow to hear of it; with CPU workers (no
    resource), two chunks per worker."""
    gpus = gpu_slots(client)
    if gpus:
        return (CHUNKS_PER_GPU + 1) * gpus, {"GPU": 1 / CHUNKS_PER_GPU}
    return 2 * (worker_count(client) or 1), None


def no_answer_reason(address: str, exc: BaseException) -> str:
    """Why nothing answered: the OS error distributed wraps in "Timed out trying to connect"
    ("Connection refused", "Name or service not known"), or, when its last attempt was cut
    short and none is in the chain, what one plain TCP connection says (at most 1 s)."""
    from distributed.comm import get_address_host_port

    node: BaseException | None = exc
    while node is not None:
        if isinstance(node, OSError) and node.strerror:
            return node.strerror
        node = node.__cause__ or node.__context__
    try:
        with socket.create_connection(get_address_host_port(address), timeout=1):
            return "the port takes connections, but no Dask scheduler answered on it"
    except (ValueError, NotImplementedError):  # not a TCP address
        return "nothing answered"
    except OSError as err:
        return err.strerror or str(err) or type(err).__name__


def scheduler_identity(address: str, timeout_s: float, hint: str = CONNECT_HINT) -> dict[str, Any]:
    """The scheduler's own account of itself (id, services, worker count), asked without
    starting a Client: proof that a Dask scheduler answers at ``address``. ClusterError naming
    the address when nothing answers within ``timeout_s``, or something else does; ``hint``
    ends its message. Call it from synchronous code (it runs its own event loop)."""
    from distributed.core import rpc
    from distributed.security import Security

    async def ask() -> dict[str, Any]:
        args = Security().get_connection_args("client")  # tls:// as the dask config sets it
        async with rpc(address, timeout=timeout_s, connection_args=args) as scheduler:
            return dict(await scheduler.identity(n_workers=0))

    try:
        # wait_for: a peer that accepts the connection and then says nothing
        identity = asyncio.run(asyncio.wait_for(ask(), timeout_s + 1))
    except ValueError as exc:  # no scheme it knows, no port, ...
        raise ClusterError(f"{address!r} is not a Dask scheduler address: {exc}") from None
    except (OSError, TimeoutError) as exc:
        raise ClusterError(
            f"the Dask scheduler at {address} did not answer within {timeout_s:g} s "
            f"({no_answer_reason(address, exc)}): {hint}"
        ) from None
    except Exception as exc:  # something else on the port, TLS not configured, ...
        why = f"{type(exc).__name__}: {exc}"[:200]
        raise ClusterError(f"no Dask scheduler answered at {address} ({why}): {hint}") from None
    if identity.get("type") != "Scheduler":
        raise ClusterError(f"{address} is a Dask {identity.get('type')}, not a scheduler: {hint}")
    return identity


def scheduler_dashboard(address: str, identity: dict[str, Any], timeout_s: float) -> str:
    """Where the scheduler's dashboard is, as one line: ``dashboard: LINK`` or ``no dashboard
    (why)``. A scheduler always serves HTTP (/health, /metrics) on its dashboard port, whether
    the dashboard is on or not, so the port alone says nothing: /status is asked, which is the
    dashboard, a "needs bokeh" page (bokeh missing where the scheduler runs) or 404
    (started with --no-dashboard)."""
    from distributed.comm import get_address_host
    from distributed.utils import format_dashboard_link

    port = (identity.get("services") or {}).get("dashboard")
    if not port:
        return "no dashboard (the scheduler serves no HTTP)"
    host = get_address_host(address)
    link = format_dashboard_link(host, port)
    scheme = "https" if link.startswith("https:") else "http"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with direct.open(f"{scheme}://{host}:{port}/status", timeout=timeout_s) as response:
            page = response.read(4096).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return "no dashboard (the scheduler has it turned off: --no-dashboard)"
        return f"dashboard: {link} (it answered HTTP {exc.code})"
    except (OSError, TimeoutError):
        return f"dashboard: {link} (not reachable from here)"
    if "Dask needs" in page and "for the dashboard" in page:  # http.scheduler.missing_bokeh
        return "no dashboard (bokeh is not installed where the scheduler runs)"
    return f"dashboard: {link}"


def local_dashboard_missing() -> str | None:
    """Why a scheduler started here would have no dashboard (None: it would have one): the
    same import the scheduler tries, which fails without bokeh (or with one too old)."""
    try:
        import distributed.dashboard.scheduler  # noqa: F401
    except ImportError:
        return "bokeh is not installed: pip install bokeh"
    return None


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
                f"({no_answer_reason(address, exc)}): {START_HINT}"
            ) from None
        try:
            return_freed_memory(client)
            yield client
        finally:
            client.close()
        return
    cluster = start_local_cluster(settings.local_workers)
    client = Client(cluster)
    try:
        return_freed_memory(client)
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
