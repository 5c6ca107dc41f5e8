"""Sapiens v1 through the passes: `--family sapiens1` runs normal, seg and pose on v1 models,
`--passes depth` runs v1's relative depth on its own (foreground-normalised, in its own EXR
layer and Zarr array, never over the metric depth.Z), the family is recorded in the EXR
provenance and the catalog, and a v1 file for a pass v1 does not have is refused before any
frame is read. Models are tiny and UNTRAINED (v1: `sapiens1_tiny`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import OpenEXR
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app as svfx_app
from sapiens.keypoints import COCO_KEYPOINT_NAMES
from sapiens.loading import save_model
from sapiens.model import build_model
from sapiens.seg_classes import V1_SEG_CLASSES
from schemas import passes as pass_table
from schemas.spec import parse_spec
from storage import cryptomatte
from storage.zarr_store import open_shot_store
from tasks.checkpoints.choice import resolve_checkpoints
from tasks.chunk_worker import process_chunk
from tasks.frame_passes import relative_depth
from tests.shot_helpers import SMALL, make_plate, small_chunk_job, spec_data
from tests.test_cli import _svfx_env, as_json, why

runner = CliRunner()
FRAMES = (1001, 1002)
SHOT = "demo/sq010/sh010"


def test_relative_depth_is_normalised_over_the_person_and_minus_one_elsewhere():
    raw = torch.tensor([[[5.0, 7.0, 9.0, 100.0], [6.0, 8.0, -3.0, 0.0]]])
    person = torch.tensor([[True, True, True, False], [True, True, False, False]])
    depth = relative_depth(raw, person, 4)
    expected = [[0.0, 0.5, 1.0, -1.0], [0.25, 0.75, -1.0, -1.0]]
    assert torch.allclose(depth, torch.tensor(expected))
    assert depth.dtype == torch.float32
    nobody = relative_depth(raw, torch.zeros_like(person), 4)
    assert (nobody == -1).all()  # no person, no depth
    flat = relative_depth(torch.full((1, 2, 4), 3.0), person, 4)
    assert torch.equal(flat[person], torch.zeros(5))  # one depth: all nearest, no NaN
    squeezed = relative_depth(raw, person, 2)  # an anamorphic plate: resampled first
    assert tuple(squeezed.shape) == (2, 2) and squeezed.max() <= 1 and squeezed.min() >= -1


def test_the_family_chooses_the_models_and_depth_runs_on_v1_by_itself(tmp_path):
    untrained = tmp_path / "untrained"
    v1 = resolve_checkpoints(
        ["normal", "depth", "seg", "pose"], "auto", untrained_dir=untrained, family="sapiens1"
    )
    assert {p: r.family for p, r in v1.checkpoints.items()} == dict.fromkeys(
        ["normal", "depth", "seg", "pose"], "sapiens1"
    )
    assert {r.arch for r in v1.checkpoints.values()} == {"sapiens1_tiny"}
    assert v1.checkpoints["seg"].outputs == len(V1_SEG_CLASSES)
    mixed = resolve_checkpoints(["normal", "pointmap", "depth"], "auto", untrained_dir=untrained)
    families = {p: r.family for p, r in mixed.checkpoints.items()}
    assert families == {"normal": "sapiens2", "pointmap": "sapiens2", "depth": "sapiens1"}
    assert mixed.size == "Sapiens2 tiny + Sapiens v1 tiny"
    with pytest.raises(ValueError, match=r"Sapiens v1 has no size 0\.4b"):
        resolve_checkpoints(["depth"], "0.4b", untrained_dir=untrained)


def test_a_pass_run_for_others_follows_them_unless_one_runs_on_the_jobs_family(tmp_path):
    def families(asked: list[str], family: str = "sapiens2") -> dict[str, str]:
        choice = resolve_checkpoints(
            pass_table.model_passes(asked),
            "auto",
            untrained_dir=tmp_path,
            family=family,
            asked=asked,
        )
        return {p: r.family for p, r in choice.checkpoints.items()}

    assert families(["depth"]) == {"depth": "sapiens1", "seg": "sapiens1"}
    assert families(["normal", "depth"])["seg"] == "sapiens1"  # normal needs no mask
    assert families(["depth", "pose"])["seg"] == "sapiens2"  # pose runs on the job's family
    assert families(["depth", "parts"])["seg"] == "sapiens2"  # parts is made from it
    assert families(["pose"], "sapiens1")["seg"] == "sapiens1"
    assert families(["depth", "matte"]) == {"matte": "sapiens2", "depth": "sapiens1"}


def _job(root: Path, spec_extra: dict[str, Any], *, version: str, keypoints: int = 308):
    pattern = make_plate(root / "plates", frames=len(FRAMES))
    spec = parse_spec(spec_data(pattern, root / "out", **spec_extra))
    return small_chunk_job(root, pattern, spec, FRAMES, version=version, keypoints=keypoints)


@pytest.fixture(scope="module")
def v1_chunk(tmp_path_factory):
    root = tmp_path_factory.mktemp("v1")
    job = _job(root, {"family": "sapiens1", "passes": "normal,seg,pose,depth"}, version="v001")
    return job, process_chunk(job)


def test_v1_passes_land_in_their_parts_with_v1_class_names(v1_chunk):
    job, summary = v1_chunk
    assert [f.status for f in summary.frames] == ["done", "done"], [f.error for f in summary.frames]
    with OpenEXR.File(job.paths.exr(1001), separate_channels=True) as exr:
        parts = {part.name(): part for part in exr.parts}
        assert list(parts) == ["N", "relDepth", "CryptoBodyPart", "seg"]
        assert list(parts["relDepth"].channels) == ["relDepth.Z"]
        assert not any(c == "depth.Z" for p in exr.parts for c in p.channels)  # metric: P only
        depth = parts["relDepth"].channels["relDepth.Z"].pixels
        header = dict(parts["N"].header)
        key = cryptomatte.layer_key("CryptoBodyPart")
        manifest = json.loads(header[f"cryptomatte/{key}/manifest"])
        seg_names = json.loads(parts["seg"].header["sapiens2/classNames"])
        labels = parts["seg"].channels["seg.id"].pixels
    assert depth.dtype == np.float32
    person = depth >= 0
    assert set(np.unique(depth[~person])) <= {-1.0}
    if person.any():
        assert depth[person].min() == 0.0 and depth[person].max() == 1.0
    assert list(manifest) == list(V1_SEG_CLASSES) == seg_names and "Eyeglass" not in manifest
    assert labels.max() < len(V1_SEG_CLASSES)
    for name in ("normal", "seg", "pose", "depth"):
        assert header[f"svfx/{name}/family"] == "sapiens1"
        assert "sapiens1_tiny" in header[f"sapiens2/{name}/model"]
    assert "relative depth" in header["svfx/tiling"]


def test_relative_depth_has_its_own_zarr_array_saying_what_it_holds(v1_chunk):
    job, summary = v1_chunk
    store = open_shot_store(job.paths.zarr)
    depth = store["depth"]
    assert depth.dtype == np.float32 and depth.shape == (2, SMALL[1], SMALL[0])
    assert "relative depth" in depth.attrs["content"] and "not metric" in depth.attrs["content"]
    with OpenEXR.File(job.paths.exr(1002), separate_channels=True) as exr:
        part = next(p for p in exr.parts if p.name() == "relDepth")
        np.testing.assert_array_equal(depth[1], part.channels["relDepth.Z"].pixels)
    assert store["pose"].shape[2] == 308 and "pointmap" not in store
    assert store["seg"].attrs["class_names"] == list(V1_SEG_CLASSES)  # as the EXR's seg part
    records = {(o.kind, o.pass_name) for f in summary.frames for o in f.outputs}
    assert {("exr", "depth"), ("zarr", "depth"), ("preview", "depth")} <= records


def test_a_v1_coco_pose_model_stores_17_keypoints(tmp_path):
    pose = tmp_path / "pose17.safetensors"
    model = build_model("sapiens1_tiny", "pose", num_keypoints=17, input_hw=(256, 192), seed=3)
    save_model(model, pose, trained=False)
    job = _job(
        tmp_path,
        {"passes": "matte,pose", "checkpoints": {"pose": str(pose)}},
        version="v002",
        keypoints=17,
    )
    summary = process_chunk(job)
    assert [f.status for f in summary.frames] == ["done", "done"], [f.error for f in summary.frames]
    store = open_shot_store(job.paths.zarr)
    assert store["pose"].shape[2:] == (17, 3)
    (record,) = [o for o in summary.frames[0].outputs if o.kind == "pose_json"]
    assert record.shape[1:] == (17, 3)
    assert job.checkpoints["pose"].outputs == 17 and job.checkpoints["pose"].family == "sapiens1"
    assert COCO_KEYPOINT_NAMES[0] == "nose"


# -- through svfx submit ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plate(tmp_path_factory) -> str:
    return make_plate(tmp_path_factory.mktemp("plates"), frames=2)


@pytest.fixture
def home(tmp_path, monkeypatch, plate):
    _svfx_env(monkeypatch, tmp_path / "home", tmp_path, Path(plate).parent)
    return tmp_path


def _v1_file(path: Path, task: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(build_model("sapiens1_tiny", task, input_hw=(256, 192), seed=1), path)
    return path


def _submit(*args: str):
    return runner.invoke(svfx_app, ["submit", *args])


@pytest.mark.parametrize("pass_name", ["pointmap", "albedo", "matte"])
def test_a_v1_file_for_a_sapiens2_only_pass_is_refused_before_any_frame(home, plate, pass_name):
    v1 = _v1_file(home / "ckpt" / "v1_depth.safetensors", "depth")
    result = _submit(
        plate, "--shot", SHOT, "--colorspace", "lin_rec709", "--passes", pass_name,
        "--checkpoint", f"{pass_name}={v1}", "--output", str(home / "out"),
    )  # fmt: skip
    assert result.exit_code == 2, why(result)
    assert f"{pass_name}: {v1} is a Sapiens v1 file" in result.stderr
    assert f"no {pass_name} pass" in result.stderr and "Traceback" not in result.output
    assert not (home / "out").exists()
    jobs = runner.invoke(svfx_app, ["status", "--json"])
    assert jobs.exit_code == 0 and json.loads(jobs.stdout) == [], why(jobs)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--passes", "depth", "--model-size", "0.4b"], "Sapiens v1 has no size 0.4b"),
        (["--family", "sapiens3"], "family"),
        (["--checkpoint", "depth"], "expected PASS=FILE"),
        (["--checkpoint", "shadow=x.safetensors"], "shadow"),
    ],
)
def test_bad_family_options_are_one_line_and_exit_2(home, plate, args, says):
    result = _submit(plate, "--shot", SHOT, "--colorspace", "lin_rec709", *args)
    assert result.exit_code == 2, why(result)
    assert says in result.stderr and "Traceback" not in result.output


def test_a_depth_only_job_runs_its_person_mask_on_v1_beside_depth(home, plate):
    """Only v1 files (depth and seg) under the root and an explicit size: seg, run only for
    depth's person mask, follows depth's family instead of the job's (Sapiens2)."""
    from flows.planning import plan_shot
    from schemas.settings import Settings

    root = home / "ckpt"
    depth, seg = (_v1_file(root / f"v1_{task}.safetensors", task) for task in ("depth", "seg"))
    spec = parse_spec(
        spec_data(plate, home / "out", passes="depth", model_size="tiny", checkpoint_root=str(root))
    )
    plan = plan_shot(spec, Settings())
    assert {p: (r.family, r.path) for p, r in plan.checkpoints.items()} == {
        "depth": ("sapiens1", str(depth.resolve())),
        "seg": ("sapiens1", str(seg.resolve())),
    }


def test_a_missing_mask_model_is_refused_as_what_depth_needs(home, plate):
    root = home / "ckpt"
    depth = _v1_file(root / "v1_depth.safetensors", "depth")
    for given in ([], ["--checkpoint", f"depth={depth}"]):
        result = _submit(
            plate, "--shot", SHOT, "--colorspace", "lin_rec709", "--passes", "depth",
            "--model-size", "tiny", "--checkpoint-root", str(root), *given,
        )  # fmt: skip
        assert result.exit_code == 2, why(result)
        assert (
            "depth needs a person mask (from seg or matte): seg: no sapiens1_tiny seg checkpoint"
            in result.stderr
        ), why(result)
        assert "Sapiens2" not in result.stderr and "Traceback" not in result.output


@pytest.mark.timeout(300)
def test_submit_family_sapiens1_with_depth(home, plate, prefect_api):
    result = _submit(
        plate, "--shot", SHOT, "--colorspace", "lin_rec709", "--family", "sapiens1",
        "--passes", "normal,seg,depth", "--output", str(home / "out"), "--no-previews",
        "--json",
    )  # fmt: skip
    assert result.exit_code == 0, why(result)
    summary = as_json(result)
    assert summary["status"] == "complete", summary["failed"]
    assert "UNTRAINED MODELS" in result.stderr
    assert Path(summary["output_root"]).name == "sapiens1_v001"  # the family it ran on
    exr = sorted(Path(summary["output_root"]).glob("*.exr"))[0]
    assert exr.name == "sh010_sapiens1_v001.1001.exr"
    provenance = runner.invoke(svfx_app, ["catalog", "provenance", str(exr), "--json"])
    assert provenance.exit_code == 0, why(provenance)
    checkpoints = json.loads(provenance.stdout)["checkpoints"]
    assert {c["task"]: c["family"] for c in checkpoints} == {
        "normal": "sapiens1",
        "seg": "sapiens1",
        "depth": "sapiens1",
    }
    nuke = Path(summary["extras"]["nuke_script"]).read_text()
    assert "Shuffle_relDepth" in nuke
    store = open_shot_store(summary["zarr"])  # the flow creates it with v1's class names
    assert store["seg"].attrs["class_names"] == list(V1_SEG_CLASSES)
    assert store.attrs["seg_classes"] == len(V1_SEG_CLASSES)
