"""Submits started at the same moment from one SVFX_HOME, as real processes (`python -m cli`),
each with its own embedded Prefect server on the home's one Prefect database, all building
the same tiny untrained model: every one runs. Two for the same shot make one job (one
computes, the other follows it, `flows.live_jobs`) or, when the first is over before the
second looks, a second job that finds every frame done; the other shots get a job each.

Before the fixes such starts failed a submit now and then: the servers migrating the fresh
database together (`flows.orchestrator`; the first test below starts the servers alone, at
one moment, which fails that way far more often), or the untrained model rewritten by one
submit while the other checked the file it had chosen (`tasks.checkpoints.untrained`,
tests/test_untrained_builds.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from schemas.catalog import open_catalog, queries
from tests.shot_helpers import make_plate
from tests.test_cli import SHOT
from tests.test_cli_trust import REPO, _env, _finish, _svfx

SHOTS = [SHOT, SHOT, "demo/sq010/sh020", "demo/sq010/sh030"]
FRAMES = [1001, 1002]


# Four embedded Prefect servers of one home, asked for at one moment (a barrier), each
# entered and left; prints the errors.
START_SERVERS = """
import sys, threading
from pathlib import Path
from flows.orchestrator import EmbeddedPrefect
home, count = Path(sys.argv[1]), int(sys.argv[2])
barrier, errors = threading.Barrier(count), []
def start():
    barrier.wait()
    try:
        with EmbeddedPrefect(home, 240):
            pass
    except Exception as exc:
        errors.append(str(exc))
threads = [threading.Thread(target=start) for _ in range(count)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors)
sys.exit(1 if errors else 0)
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_embedded_servers_started_together_on_one_home_all_start(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", START_SERVERS, str(tmp_path / "prefect"), "4"],
        cwd=REPO,
        env={**_env(tmp_path), "PYTHONPATH": str(REPO)},  # no PREFECT_API_URL: embedded
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _submit_args(plate: str, home: Path, shot: str) -> list[str]:
    return [
        "submit", plate, "--shot", shot, "--colorspace", "lin_rec709", "--passes", "matte",
        "--output", str(home / "out"), "--no-previews", "--json",
    ]  # fmt: skip


def _jobs_by_shot(home: Path) -> dict[str, list[dict[str, Any]]]:
    catalog = open_catalog(f"sqlite:///{home / 'catalog.db'}")
    try:
        jobs, _total = queries.jobs_page(catalog.engine, limit=50)
    finally:
        catalog.close()
    by_shot: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        by_shot.setdefault(f"{job['show']}/{job['sequence']}/{job['shot']}", []).append(job)
    return by_shot


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_submits_started_together_from_one_home_all_run(tmp_path):
    plate = make_plate(tmp_path / "plates", frames=len(FRAMES))
    procs = [_svfx(tmp_path, *_submit_args(plate, tmp_path, shot)) for shot in SHOTS]
    ended = [_finish(proc) for proc in procs]
    for shot, (code, _out, err) in zip(SHOTS, ended, strict=True):
        assert code == 0, (shot, err)
        assert "Traceback" not in err, (shot, err)
    results = [json.loads(out) for _code, out, _err in ended]

    jobs = _jobs_by_shot(tmp_path)
    assert sorted(jobs) == sorted(set(SHOTS))
    for shot_jobs in jobs.values():
        assert [j["status"] for j in shot_jobs] == ["complete"] * len(shot_jobs), shot_jobs
    for shot in SHOTS[2:]:
        (job,) = jobs[shot]
        assert (job["frames_total"], job["frames_done"]) == (len(FRAMES), len(FRAMES))

    twins = jobs[SHOT]
    first, second = results[0], results[1]
    # what each twin printed: a run's summary (job_id) or the job it followed (id)
    printed = {r.get("job_id", r.get("id")) for r in (first, second)}
    if len(twins) == 1:  # one computed every frame, the other followed it
        assert printed == {twins[0]["id"]}
        assert twins[0]["frames_done"] == len(FRAMES)
    else:  # the second looked after the first had finished: nothing left to compute
        assert len(twins) == 2 and printed == {j["id"] for j in twins}
        assert sum(j["frames_done"] for j in twins) == len(FRAMES)
