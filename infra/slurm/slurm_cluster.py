#!/usr/bin/env python
"""GPU workers for sapiens-vfx as Slurm jobs, with dask-jobqueue.

Runs a Dask scheduler in this process (on a login or head node that compute nodes can
reach), checks that Slurm accepts the worker job (``sbatch --test-only``: a wrong partition
is one line and exit status 2, before anything is queued), submits N Slurm jobs of one GPU
each, every job one Dask worker with one thread and the resource ``GPU=1``, prints the
scheduler address for ``SVFX_DASK_ADDRESS`` and keeps the scheduler alive until Ctrl-C
(which cancels the jobs). ``--gpus-per-job 0`` makes CPU-only workers (no ``--gres``, no
``GPU`` resource), for a CPU partition or a test cluster without GPUs: each job's
``--cores`` are shared as sapiens-vfx's ``tasks/node_threads.py`` plans them (workers per
job, torch threads each, a core for reading and encoding; the job script echoes the plan),
so this script then needs sapiens-vfx importable, as in its own environment::

    pip install "dask-jobqueue>=0.9"      # optional, same environment as sapiens-vfx
    python infra/slurm/slurm_cluster.py --queue gpu --account vfx --jobs 8
    python infra/slurm/slurm_cluster.py --queue gpu --dry-run            # show the kwargs
    python infra/slurm/slurm_cluster.py --queue gpu --print-job-script   # show the sbatch

Tested for real against a one-node Slurm cluster: ``pytest -m slurm`` (tests/test_slurm.py).

Every option also reads an environment variable (``SVFX_SLURM_QUEUE``, ...; see --help).
Settings the workers need (``SVFX_CHECKPOINT_ROOT``, ``SVFX_OUTPUT_ROOT``, ...) are copied
from this environment into each job script; secrets (AWS keys, the catalog URL) never
are: workers do not write the catalog, and Slurm passes the submitting environment to the
job by default (``sbatch --export=ALL``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

# Copied into every job script when set here (values are quoted literally).
FORWARDED_ENV: tuple[str, ...] = (
    "SVFX_HOME",
    "SVFX_CONFIG",
    "SVFX_CHECKPOINT_ROOT",
    "SVFX_OUTPUT_ROOT",
    "SVFX_ALLOWED_ROOTS",
    "SVFX_S3_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_EC2_METADATA_DISABLED",
)
# Never written into a job script (job scripts are stored in Slurm's spool and logs).
SECRET_ENV: frozenset[str] = frozenset(
    {"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "SVFX_CATALOG_URL", "PREFECT_API_KEY"}
)

# One Dask worker per job, one thread, tagged with the GPU resource the platform requests.
WORKER_EXTRA_ARGS: tuple[str, ...] = ("--resources", "GPU=1", "--nthreads", "1")
# --gpus-per-job 0: no GPU resource, so the platform submits chunks without one (as on a
# CPU-only LocalCluster) rather than to workers claiming a GPU they do not have. Each worker
# runs one chunk at a time; its torch and EXR threads come from the job's thread plan.
CPU_WORKER_EXTRA_ARGS: tuple[str, ...] = ("--nthreads", "1")
# The variables of the CPU workers' thread plan (sapiens-vfx's tasks/node_threads.py).
PLAN_ENV: tuple[str, ...] = ("SVFX_CPU_WORKERS", "SVFX_TORCH_THREADS", "SVFX_EXR_THREADS")
SUBMIT_CHECK_TIMEOUT_S = 60


class SubmitError(RuntimeError):
    """Slurm refused the worker job; the message names the partition and sbatch's reason."""


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value else default


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="slurm_cluster.py",
        description="Start a Dask scheduler here and sapiens-vfx GPU workers as Slurm jobs.",
    )
    slurm = parser.add_argument_group("Slurm job (one GPU, one Dask worker per job)")
    _add_job_resources(slurm)
    _add_job_settings(slurm)
    _add_worker_options(parser.add_argument_group("worker environment"))
    _add_scheduler_options(parser.add_argument_group("scheduler (runs in this process)"))
    _add_run_options(parser.add_argument_group("run"))
    options = parser.parse_args(argv)
    _check(parser, options)
    return options


def _add_job_resources(slurm: argparse._ArgumentGroup) -> None:
    """Where a job runs and what it asks Slurm for."""
    slurm.add_argument(
        "--queue", default=_env("SVFX_SLURM_QUEUE"), help="partition (SVFX_SLURM_QUEUE)"
    )
    slurm.add_argument(
        "--account", default=_env("SVFX_SLURM_ACCOUNT"), help="account (SVFX_SLURM_ACCOUNT)"
    )
    slurm.add_argument(
        "--cores",
        type=int,
        default=_env("SVFX_SLURM_CORES", "8"),
        help="CPU cores per job (SVFX_SLURM_CORES, default 8): for a GPU worker, decoding and "
        "encoding; with --gpus-per-job 0, the CPU workers' plan: workers per job, torch "
        "threads each, a core for reading and encoding (SVFX_CPU_WORKERS, SVFX_TORCH_THREADS, "
        "SVFX_EXR_THREADS override)",
    )
    slurm.add_argument(
        "--memory",
        default=_env("SVFX_SLURM_MEMORY", "64GB"),
        help="memory per job (SVFX_SLURM_MEMORY, default 64GB)",
    )
    slurm.add_argument(
        "--walltime",
        default=_env("SVFX_SLURM_WALLTIME", "08:00:00"),
        help="job time limit (SVFX_SLURM_WALLTIME, default 08:00:00)",
    )
    slurm.add_argument(
        "--gres",
        default=_env("SVFX_SLURM_GRES", "gpu:1"),
        help="GPU request, one GPU: gpu:1 or gpu:TYPE:1 (SVFX_SLURM_GRES, default gpu:1)",
    )
    slurm.add_argument(
        "--gpus-per-job",
        type=int,
        default=_env("SVFX_SLURM_GPUS_PER_JOB", "1"),
        help="1: each job asks for --gres and its worker offers GPU=1; 0: CPU-only workers, "
        "no --gres and no GPU resource (SVFX_SLURM_GPUS_PER_JOB, default 1)",
    )


def _add_job_settings(slurm: argparse._ArgumentGroup) -> None:
    """The job's name, extra directives and logs."""
    slurm.add_argument(
        "--job-name", default=_env("SVFX_SLURM_JOB_NAME", "svfx-gpu"), help="job name"
    )
    slurm.add_argument(
        "--directive",
        action="append",
        default=[],
        metavar="SBATCH_OPTION",
        help="extra #SBATCH option, repeatable (e.g. --directive=--constraint=a100)",
    )
    slurm.add_argument(
        "--log-directory",
        default=_env("SVFX_SLURM_LOG_DIRECTORY"),
        help="where job stdout/stderr go (SVFX_SLURM_LOG_DIRECTORY)",
    )


def _add_worker_options(worker: argparse._ArgumentGroup) -> None:
    """What each job's worker runs in."""
    worker.add_argument(
        "--venv",
        default=_env("SVFX_VENV", _env("VIRTUAL_ENV")),
        help="virtual environment with sapiens-vfx on a shared filesystem, activated in "
        "each job (SVFX_VENV, default: the active VIRTUAL_ENV)",
    )
    worker.add_argument(
        "--python",
        default=None,
        help="worker interpreter (default: VENV/bin/python, else this interpreter)",
    )
    worker.add_argument(
        "--local-directory",
        default=_env("SVFX_SLURM_LOCAL_DIRECTORY", "${TMPDIR:-/tmp}"),
        help="node-local scratch for Dask, expanded on the node (default ${TMPDIR:-/tmp})",
    )
    worker.add_argument(
        "--prologue",
        action="append",
        default=[],
        metavar="SHELL_LINE",
        help="shell line run before the worker, repeatable (e.g. 'module load cuda/12.8')",
    )
    worker.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra variable exported in each job, repeatable (no secrets)",
    )


def _add_scheduler_options(sched: argparse._ArgumentGroup) -> None:
    sched.add_argument(
        "--interface",
        default=_env("SVFX_SLURM_INTERFACE"),
        help="network interface reachable from the compute nodes, e.g. ib0",
    )
    sched.add_argument("--scheduler-port", type=int, default=8786, help="default 8786")
    sched.add_argument("--dashboard-address", default=":8787", help="default :8787")


def _add_run_options(run: argparse._ArgumentGroup) -> None:
    run.add_argument(
        "--jobs",
        type=int,
        default=_env("SVFX_SLURM_JOBS", "1"),
        help="GPU jobs to start (SVFX_SLURM_JOBS, default 1)",
    )
    run.add_argument(
        "--adapt-max",
        type=int,
        default=None,
        help="adapt between --jobs and this many jobs instead of a fixed count",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the SLURMCluster keyword arguments as JSON and exit (no dask-jobqueue)",
    )
    run.add_argument(
        "--print-job-script", action="store_true", help="print the job script and exit"
    )


def _check(parser: argparse.ArgumentParser, options: argparse.Namespace) -> None:
    """Refuse, as argparse does (exit 2), what the cluster cannot run."""
    if options.jobs < 0 or (options.adapt_max is not None and options.adapt_max < options.jobs):
        parser.error("need 0 <= --jobs <= --adapt-max")
    if options.gpus_per_job not in (0, 1):
        parser.error(
            f"--gpus-per-job {options.gpus_per_job}: 1 (one GPU worker per job) or 0 "
            "(CPU-only workers); for more GPUs submit more jobs"
        )
    if not options.gres.endswith(":1"):
        parser.error(
            f"--gres {options.gres!r}: one GPU per job (gpu:1 or gpu:TYPE:1); each job runs "
            "one Dask worker with GPU=1, so more GPUs per job would sit idle"
        )


def _env_values(options: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """What each job exports: the forwarded settings set here, then ``--env``."""
    values: dict[str, str] = {name: environ[name] for name in FORWARDED_ENV if environ.get(name)}
    for item in options.env:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--env {item!r}: expected NAME=VALUE")
        if name in SECRET_ENV:
            raise ValueError(
                f"--env {name}: secrets are not written into job scripts; export it in the "
                "shell that runs this script (Slurm passes it on) or use your site's "
                "secret mechanism"
            )
        values[name] = value
    return values


def cpu_thread_plan(options: argparse.Namespace, environ: Mapping[str, str]) -> Any:
    """The CPU workers' plan for a job of ``--cores``: sapiens-vfx's rule (workers per job,
    torch threads, the core kept for reading and encoding), with SVFX_CPU_WORKERS,
    SVFX_TORCH_THREADS and SVFX_EXR_THREADS from ``--env`` or this environment (which Slurm
    passes to the job) as overrides. ValueError (one line) when they ask for more threads
    than the job's cores."""
    try:
        from tasks.node_threads import NodeCores, node_plan
    except ImportError:
        raise SystemExit(
            "error: --gpus-per-job 0 plans the CPU workers' threads with sapiens-vfx: run "
            "this script with the python of the environment that has sapiens-vfx installed"
        ) from None
    given = {name: environ[name] for name in PLAN_ENV if environ.get(name)}
    given.update({k: v for k, v in _env_values(options, {}).items() if k in PLAN_ENV})
    return node_plan(given, cores=NodeCores(options.cores, "--cores per Slurm job"))


def cluster_kwargs(
    options: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The keyword arguments for ``dask_jobqueue.SLURMCluster``; pure (no Slurm, no dask)."""
    environ = os.environ if environ is None else environ
    venv = options.venv.rstrip("/") if options.venv else None
    python = options.python or (f"{venv}/bin/python" if venv else sys.executable)
    # site lines first (module load ...), then the venv, so its python wins on PATH
    prologue: list[str] = list(options.prologue)
    if venv:
        prologue.append(f"source {shlex.quote(venv)}/bin/activate")
    exports = _env_values(options, environ)
    processes = 1
    if not options.gpus_per_job:  # CPU workers: the job's cores shared by the plan
        plan = cpu_thread_plan(options, environ)
        processes = plan.workers
        exports.update(plan.environment())
        prologue.append(f"echo {shlex.quote(plan.describe())}")
    prologue.extend(f"export {name}={shlex.quote(value)}" for name, value in exports.items())
    gres = [f"--gres={options.gres}"] if options.gpus_per_job else []

    kwargs: dict[str, Any] = {
        "queue": options.queue,
        "account": options.account,
        "cores": options.cores,
        "processes": processes,
        "memory": options.memory,
        "walltime": options.walltime,
        "job_name": options.job_name,
        "job_extra_directives": [*gres, *options.directive],
        "worker_extra_args": list(
            WORKER_EXTRA_ARGS if options.gpus_per_job else CPU_WORKER_EXTRA_ARGS
        ),
        "local_directory": options.local_directory,
        "job_script_prologue": prologue,
        "python": python,
        "scheduler_options": {
            "port": options.scheduler_port,
            "dashboard_address": options.dashboard_address,
        },
    }
    if options.interface:
        kwargs["interface"] = options.interface
    if options.log_directory:
        kwargs["log_directory"] = options.log_directory
    return kwargs


def build_cluster(kwargs: Mapping[str, Any]) -> Any:
    """The ``SLURMCluster`` (its scheduler starts here; no job is submitted yet)."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise SystemExit(
            "error: dask-jobqueue is not installed. It is an optional extra of sapiens-vfx: "
            'pip install "dask-jobqueue>=0.9" into the environment that has sapiens-vfx '
            "(same dask/distributed as the workers)."
        ) from None
    return SLURMCluster(**kwargs)


def _one_line(text: str) -> str:
    lines = [line.strip().removeprefix("sbatch: error: ") for line in text.splitlines()]
    return "; ".join(line for line in lines if line) or "no reason given"


def check_submission(cluster: Any, queue: str | None) -> None:
    """``sbatch --test-only`` of the worker job script: Slurm validates it (partition, gres,
    memory) and queues nothing. dask-jobqueue submits from its event loop and
    only logs a refused sbatch, leaving the scheduler waiting for workers that never come;
    this turns the refusal into a SubmitError naming the partition."""
    where = f"partition {queue!r}" if queue else "the default partition"
    with tempfile.NamedTemporaryFile("w", prefix="svfx-worker-", suffix=".sh") as script:
        script.write(cluster.job_script())
        script.flush()
        try:
            done = subprocess.run(
                ["sbatch", "--test-only", script.name],
                capture_output=True,
                text=True,
                timeout=SUBMIT_CHECK_TIMEOUT_S,
            )
        except FileNotFoundError:
            raise SubmitError(
                "sbatch is not on PATH: run this on a Slurm submit host (login node)"
            ) from None
        except subprocess.TimeoutExpired:
            raise SubmitError(
                f"sbatch --test-only for {where} got no answer from slurmctld within "
                f"{SUBMIT_CHECK_TIMEOUT_S} s"
            ) from None
    if done.returncode != 0:
        raise SubmitError(
            f"Slurm refuses the worker job for {where}: {_one_line(done.stderr + done.stdout)}"
        )


def start_workers(cluster: Any, options: argparse.Namespace, **adapt_kwargs: Any) -> None:
    """Check that Slurm accepts the worker job, then submit ``--jobs`` of them, or adapt
    between ``--jobs`` and ``--adapt-max`` (``adapt_kwargs``: dask's Adaptive options, e.g.
    ``interval``, ``wait_count``). Raises SubmitError before anything is queued."""
    check_submission(cluster, options.queue)
    if options.adapt_max is not None:
        cluster.adapt(minimum_jobs=options.jobs, maximum_jobs=options.adapt_max, **adapt_kwargs)
    else:
        cluster.scale(jobs=options.jobs)


def _quiet_dask_logs() -> None:
    """dask's INFO lines (scheduler starting, closing) would bury what this script prints
    (the address, or a one-line error): warnings and errors only."""
    try:
        import distributed  # noqa: F401  (sets dask's logger levels on import)
    except ImportError:
        return  # build_cluster says what is missing
    logging.getLogger("distributed").setLevel(logging.WARNING)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        kwargs = cluster_kwargs(options)
    except ValueError as exc:  # an --env that is not NAME=VALUE or a secret, too many threads
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    if options.dry_run:
        print(json.dumps(kwargs, indent=2))
        return 0

    _quiet_dask_logs()
    cluster = build_cluster(kwargs)
    try:
        if options.print_job_script:
            print(cluster.job_script())
            return 0
        try:
            start_workers(cluster, options)
        except SubmitError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 2
        print(f"export SVFX_DASK_ADDRESS={cluster.scheduler_address}", flush=True)
        print(f"# dashboard: {cluster.dashboard_link}", flush=True)
        print("# Ctrl-C stops the scheduler and cancels the worker jobs.", flush=True)
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        seen = -1
        while True:
            workers = len(cluster.scheduler_info.get("workers", {}))
            if workers != seen:
                print(f"# workers connected: {workers}", flush=True)
                seen = workers
            time.sleep(10)
    except KeyboardInterrupt:
        print("# closing: cancelling the worker jobs", flush=True)
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
