#!/usr/bin/env python
"""GPU workers for sapiens-vfx as Slurm jobs, with dask-jobqueue.

Runs a Dask scheduler in this process (on a login or head node that compute nodes can
reach), submits N Slurm jobs of one GPU each, every job one Dask worker with one thread
and the resource ``GPU=1``, prints the scheduler address for ``SVFX_DASK_ADDRESS`` and
keeps the scheduler alive until Ctrl-C (which cancels the jobs)::

    pip install "dask-jobqueue>=0.9"      # optional, same environment as sapiens-vfx
    python infra/slurm/slurm_cluster.py --queue gpu --account vfx --jobs 8
    python infra/slurm/slurm_cluster.py --queue gpu --dry-run            # show the kwargs
    python infra/slurm/slurm_cluster.py --queue gpu --print-job-script   # show the sbatch

Every option also reads an environment variable (``SVFX_SLURM_QUEUE``, ...; see --help).
Settings the workers need (``SVFX_CHECKPOINT_ROOT``, ``SVFX_OUTPUT_ROOT``, ...) are copied
from this environment into each job script; secrets (AWS keys, the catalog URL) never
are: workers do not write the catalog, and Slurm passes the submitting environment to the
job by default (``sbatch --export=ALL``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
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


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value else default


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="slurm_cluster.py",
        description="Start a Dask scheduler here and sapiens-vfx GPU workers as Slurm jobs.",
    )
    slurm = parser.add_argument_group("Slurm job (one GPU, one Dask worker per job)")
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
        help="CPU cores per job for decoding and pre-processing; the Dask worker still "
        "runs 1 thread (SVFX_SLURM_CORES, default 8)",
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

    worker = parser.add_argument_group("worker environment")
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

    sched = parser.add_argument_group("scheduler (runs in this process)")
    sched.add_argument(
        "--interface",
        default=_env("SVFX_SLURM_INTERFACE"),
        help="network interface reachable from the compute nodes, e.g. ib0",
    )
    sched.add_argument("--scheduler-port", type=int, default=8786, help="default 8786")
    sched.add_argument("--dashboard-address", default=":8787", help="default :8787")

    run = parser.add_argument_group("run")
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

    options = parser.parse_args(argv)
    if options.jobs < 0 or (options.adapt_max is not None and options.adapt_max < options.jobs):
        parser.error("need 0 <= --jobs <= --adapt-max")
    if not options.gres.endswith(":1"):
        parser.error(
            f"--gres {options.gres!r}: one GPU per job (gpu:1 or gpu:TYPE:1); each job runs "
            "one Dask worker with GPU=1, so more GPUs per job would sit idle"
        )
    return options


def _exports(options: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
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
    return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]


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
    prologue.extend(_exports(options, environ))

    kwargs: dict[str, Any] = {
        "queue": options.queue,
        "account": options.account,
        "cores": options.cores,
        "processes": 1,
        "memory": options.memory,
        "walltime": options.walltime,
        "job_name": options.job_name,
        "job_extra_directives": [f"--gres={options.gres}", *options.directive],
        "worker_extra_args": list(WORKER_EXTRA_ARGS),
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


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        kwargs = cluster_kwargs(options)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if options.dry_run:
        print(json.dumps(kwargs, indent=2))
        return 0
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise SystemExit(
            "error: dask-jobqueue is not installed. It is an optional extra of sapiens-vfx: "
            'pip install "dask-jobqueue>=0.9" into the environment that has sapiens-vfx '
            "(same dask/distributed as the workers)."
        ) from None

    cluster = SLURMCluster(**kwargs)
    try:
        if options.print_job_script:
            print(cluster.job_script())
            return 0
        if options.adapt_max is not None:
            cluster.adapt(minimum_jobs=options.jobs, maximum_jobs=options.adapt_max)
        else:
            cluster.scale(jobs=options.jobs)
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
