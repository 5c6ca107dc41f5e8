"""The `svfx` command line, in-process with typer's CliRunner.

- bad input (shot name, pass, model size, paths, pattern, colour space, checkpoints) exits 2
  with a message that names the problem, in preflight: the flow is never started;
- `svfx models` describes and verifies the checkpoints under a root;
- one real shot through `svfx submit` (Prefect test harness, a LocalCluster of two worker
  processes, tiny UNTRAINED models), then `svfx status` and the catalog commands; a second
  shot with a truncated frame exits 1 naming that frame.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import traceback
from pathlib import Path
from typing import Any

import OpenEXR
import pytest
import torch
from typer.testing import CliRunner, Result

from cli import submit as submit_commands
from cli.main import app as svfx_app
from tasks.precision import choose_precision
from tests.shot_helpers import make_plate

SHOT = "demo/sq010/sh010"
runner = CliRunner()


def invoke(*args: str) -> Result:
    return runner.invoke(svfx_app, list(args))


def why(result: Result) -> str:
    """What went wrong, for assertion messages: the output and any traceback."""
    text = f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    if result.exc_info and not isinstance(result.exception, SystemExit):
        text += "".join(traceback.format_exception(*result.exc_info))
    return text


def as_json(result: Result) -> Any:
    """stdout must be JSON and nothing else (progress and warnings go to stderr)."""
    return json.loads(result.stdout)


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _svfx_env(mp: pytest.MonkeyPatch, home: Path, *roots: Path) -> None:
    mp.setenv("SVFX_HOME", str(home))
    mp.setenv("SVFX_ALLOWED_ROOTS", ",".join(str(r) for r in roots or (home,)))
    (home / "prefect").mkdir(parents=True, exist_ok=True)
    mp.setenv("PREFECT_HOME", str(home / "prefect"))  # `_settings` would setdefault it
    for name in (
        "SVFX_CATALOG_URL",
        "SVFX_CHECKPOINT_ROOT",
        "SVFX_DASK_ADDRESS",
        "SVFX_OUTPUT_ROOT",
        "SVFX_CONFIG",
    ):
        mp.delenv(name, raising=False)


def _save_tiny(path: Path, task: str) -> Path:
    from sapiens.loading import save_model
    from sapiens.model import build_model

    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(build_model("tiny", task, input_hw=(256, 192), seed=0), path)
    return path


# -- preflight: bad input fails before any flow work ------------------------------------------
@pytest.fixture(scope="module")
def plate(tmp_path_factory) -> str:
    return make_plate(tmp_path_factory.mktemp("plates"), frames=2)


@pytest.fixture
def home(tmp_path, monkeypatch, plate) -> Path:
    """SVFX_HOME in tmp; the plate's directory and the home are the allowed roots. Running a
    flow is an error: every test using this fixture must stop in preflight."""
    _svfx_env(monkeypatch, tmp_path, tmp_path, Path(plate).parent)

    def must_not_run(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("the flow was started: preflight let bad input through")

    monkeypatch.setattr(submit_commands, "_run_flow", must_not_run)
    return tmp_path


def submit(plate: str, *extra: str, shot: str = SHOT) -> Result:
    args = ["submit", plate, "--shot", shot, "--colorspace", "lin_rec709", "--passes", "normal"]
    return invoke(*args, *extra)


def assert_refused(result: Result, *words: str) -> None:
    assert result.exit_code == 2, why(result)
    assert not isinstance(result.exception, AssertionError), result.exception
    assert result.stderr.startswith("error: "), result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


@pytest.mark.parametrize("shot", ["demo/sq010", "demo/sq010/sh010/extra", "sh010"])
def test_a_malformed_shot_is_refused(home, plate, shot):
    assert_refused(submit(plate, shot=shot), "--shot must be SHOW/SEQ/SHOT", repr(shot))


def test_brackets_in_a_message_are_shown_as_typed(home, plate):
    result = submit(plate, shot="demo/[sq]/sh010")
    assert_refused(result, "sequence", "'[sq]' is not a usable name")


def test_an_unknown_pass_is_refused(home, plate):
    result = submit(plate, "--passes", "normal,shadow")
    assert_refused(result, "unknown pass 'shadow'", "known: normal")


def test_a_pass_given_twice_is_refused(home, plate):
    assert_refused(submit(plate, "--passes", "seg,normal,seg"), "pass 'seg' is given twice")


def test_a_checkpoint_for_a_pass_made_from_another_is_refused(home, plate, tmp_path):
    weights = tmp_path / "parts.safetensors"
    weights.write_bytes(b"{}")
    result = submit(plate, "--passes", "parts", "--checkpoint", f"parts={weights}")
    assert_refused(result, "parts has no checkpoint of its own", "seg=FILE")


def test_passes_that_run_no_model_alone_are_refused(home, plate):
    result = submit(plate, "--passes", "motion")
    assert_refused(result, "passes motion run no model", "--passes motion,normal")


def test_an_unknown_tiles_setting_is_refused(home, plate):
    result = submit(plate, "--tiles", "faces")
    assert_refused(result, "tiles", "'people' or 'all'")
    assert result.stderr.count("\n") == 1, result.stderr


def test_an_unknown_model_size_is_refused(home, plate):
    result = submit(plate, "--model-size", "3b")
    assert_refused(result, "unknown model size '3b'", "tiny")


def test_a_plate_outside_the_allowed_roots_is_refused(home, plate, tmp_path_factory):
    # long enough that an 80-column console would have folded it
    elsewhere = tmp_path_factory.mktemp("a_directory_outside_every_allowed_root_" + "x" * 40)
    outside = make_plate(elsewhere, frames=1)
    result = submit(outside)
    assert_refused(result, "SVFX_ALLOWED_ROOTS", "outside the allowed roots", outside)


def test_a_pattern_matching_nothing_is_refused(home, plate):
    missing = plate.replace("astronaut.", "nobody.")
    result = submit(missing)
    assert_refused(result, "matches no file", missing, "astronaut.1001-1002#.exr")


def test_an_unknown_colour_space_is_refused(home, plate):
    result = submit(plate, "--colorspace", "not_a_colourspace")
    assert_refused(result, "colour space", "not_a_colourspace")


def test_a_checkpoint_of_another_task_is_refused(home, plate):
    # a seg model under a normal model's name: the header, not the name, decides
    root = home / "checkpoints"
    _save_tiny(root / "sapiens2_tiny_normal.safetensors", "seg")
    result = submit(plate, "--checkpoint-root", str(root))
    assert_refused(result, "normal: no sapiens2_tiny normal checkpoint", "sapiens2_tiny/seg")


def test_a_root_without_the_pass_is_refused(home, plate):
    root = home / "only_seg"
    _save_tiny(root / "sapiens2_tiny_seg.safetensors", "seg")
    result = submit(plate, "--checkpoint-root", str(root), "--passes", "normal,seg")
    assert_refused(result, "no sapiens2_tiny normal checkpoint", "found: sapiens2_tiny/seg")
    assert "seg:" not in result.stderr  # the seg pass has its checkpoint


def test_a_checkpoint_root_outside_the_allowed_roots_is_refused(home, plate, tmp_path_factory):
    root = tmp_path_factory.mktemp("foreign_checkpoints")
    result = submit(plate, "--checkpoint-root", str(root))
    assert_refused(result, "checkpoint root", str(root), "SVFX_ALLOWED_ROOTS")


# -- svfx models ---------------------------------------------------------------------------
def test_models_lists_a_tiny_checkpoint_as_json(home):
    root = home / "checkpoints"
    path = _save_tiny(root / "sapiens2_tiny_seg.safetensors", "seg")
    result = invoke("models", "--checkpoint-root", str(root), "--json", "--full")
    assert result.exit_code == 0, result.output
    (row,) = as_json(result)
    assert row["path"] == str(path.resolve())
    assert row["arch"] == "sapiens2_tiny"
    assert row["task"] == "seg"
    assert row["sha256"] == _sha(path)
    assert row["trained"] is False
    assert row["status"] == "ok (UNTRAINED)"


def test_models_marks_a_corrupt_checkpoint_bad(home):
    root = home / "checkpoints"
    good = _save_tiny(root / "sapiens2_tiny_seg.safetensors", "seg")
    corrupt = root / "sapiens2_tiny_normal.safetensors"
    corrupt.write_bytes(good.read_bytes()[:4096])  # a download cut short
    result = invoke("models", "--checkpoint-root", str(root), "--json")
    assert result.exit_code == 2, result.output
    rows = {Path(r["path"]).name: r for r in as_json(result)}
    assert rows[corrupt.name]["status"].startswith("BAD: ")
    assert "truncated" in rows[corrupt.name]["status"]
    assert rows[good.name]["status"] == "ok (UNTRAINED)"
    table = invoke("models", "--checkpoint-root", str(root))
    assert table.exit_code == 2
    assert "BAD" in table.stdout


def test_full_verification_catches_a_checkpoint_with_nan(home):
    from safetensors.torch import load_file, save_file

    root = home / "checkpoints"
    path = _save_tiny(root / "sapiens2_tiny_seg.safetensors", "seg")
    tensors = load_file(str(path))
    key = next(k for k, t in tensors.items() if t.is_floating_point() and t.ndim > 1)
    tensors[key][0, 0] = float("nan")
    save_file(tensors, str(path), metadata={"untrained": "true"})
    quick = invoke("models", "--checkpoint-root", str(root), "--json")
    assert quick.exit_code == 0  # the header is fine
    full = invoke("models", "--checkpoint-root", str(root), "--json", "--full")
    assert full.exit_code == 2
    (row,) = as_json(full)
    assert row["status"].startswith("BAD: ") and "NaN" in row["status"]


def test_models_without_a_root_says_so(home):
    result = invoke("models")
    assert_refused(result, "no checkpoint root", "SVFX_CHECKPOINT_ROOT")


# -- a real shot through the flow -------------------------------------------------------------
@pytest.fixture(scope="module")
def dask_address():
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as local:
        yield local.scheduler_address


@pytest.fixture(scope="module")
def shot_home(tmp_path_factory):
    """One SVFX_HOME for the module's real shots (the catalog queries read what they made)."""
    base = tmp_path_factory.mktemp("shot")
    with pytest.MonkeyPatch.context() as mp:
        _svfx_env(mp, base / "home", base)
        yield base


@pytest.fixture(scope="module")
def submitted(shot_home, prefect_api, dask_address) -> dict[str, Any]:
    pattern = make_plate(shot_home / "plates", frames=4)
    out = shot_home / "out"
    result = invoke(
        "submit",
        pattern,
        "--shot",
        SHOT,
        "--colorspace",
        "lin_rec709",
        "--passes",
        "normal,matte",
        "--frames",
        "1001-1004",
        "--output",
        str(out),
        "--dask-address",
        dask_address,
        "--no-previews",
        "--json",
    )
    return {"cli": result, "pattern": pattern, "out": out}


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_submit_runs_the_shot(submitted):
    result = submitted["cli"]
    assert result.exit_code == 0, why(result)
    summary = as_json(result)
    assert summary["status"] == "complete", summary["failed"]
    assert sorted(summary["done"]) == [1001, 1002, 1003, 1004]
    assert summary["untrained"] == ["normal", "matte"]
    assert "UNTRAINED MODELS" in result.stderr  # said loudly, on stderr
    exrs = sorted(Path(summary["output_root"]).glob("*.exr"))
    assert [p.name for p in exrs] == [f"sh010_sapiens2_v001.{f}.exr" for f in range(1001, 1005)]
    assert Path(summary["output_root"]).is_relative_to(submitted["out"])
    # what the workers' models ran in, and why, in the summary and every EXR's header
    auto = choose_precision("auto", torch.device("cpu"))
    assert list(summary["precisions"]) == [f"{auto.name}: {auto.reason}"]
    assert summary["precisions"][f"{auto.name}: {auto.reason}"]  # the workers, host:pid
    with OpenEXR.File(str(exrs[0])) as exr:
        header = dict(exr.parts[0].header)
    assert header["svfx/precision"] == auto.name
    assert header["svfx/precisionReason"] == auto.reason
    # and whether they ran compiled: the untrained stand-ins never are by default
    assert header["svfx/compiled"].endswith(
        "not compiled: auto: a 192x256 (w x h) stand-in runs eagerly"
    )
    assert {"normal", "matte"} <= set(header["svfx/compiled"].split(":")[0].split(", "))


@pytest.mark.timeout(300)
def test_status_and_catalog_queries_after_a_shot(submitted):
    job_id = as_json(submitted["cli"])["job_id"]

    status = invoke("status", "--json")
    assert status.exit_code == 0, status.output
    (job,) = [j for j in as_json(status) if j["id"] == job_id]
    assert job["status"] == "complete"
    assert (job["frames_total"], job["frames_done"], job["frames_failed"]) == (4, 4, 0)
    one = invoke("status", str(job_id), "--json")
    assert [j["id"] for j in as_json(one)] == [job_id]
    assert invoke("status", "999999").exit_code == 2
    assert "flagged_frames" in as_json(one)[0]
    with pytest.MonkeyPatch.context() as mp:  # every scored frame is above so low a threshold
        mp.setenv("SVFX_QC_FLICKER_THRESHOLD", "0.0001")
        flagged = invoke("status", str(job_id))
    assert flagged.exit_code == 0, flagged.output
    for pass_name in ("normal", "matte"):
        line = f"job {job_id} {pass_name} flickers (temporal QC) on frames 1001 ("
        assert line in flagged.stderr, flagged.stderr

    shots = invoke("catalog", "shots", "--json")
    assert shots.exit_code == 0, shots.output
    (row,) = [r for r in as_json(shots) if r["shot"] == "sh010"]
    assert row["passes"] == {"matte": 4, "normal": 4}
    assert row["job_status"] == "complete"

    outputs = invoke("catalog", "outputs", SHOT, "--json", "--pass", "normal", "--kind", "exr")
    assert outputs.exit_code == 0, outputs.output
    rows = as_json(outputs)
    assert len(rows) == 4
    assert {r["pass_name"] for r in rows} == {"normal"} and {r["kind"] for r in rows} == {"exr"}
    order = [(r["created_at"], r["id"]) for r in rows]
    assert order == sorted(order, reverse=True)  # newest first
    assert sorted(r["frame"] for r in rows) == [1001, 1002, 1003, 1004]
    for r in rows:
        assert Path(r["uri"]).is_file()
        assert r["sha256"] == _sha(r["uri"])

    exr = next(r for r in rows if r["frame"] == 1002)["uri"]
    provenance = invoke("catalog", "provenance", exr, "--json")
    assert provenance.exit_code == 0, provenance.output
    record = as_json(provenance)
    assert [j["id"] for j in record["jobs"]] == [job_id]
    tasks = {c["task"]: c for c in record["checkpoints"]}
    assert set(tasks) == {"normal", "matting"}
    for checkpoint in tasks.values():
        assert checkpoint["arch"] == "sapiens2_tiny" and checkpoint["trained"] is False
        assert checkpoint["sha256"] == _sha(checkpoint["path"])
    (plate_frame,) = record["plate_frames"]
    assert plate_frame["frame"] == 1002
    plate_sha = plate_frame["sha256"]
    assert plate_sha == _sha(submitted["pattern"].replace("####", "1002"))
    assert invoke("catalog", "provenance", exr + ".nope", "--json").exit_code == 2

    stale = invoke("catalog", "invalidated", "--plate-sha256", plate_sha, "--json")
    assert stale.exit_code == 0, stale.output
    stale_rows = as_json(stale)
    assert {r["frame"] for r in stale_rows} == {1002}
    assert {(r["pass_name"], r["kind"]) for r in stale_rows} >= {
        ("normal", "exr"),
        ("matte", "exr"),
    }
    assert exr in {r["uri"] for r in stale_rows}
    assert invoke("catalog", "invalidated", "--json").exit_code == 2

    jobs = invoke("catalog", "jobs", "demo", "--json")
    assert jobs.exit_code == 0, jobs.output
    assert job_id in [j["id"] for j in as_json(jobs)]
    assert {j["show"] for j in as_json(jobs)} == {"demo"}
    assert as_json(invoke("catalog", "jobs", "other_show", "--json")) == []


@pytest.mark.timeout(300)
def test_a_truncated_frame_gives_partial_naming_it(submitted, shot_home, dask_address):
    plates = shot_home / "plates_sh020"
    shutil.copytree(Path(submitted["pattern"]).parent, plates)
    bad = plates / "astronaut.1003.exr"
    bad.write_bytes(bad.read_bytes()[:500])
    result = invoke(
        "submit",
        str(plates / "astronaut.####.exr"),
        "--shot",
        "demo/sq010/sh020",
        "--colorspace",
        "lin_rec709",
        "--passes",
        "normal,matte",
        "--output",
        str(shot_home / "out"),
        "--dask-address",
        dask_address,
        "--no-previews",
    )
    assert result.exit_code == 1 and result.exception is not None, why(result)
    assert isinstance(result.exception, SystemExit), why(result)
    assert "partial" in result.stdout
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("frame 1003: ")]
    assert str(bad) in line  # whole, not folded across lines

    status = invoke("catalog", "jobs", "demo/sq010/sh020")
    assert status.exit_code == 0
    assert "partial" in status.stdout
    (job,) = as_json(invoke("catalog", "jobs", "demo/sq010/sh020", "--json"))
    assert job["status"] == "partial"
    assert [f["frame"] for f in job["failed_frames"]] == [1003]
    assert f"job {job['id']} frame 1003: " in status.stderr
    shots = {r["shot"]: r for r in as_json(invoke("catalog", "shots", "--json"))}
    assert shots["sh020"]["passes"] == {"matte": 3, "normal": 3}
    assert shots["sh010"]["passes"] == {"matte": 4, "normal": 4}


@pytest.mark.timeout(300)
def test_a_resubmit_with_nothing_to_do_answers_without_a_cluster(submitted, monkeypatch):
    """Every frame done on disk and in the catalog: the job is recorded and closed here, no
    Dask, no flow (a resubmit of the demo took 13 s for starting them)."""

    def must_not_run(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("the flow was started for a run with nothing to compute")

    monkeypatch.setattr(submit_commands, "_run_flow", must_not_run)
    args = ["--shot", SHOT, "--colorspace", "lin_rec709", "--passes", "normal,matte"]
    args += ["--frames", "1001-1004", "--output", str(submitted["out"]), "--no-previews"]
    result = invoke("submit", submitted["pattern"], *args, "--json")
    assert result.exit_code == 0, why(result)
    summary = as_json(result)
    assert summary["status"] == "complete"
    assert (summary["done"], sorted(summary["skipped"])) == ([], [1001, 1002, 1003, 1004])
    assert summary["job_id"] != as_json(submitted["cli"])["job_id"]  # recorded as a run
    status = as_json(invoke("status", str(summary["job_id"]), "--json"))
    assert status[0]["status"] == "complete"


@pytest.mark.timeout(300)
def test_stabilise_writes_the_next_version_and_refuses_what_it_cannot(submitted, dask_address):
    """`svfx stabilise`: the per-frame v001 fused into v002 beside it, no model run; a version
    the catalog does not know refused in one line; a second run (by the command's first
    spelling, `svfx stabilize`, still taken) finds v002 done."""
    args = ["--dask-address", dask_address]
    result = invoke("stabilise", SHOT, "--version", "v001", *args, "--json")
    assert result.exit_code == 0, why(result)
    summary = as_json(result)
    assert summary["status"] == "complete" and sorted(summary["done"]) == [1001, 1002, 1003, 1004]
    assert summary["output_root"].endswith("/sh010/sapiens2_v002")
    assert (
        Path(as_json(submitted["cli"])["output_root"]) / "sh010_sapiens2_v001.1001.exr"
    ).exists()
    again = as_json(invoke("stabilize", SHOT, "--version", "v001", *args, "--json"))
    assert again["output_root"] == summary["output_root"] and again["done"] == []

    unknown = invoke("stabilise", SHOT, "--version", "v007")
    assert unknown.exit_code == 2
    assert unknown.stderr.strip().splitlines() == [
        "error: demo/sq010/sh010 has no per-frame version v007 in the catalog (it has v001, v002)"
    ]


@pytest.mark.timeout(300)
def test_submit_temporal_stabilise_runs_both_versions(submitted, dask_address):
    args = ["--shot", SHOT, "--colorspace", "lin_rec709", "--passes", "normal,matte"]
    args += ["--frames", "1001-1004", "--output", str(submitted["out"]), "--no-previews"]
    args += ["--version", "v005", "--temporal", "stabilize", "--dask-address", dask_address]
    result = invoke("submit", submitted["pattern"], *args, "--json")
    assert result.exit_code == 0, why(result)
    summary = as_json(result)
    assert summary["status"] == "complete"
    assert summary["output_root"].endswith("/sapiens2_v006")  # the next free after v005
    per_frame = as_json(invoke("status", summary["extras"]["per_frame_job"], "--json"))[0]
    assert per_frame["spec"]["version"] == "v005" and per_frame["status"] == "complete"
