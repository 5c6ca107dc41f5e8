"""The Open Job Description template (AWS Deadline Cloud's job format) `svfx farm openjd`
writes: one shot run by our Dask workers on farm nodes, as the Slurm recipe does with sbatch.

Two steps with no dependency between them, so a farm runs them at once on different hosts:

* ``Shot`` (one task) starts a Dask scheduler that writes its address to a scheduler file on
  shared storage, runs the shot on it (``svfx farm run``, the spec embedded in the template),
  then shuts the scheduler and its workers down and marks the file done. Its exit status is
  the shot's (0 complete, 1 partial, 2 failed or refused).
* ``Workers`` (tasks ``1-{{Param.Workers}}``) each wait for the scheduler file and run
  ``svfx worker`` (one process per GPU, ``GPU=1``; ``GpusPerWorker=0``: one CPU worker)
  until the shot step shuts them down; a worker that starts after the shot is done ends at
  once.

Every host runs the same Python (``Python``: a virtual environment on a shared filesystem,
at the same path everywhere, like the Slurm recipe's). Secrets are never written into the
template: hosts take ``SVFX_*`` and AWS settings from their own environment."""

from __future__ import annotations

import json
from typing import Any

import yaml

SPEC_VERSION = "jobtemplate-2023-09"

_WAIT_FOR_SCHEDULER = """\
SF='{{Param.SchedulerFile}}'
for _ in $(seq 1 {{Param.WaitSeconds}}); do
  [ -e "$SF.done" ] && { echo "the shot is already done: no worker needed"; exit 0; }
  [ -s "$SF" ] && break
  sleep 1
done
[ -s "$SF" ] || { echo "no scheduler file at $SF after {{Param.WaitSeconds}} s" >&2; exit 1; }
ADDR=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$SF")
"""

_SHOT = """\
#!/usr/bin/env bash
# The shot: a scheduler, the run, then the scheduler and its workers shut down.
set -uo pipefail
PY='{{Param.Python}}'
SF='{{Param.SchedulerFile}}'
mkdir -p "$(dirname "$SF")"
rm -f "$SF" "$SF.done"
"$PY" -m distributed.cli.dask_scheduler --scheduler-file "$SF" --port 0 --no-dashboard &
SCHEDULER=$!
stop() {
  "$PY" -c 'import sys; from distributed import Client
c = Client(scheduler_file=sys.argv[1], timeout=10); c.shutdown()' "$SF" 2>/dev/null || true
  kill "$SCHEDULER" 2>/dev/null || true
  wait "$SCHEDULER" 2>/dev/null || true
  touch "$SF.done"
}
trap stop EXIT
for _ in $(seq 1 120); do [ -s "$SF" ] && break; sleep 1; done
[ -s "$SF" ] || { echo "the scheduler did not start" >&2; exit 2; }
ADDR=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$SF")
echo "scheduler $ADDR; running the shot"
"$PY" -m cli farm run '{{Task.File.Spec}}' --cluster "$ADDR"
"""

_WORKERS = (
    """\
#!/usr/bin/env bash
# One `svfx worker` for the shot's scheduler, until the shot step shuts it down.
set -uo pipefail
PY='{{Param.Python}}'
"""
    + _WAIT_FOR_SCHEDULER
    + """\
echo "worker {{Task.Param.Worker}} -> $ADDR"
"$PY" -m cli worker "$ADDR" --gpus '{{Param.GpusPerWorker}}'
echo "worker {{Task.Param.Worker}}: the scheduler shut it down (exit $?)"
exit 0
"""
)


# what --gpus-per-worker and the template's GpusPerWorker take
GPUS_PER_WORKER = ("auto", "0", "1", "2", "4", "8")


def job_template(
    spec: dict[str, Any],
    *,
    python: str,
    scheduler_file: str,
    workers: int = 2,
    gpus_per_worker: str = "1",
    wait_s: int = 600,
) -> dict[str, Any]:
    """The template of one shot (``spec``: a ShotSpec as JSON data)."""
    shot = f"{spec['show']}/{spec['sequence']}/{spec['shot']}"
    parameters = _parameters(python, scheduler_file, workers, gpus_per_worker, wait_s)
    return {
        "specificationVersion": SPEC_VERSION,
        "name": f"svfx {shot} {spec.get('version', 'v001')}",
        "description": f"sapiens-vfx passes of {shot} on Dask workers across farm nodes",
        "parameterDefinitions": parameters,
        "steps": [_shot_step(spec), _workers_step(gpus_per_worker)],
    }


def _parameters(
    python: str, scheduler_file: str, workers: int, gpus_per_worker: str, wait_s: int
) -> list[dict[str, Any]]:
    """The template's parameters, their defaults the values given."""
    return [
        {
            "name": "Python",
            "type": "STRING",
            "default": python,
            "description": "a shared venv's Python with sapiens-vfx, same path on every host",
        },
        {
            "name": "SchedulerFile",
            "type": "STRING",
            "default": scheduler_file,
            "description": "where the shot's scheduler writes its address (shared storage)",
        },
        {"name": "Workers", "type": "INT", "default": workers, "minValue": 1, "maxValue": 256},
        {
            "name": "GpusPerWorker",
            "type": "STRING",
            "default": gpus_per_worker,
            "allowedValues": list(GPUS_PER_WORKER),
            "description": "GPU processes per worker task (0: one CPU worker)",
        },
        {
            "name": "WaitSeconds",
            "type": "INT",
            "default": wait_s,
            "minValue": 1,
            "description": "how long a worker waits for the shot's scheduler",
        },
    ]


def _shot_step(spec: dict[str, Any]) -> dict[str, Any]:
    """The Shot step: one task running the scheduler and the shot, the spec embedded."""
    return {
        "name": "Shot",
        "script": {
            "embeddedFiles": [
                {
                    "name": "Spec",
                    "type": "TEXT",
                    "filename": "spec.json",
                    "data": json.dumps(spec, indent=1, sort_keys=True),
                },
                {"name": "Run", "type": "TEXT", "runnable": True, "data": _SHOT},
            ],
            "actions": {"onRun": {"command": "{{Task.File.Run}}"}},
        },
    }


def _workers_step(gpus_per_worker: str) -> dict[str, Any]:
    """The Workers step: one task per worker, each on a host with the GPUs it starts."""
    return {
        "name": "Workers",
        **_gpu_hosts(gpus_per_worker),
        "parameterSpace": {
            "taskParameterDefinitions": [
                {"name": "Worker", "type": "INT", "range": "1-{{Param.Workers}}"}
            ]
        },
        "script": {
            "embeddedFiles": [{"name": "Run", "type": "TEXT", "runnable": True, "data": _WORKERS}],
            "actions": {"onRun": {"command": "{{Task.File.Run}}"}},
        },
    }


def _gpu_hosts(gpus_per_worker: str) -> dict[str, Any]:
    """The Workers step's host requirement: as many GPUs as each task starts workers for
    (``auto``: at least one; ``0``: none asked)."""
    if gpus_per_worker == "0":
        return {}
    least = 1 if gpus_per_worker == "auto" else int(gpus_per_worker)
    return {"hostRequirements": {"amounts": [{"name": "amount.worker.gpu", "min": least}]}}


def template_yaml(template: dict[str, Any]) -> str:
    return yaml.safe_dump(template, sort_keys=False, width=100, allow_unicode=True)
