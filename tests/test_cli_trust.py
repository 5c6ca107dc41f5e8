"""`svfx` under the faults and bad input an operator meets, as a user sees it: a message that
names the file and the reason, the documented exit code (docs/reference/exit-codes.md), never
a raw traceback.

In-process (CliRunner; the flow must never start): an output path that is a file, plate
frames that are links out of the allowed roots, a truncated catalog, every command's --help,
the embedded Prefect server that cannot start in time.

As real processes (`python -m cli`, the embedded Prefect server of its own):
- `svfx submit` killed with SIGKILL mid-shot leaves no process behind; the resubmit closes
  the dead job and recomputes only the frames that had not been written;
- two identical submits at once: the second follows the first, every frame is computed once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import typer

from cli import submit as submit_commands
from cli.main import app as svfx_app
from schemas.catalog import open_catalog, queries
from tests.shot_helpers import make_plate
from tests.test_cli import SHOT, _svfx_env, assert_refused, invoke, submit, why

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    _svfx_env(monkeypatch, tmp_path, tmp_path)

    def must_not_run(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("the flow was started: preflight let bad input through")

    monkeypatch.setattr(submit_commands, "_run_flow", must_not_run)
    return tmp_path


# -- refused before anything starts ----------------------------------------------------------
def test_an_output_path_that_is_a_file_is_refused_and_left_alone(home):
    plate = make_plate(home / "plates", frames=1)
    output = home / "passes.txt"
    output.write_text("an artist's notes")
    result = submit(plate, "--output", str(output))
    assert_refused(result, str(output), "is a file")
    assert output.read_text() == "an artist's notes"


def test_a_store_path_that_is_a_file_is_not_replaced(home):
    plate = make_plate(home / "plates", frames=1)
    store = home / "out/demo/sq010/sh010/sapiens2_v001/sh010_sapiens2_v001.zarr"
    store.parent.mkdir(parents=True)
    store.write_text("not a store")
    result = submit(plate, "--output", str(home / "out"))
    assert_refused(result, str(store), "not a folder")
    assert store.read_text() == "not a store"


def test_frames_linking_out_of_the_roots_are_refused(home, tmp_path_factory):
    plate = make_plate(home / "plates", frames=3)
    secret = make_plate(tmp_path_factory.mktemp("not_allowed"), frames=3)
    linked = home / "plates" / "astronaut.1002.exr"
    linked.unlink()
    linked.symlink_to(secret.replace("####", "1002"))
    result = submit(plate)
    assert_refused(result, "frame 1002", "outside the allowed roots", str(linked))
    assert "frame 1001" not in result.stderr


def test_a_truncated_catalog_is_named_with_exit_2(home):
    open_catalog(f"sqlite:///{home / 'catalog.db'}").close()
    data = (home / "catalog.db").read_bytes()
    (home / "catalog.db").write_bytes(data[: len(data) // 3])
    status = invoke("status")
    assert_refused(status, str(home / "catalog.db"))
    plate = make_plate(home / "plates", frames=1)
    assert_refused(submit(plate), str(home / "catalog.db"))


def _commands(group: typer.Typer, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [(*prefix, c.name or c.callback.__name__) for c in group.registered_commands]
    for sub in group.registered_groups:
        found += _commands(sub.typer_instance, (*prefix, sub.name))
    return found


@pytest.mark.parametrize("command", _commands(svfx_app), ids=" ".join)
def test_every_command_has_working_help(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0, why(result)
    assert "Usage:" in result.stdout


def test_help_promises_only_what_is_there():
    text = invoke("catalog", "jobs", "--help").stdout
    assert "SHOW[/SEQ[/SHOT]]" in text
    assert "--nonfinite" in invoke("submit", "--help").stdout


# -- real processes --------------------------------------------------------------------------
def _env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment: this home only, no Prefect API (the embedded server)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SVFX_", "PREFECT_"))}
    env.update(
        SVFX_HOME=str(home),
        SVFX_ALLOWED_ROOTS=str(home),
        PREFECT_HOME=str(home / "prefect"),
        SVFX_LOCAL_WORKERS="1",
        SVFX_PREFECT_START_TIMEOUT_S="240",
    )
    env.update(extra)
    return env


def _svfx(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env=_env(home),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _submit_args(plate: str, home: Path, *extra: str) -> list[str]:
    return [
        "submit", plate, "--shot", SHOT, "--colorspace", "lin_rec709", "--passes", "matte",
        "--output", str(home / "out"), "--chunk-frames", "1", "--no-previews", "--json", *extra,
    ]  # fmt: skip


def _finish(proc: subprocess.Popen[str], timeout: float = 400) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _records(home: Path) -> set[int]:
    folder = home / "out/demo/sq010/sh010/sapiens2_v001/.frame_records"
    return {int(p.name.split(".")[-2]) for p in folder.glob("*.json")} if folder.is_dir() else set()


def _wait_for(condition: Any, timeout: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} early: {proc.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.2)


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_killed_submit_leaves_nothing_behind_and_the_resubmit_redoes_only_the_rest(tmp_path):
    plate = make_plate(tmp_path / "plates", frames=6)  # killed after two: four or fewer left
    first = _svfx(tmp_path, *_submit_args(plate, tmp_path))
    _wait_for(lambda: len(_records(tmp_path)) >= 2, 600, first)
    family = psutil.Process(first.pid).children(recursive=True)
    assert any("flows.prefect_child" in " ".join(p.cmdline()) for p in family)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    _gone, alive = psutil.wait_procs(family, timeout=60)
    assert alive == [], [p.cmdline() for p in alive]
    written = _records(tmp_path)

    code, out, err = _finish(_svfx(tmp_path, *_submit_args(plate, tmp_path)))
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "complete"
    assert sorted(result["done"]) == sorted(set(range(1001, 1007)) - written)
    assert sorted(result["skipped"] + result["adopted"]) == sorted(written)
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    killed = queries.jobs_page(catalog.engine, limit=10)[0][-1]
    assert killed["id"] != result["job_id"] and killed["status"] in ("partial", "failed")
    assert "ended without finishing" in killed["message"]
    assert "Traceback" not in err


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_two_identical_submits_compute_each_frame_once(tmp_path):
    plate = make_plate(tmp_path / "plates", frames=6)
    first = _svfx(tmp_path, *_submit_args(plate, tmp_path))
    catalog_file = tmp_path / "catalog.db"

    def running() -> bool:
        if not catalog_file.exists():
            return False
        jobs = queries.jobs_page(open_catalog(f"sqlite:///{catalog_file}").engine, limit=5)[0]
        return any(j["status"] == "running" for j in jobs)

    _wait_for(running, 600, first)
    second = _svfx(tmp_path, *_submit_args(plate, tmp_path))
    code2, out2, err2 = _finish(second)
    code1, out1, err1 = _finish(first)
    assert (code1, code2) == (0, 0), (err1, err2)
    assert "following it instead of computing it twice" in err2
    computed = json.loads(out1)
    followed = json.loads(out2)
    assert sorted(computed["done"]) == list(range(1001, 1007))
    assert followed["id"] == computed["job_id"] and followed["status"] == "complete"
    jobs = queries.jobs_page(open_catalog(f"sqlite:///{catalog_file}").engine, limit=10)[0]
    assert [j["id"] for j in jobs] == [computed["job_id"]], "the second submit made no job"


@pytest.mark.timeout(300)
def test_an_orchestrator_that_cannot_start_in_time_is_a_message(tmp_path):
    plate = make_plate(tmp_path / "plates", frames=1)
    done = subprocess.run(
        [sys.executable, "-m", "cli", *_submit_args(plate, tmp_path)],
        cwd=REPO,
        env=_env(tmp_path, SVFX_PREFECT_START_TIMEOUT_S="0.05"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 2, done.stderr
    assert "did not answer within" in done.stderr and "SVFX_PREFECT_START_TIMEOUT_S" in done.stderr
    assert "Traceback" not in done.stderr
    assert _embedded_servers(tmp_path) == []


def _embedded_servers(home: Path) -> list[psutil.Process]:
    """Embedded Prefect servers still running for ``home``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if "flows.prefect_child" not in " ".join(proc.info["cmdline"] or []):
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("SVFX_HOME") == str(home):
                found.append(proc)
    return found


def test_a_checkpoint_with_nan_weights_is_refused_up_front_by_name(home):
    from safetensors.torch import load_file, save_file

    from tests.test_cli import _save_tiny

    root = home / "checkpoints"
    good = _save_tiny(root / "seg.safetensors", "seg")
    bad = _save_tiny(root / "normal.safetensors", "normal")
    tensors = load_file(str(bad))
    key = next(k for k, t in tensors.items() if t.is_floating_point() and t.ndim > 1)
    tensors[key][0, 0] = float("nan")
    save_file(tensors, str(bad), metadata={"untrained": "true"})
    plate = make_plate(home / "plates", frames=1)
    result = submit(plate, "--checkpoint-root", str(root), "--passes", "normal,seg")
    assert_refused(result, str(bad.resolve()), "NaN")
    assert str(good.resolve()) not in result.stderr
    assert "Traceback" not in result.stderr


def test_a_refusal_imports_neither_torch_nor_prefect_nor_dask(tmp_path):
    """Bad input is refused in about a second even on a busy machine: before the heavy
    imports (each takes seconds there)."""
    plate = make_plate(tmp_path / "plates", frames=1)
    code = (
        "import sys\n"
        "from cli.main import main\n"
        f"sys.argv = ['svfx', 'submit', {plate!r}, '--shot', 'demo/sq010/sh010', "
        f"'--output', '/etc/not-allowed']\n"
        "try:\n    main()\nexcept SystemExit as exit:\n"
        "    heavy = [m for m in ('torch', 'prefect', 'distributed') if m in sys.modules]\n"
        "    print(exit.code, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=_env(tmp_path), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.strip() == "2 []", done.stdout + done.stderr
    assert "outside the allowed roots" in done.stderr


def test_the_untrained_warning_says_why_once_in_bold(monkeypatch, tmp_path):
    """Said once (not "random weights (... UNTRAINED models with random weights)"), in bold,
    with the reason the checkpoint choice gives; with a root given, it must not claim none
    was given."""
    from types import SimpleNamespace

    from rich.console import Console

    from tasks.checkpoints.choice import resolve_checkpoints

    empty = tmp_path / "models"
    empty.mkdir()
    plate = SimpleNamespace(colorspace_guessed=False)
    spec = SimpleNamespace(model_size="auto")
    for root, reason in ((None, "no checkpoint root was given"), (empty, "no *.safetensors under")):
        printed = Console(record=True, width=300, force_terminal=True, color_system="standard")
        monkeypatch.setattr(submit_commands, "err", printed)
        choice = resolve_checkpoints(
            ["seg", "depth"], "auto", root=root and str(empty), untrained_dir=tmp_path / "u"
        )
        plan = SimpleNamespace(
            untrained=list(choice.checkpoints), checkpoint_note=choice.reason, plate=plate
        )
        submit_commands._warn_before_run(plan, spec)
        styled = printed.export_text(styles=True, clear=False)
        text = printed.export_text()
        assert text.startswith(f"UNTRAINED MODELS: seg, depth run with random weights ({reason}")
        said = text.replace(str(empty), "ROOT").lower()  # the test's folder says untrained
        assert said.count("untrained") == 1 and said.count("random weights") == 1
        assert styled.startswith("\x1b[1;33mUNTRAINED") and styled.count("\x1b[1;33m") == 1
