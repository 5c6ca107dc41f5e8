"""Sapiens v1 files beside Sapiens2 ones: described by their tensors (never their names), listed
by `svfx models` with their family, chosen only for the passes that run on v1 (`--family
sapiens1`, and depth), and refused with the reason when given explicitly for a pass v1 does not
have. Tiny v1 models use the "sapiens_test" size row of tests/test_convert_pth.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cli.main import app as svfx_app
from sapiens.loading import save_model
from sapiens.model import build_model
from schemas.spec import parse_spec
from tasks.checkpoints.auto_size import pick_model_size
from tasks.checkpoints.choice import CheckpointChoice, resolve_checkpoints
from tasks.checkpoints.convert import convert_checkpoint
from tasks.checkpoints.errors import CheckpointChoiceError
from tasks.checkpoints.families import size_label
from tasks.checkpoints.files import CheckpointRef, describe_checkpoint
from tests.test_convert_pth import DEPTH, FFN, HEADS, C, v1_state

runner = CliRunner()


@pytest.fixture(autouse=True)
def tiny_v1_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sapiens import v1_arch

    monkeypatch.setitem(v1_arch.V1_SIZES, "sapiens_test", (C, DEPTH, HEADS, FFN))
    monkeypatch.setenv("SVFX_HOME", str(tmp_path / "home"))


def v1_file(path: Path, task: str) -> Path:
    """A tiny v1 `task` model, saved as released (.pth) and converted to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".pth")
    torch.save({"state_dict": v1_state(task), "meta": {}}, src)
    convert_checkpoint(src, path)
    src.unlink()
    return path


def sapiens2_file(path: Path, task: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(build_model("tiny", task, input_hw=(256, 192), seed=0), path)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ref(arch: str, task: str, family: str = "sapiens2") -> CheckpointRef:
    return CheckpointRef(f"/ckpt/{arch}_{task}.safetensors", "0" * 64, arch, task, True, 1, family)


# -- describing and listing -------------------------------------------------------------------
def test_the_tensors_not_the_name_say_the_family(tmp_path: Path) -> None:
    path = v1_file(tmp_path / "sapiens2_tiny_normal.safetensors", "seg")  # a misleading name
    found = describe_checkpoint(path)
    assert (found.family, found.arch, found.task, found.size) == (
        "sapiens1",
        "sapiens_test",
        "seg",
        "test",
    )
    assert found.sha256 == sha256(path) and found.trained
    tiny = describe_checkpoint(sapiens2_file(tmp_path / "sapiens_test_seg.safetensors", "seg"))
    assert (tiny.family, tiny.arch, tiny.size) == ("sapiens2", "sapiens2_tiny", "tiny")


@pytest.mark.parametrize(
    ("arch", "label"),
    [
        ("sapiens2_1b", "1b"),
        ("sapiens2_1b_4k", "1b-4k"),
        ("sapiens_0.3b", "0.3b"),
        ("sapiens_2b", "2b"),
        ("sapiens1_custom", "custom"),
    ],
)
def test_size_labels_of_both_families(arch: str, label: str) -> None:
    assert size_label(arch) == label


def test_models_lists_v1_files_beside_sapiens2_ones(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    v1 = v1_file(root / "v1" / "seg.safetensors", "seg")
    v2 = sapiens2_file(root / "v2" / "seg.safetensors", "seg")
    result = runner.invoke(svfx_app, ["models", "--checkpoint-root", str(root), "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    rows = {row["path"]: row for row in json.loads(result.stdout)}
    v1_row, v2_row = rows[str(v1.resolve())], rows[str(v2.resolve())]
    assert v1_row["family"] == "sapiens1" and v1_row["arch"] == "sapiens_test"
    assert size_label(v1_row["arch"]) == "test"
    assert (v1_row["task"], v1_row["sha256"], v1_row["status"]) == ("seg", sha256(v1), "ok")
    assert (v2_row["family"], v2_row["arch"], v2_row["task"]) == (
        "sapiens2",
        "sapiens2_tiny",
        "seg",
    )
    assert v2_row["sha256"] == sha256(v2)
    full = runner.invoke(svfx_app, ["models", "--checkpoint-root", str(root), "--json", "--full"])
    assert full.exit_code == 0, full.output
    assert {row["status"] for row in json.loads(full.stdout)} == {"ok", "ok (UNTRAINED)"}
    table = runner.invoke(
        svfx_app, ["models", "--checkpoint-root", str(root)], env={"COLUMNS": "400"}
    )
    assert table.exit_code == 0, table.output
    assert "family" in table.stdout and "sapiens1" in table.stdout and "sapiens2" in table.stdout
    assert "BAD" not in table.stdout


# -- choosing among the files under a root ----------------------------------------------------
def test_a_v1_size_never_wins_auto_for_the_sapiens2_passes() -> None:
    found = [
        ref("sapiens2_0.4b", "normal"),
        ref("sapiens2_0.4b", "seg"),
        ref("sapiens_1b", "normal", "sapiens1"),  # v1 has a "1b" too: larger, complete
        ref("sapiens_1b", "seg", "sapiens1"),
    ]
    size, reason = pick_model_size({"normal": "normal", "seg": "seg"}, found, root="/ckpt")
    assert size == "0.4b" and "1b" not in reason


def test_v1_files_under_the_root_are_not_chosen_for_sapiens2_passes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    normal = sapiens2_file(root / "n.safetensors", "normal")
    v1_file(root / "v1_normal.safetensors", "normal")
    v1_file(root / "v1_seg.safetensors", "seg")
    for size in ("auto", "tiny"):
        choice = resolve_checkpoints(["normal"], size, root=str(root))
        assert choice.size == "tiny"
        assert choice.checkpoints["normal"].path == str(normal.resolve())
    with pytest.raises(CheckpointChoiceError) as err:
        resolve_checkpoints(["normal", "seg"], "tiny", root=str(root))
    message = str(err.value)
    assert "seg: no sapiens2_tiny seg checkpoint" in message
    assert "found: sapiens2_tiny/normal; 2 Sapiens v1 files, not used by this pass" in message


def test_a_root_of_only_v1_files_is_an_error_not_random_weights(tmp_path: Path) -> None:
    root = tmp_path / "root"
    v1_file(root / "seg.safetensors", "seg")
    with pytest.raises(CheckpointChoiceError) as err:
        resolve_checkpoints(["seg"], "auto", root=str(root), untrained_dir=tmp_path / "u")
    assert "no usable Sapiens2 checkpoint under" in str(err.value)
    assert "1 Sapiens v1 files were left out: these passes run Sapiens2, --family sapiens1" in str(
        err.value
    )
    assert not (tmp_path / "u").exists()


# -- v1 files given explicitly ----------------------------------------------------------------
def _explicit(pass_name: str, path: Path) -> CheckpointChoice:
    """Resolve as `flows.planning.plan_shot` does, from a spec's `checkpoints`."""
    spec = parse_spec(
        {
            "plate": "/p/plate.####.exr",
            "show": "x",
            "sequence": "s",
            "shot": "h",
            "passes": [pass_name],
            "checkpoints": {pass_name: str(path)},
        }
    )
    return resolve_checkpoints(  # pose and depth also run seg, which has no file: untrained
        spec.model_passes,
        spec.model_size,
        explicit=dict(spec.checkpoints),
        untrained_dir=path.parent / "untrained",
    )


@pytest.mark.parametrize("pass_name", ["pointmap", "albedo", "matte"])
def test_a_v1_file_for_a_sapiens2_only_pass_is_refused(tmp_path: Path, pass_name: str) -> None:
    path = v1_file(tmp_path / f"{pass_name}.safetensors", "depth")
    with pytest.raises(CheckpointChoiceError) as err:
        _explicit(pass_name, path)
    message = str(err.value)
    assert f"{pass_name}: {path} is a Sapiens v1 file (sapiens_test depth)" in message
    assert "v1 has depth, normal, seg and pose models only" in message


@pytest.mark.parametrize("pass_name", ["normal", "seg", "pose", "depth"])
def test_a_v1_file_for_a_pass_v1_has_is_used_whatever_the_family(
    tmp_path: Path, pass_name: str
) -> None:
    path = v1_file(tmp_path / f"{pass_name}.safetensors", pass_name)
    choice = _explicit(pass_name, path)
    chosen = choice.checkpoints[pass_name]
    assert (chosen.family, chosen.arch, chosen.path) == ("sapiens1", "sapiens_test", str(path))


def test_a_sapiens2_file_for_depth_is_refused(tmp_path: Path) -> None:
    path = sapiens2_file(tmp_path / "normal.safetensors", "normal")
    with pytest.raises(CheckpointChoiceError) as err:
        _explicit("depth", path)
    message = str(err.value)
    assert f"depth: {path} is a Sapiens2 file (sapiens2_tiny normal)" in message
    assert "depth (relative depth) is a Sapiens v1 pass" in message
