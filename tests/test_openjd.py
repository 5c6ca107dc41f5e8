"""`svfx farm openjd`: the Open Job Description template of a shot, validated by
`openjd check`, then run on this machine with `openjd run`: its Workers step and its Shot
step at once (two processes, as two farm hosts would), until the shot completes and the
workers are shut down. Tiny UNTRAINED models, a CPU worker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from flows.demo import DEMO_COLORSPACE
from schemas.catalog import open_catalog, queries
from tests.shot_helpers import make_plate

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[1]


def _openjd() -> str:
    found = shutil.which("openjd") or str(Path(sys.executable).parent / "openjd")
    if not Path(found).exists():
        pytest.skip("openjd-cli is not installed (the dev extra)")
    return found


def _template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    env = {
        "SVFX_HOME": str(tmp_path / "home"),
        "SVFX_ALLOWED_ROOTS": str(tmp_path),
        "PYTHONPATH": str(ROOT),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("SVFX_CATALOG_URL", "SVFX_CHECKPOINT_ROOT", "SVFX_DASK_ADDRESS", "SVFX_PUBLISH"):
        monkeypatch.delenv(name, raising=False)
    pattern = make_plate(tmp_path / "plates", frames=4)
    template = tmp_path / "shot.openjd.yaml"
    args = [
        "farm", "openjd", pattern, "--shot", "demo/sq010/sh010", "-o", str(template),
        "--passes", "normal", "--colorspace", DEMO_COLORSPACE, "--output", str(tmp_path / "out"),
        "--workers", "1", "--gpus-per-worker", "0", "--python", sys.executable,
        "--scheduler-file", str(tmp_path / "farm" / "scheduler.json"),
    ]  # fmt: skip
    made = CliRunner().invoke(app, args)
    assert made.exit_code == 0, made.output
    return template, {**os.environ, **env}


def test_the_template_is_valid_openjd_and_embeds_the_spec(tmp_path, monkeypatch) -> None:
    template, env = _template(tmp_path, monkeypatch)
    checked = subprocess.run([_openjd(), "check", str(template)], capture_output=True,
                             text=True, env=env, timeout=120)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "passes validation" in checked.stdout
    document = yaml.safe_load(template.read_text())
    assert [s["name"] for s in document["steps"]] == ["Shot", "Workers"]
    spec_file = document["steps"][0]["script"]["embeddedFiles"][0]
    assert (
        '"shot": "sh010"' in spec_file["data"]
        and '"passes": [\n  "normal"\n ]' in spec_file["data"]
    )
    workers = document["steps"][1]["parameterSpace"]["taskParameterDefinitions"][0]
    assert workers["range"] == "1-{{Param.Workers}}"
    assert not any(k in template.read_text() for k in ("AWS_SECRET", "SVFX_CATALOG_URL"))


@pytest.mark.slow
def test_openjd_run_workers_and_shot_until_the_shot_completes(tmp_path, monkeypatch) -> None:
    template, env = _template(tmp_path, monkeypatch)
    openjd = _openjd()
    logs = tmp_path / "logs"
    logs.mkdir()
    with (logs / "workers.log").open("wb") as wlog, (logs / "shot.log").open("wb") as slog:
        workers = subprocess.Popen(
            [openjd, "run", str(template), "--step", "Workers", "-p", "Workers=1"],
            stdout=wlog, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        try:
            shot = subprocess.run([openjd, "run", str(template), "--step", "Shot"],
                                  stdout=slog, stderr=subprocess.STDOUT, env=env,
                                  timeout=480)  # fmt: skip
            worker_code = workers.wait(timeout=90)
        finally:
            if workers.poll() is None:
                workers.kill()
                workers.wait()
    shot_log = (logs / "shot.log").read_text(errors="replace")
    worker_log = (logs / "workers.log").read_text(errors="replace")
    assert shot.returncode == 0, shot_log[-4000:]
    assert worker_code == 0, worker_log[-4000:]
    assert "worker 1 -> tcp://" in worker_log
    catalog = open_catalog(f"sqlite:///{tmp_path / 'home' / 'catalog.db'}")
    [job] = queries.jobs_page(catalog.engine, "demo", "sq010", "sh010")[0]
    assert (job["status"], job["frames_done"]) == ("complete", 4), job
    exrs = sorted((tmp_path / "out/demo/sq010/sh010/sapiens2_v001").glob("*.exr"))
    assert len(exrs) == 4
    assert (tmp_path / "farm" / "scheduler.json.done").exists()


def test_gpu_workers_ask_the_farm_for_gpu_hosts(tmp_path) -> None:
    from cli.openjd_template import job_template, template_yaml

    spec = {"show": "demo", "sequence": "sq010", "shot": "sh010", "version": "v002"}
    gpu = job_template(spec, python="/venv/bin/python", scheduler_file="/s.json",
                       gpus_per_worker="2")  # fmt: skip
    path = tmp_path / "gpu.yaml"
    path.write_text(template_yaml(gpu))
    checked = subprocess.run([_openjd(), "check", str(path)], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    workers = gpu["steps"][1]
    assert workers["hostRequirements"] == {"amounts": [{"name": "amount.worker.gpu", "min": 2}]}
    cpu = job_template(spec, python="p", scheduler_file="s", gpus_per_worker="0")
    assert "hostRequirements" not in cpu["steps"][1]
    assert gpu["name"] == "svfx demo/sq010/sh010 v002"
