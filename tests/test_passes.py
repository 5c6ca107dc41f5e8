"""The pass table (`schemas.passes`): one declaration per pass, what derives from it, the bad
input it refuses, and the `parts` pass it was proved with, through a real chunk."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import OpenEXR
import pytest
import torch

from schemas import passes as pass_table
from schemas.spec import SpecError, parse_spec
from storage.zarr_store import read_stored_frame
from tasks.chunk_worker import process_chunk
from tasks.frame_passes import class_groups
from tests.shot_helpers import SMALL, make_plate, small_chunk_job, spec_data

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("sapiens", "storage", "schemas", "tasks", "flows", "api", "cli")
MEASURED = ("normal", "pointmap", "albedo", "matte", "seg")


def files_quoting(name: str) -> list[str]:
    """Product files that quote the pass's name as a string ('seg' or "seg")."""
    quoted = re.compile(rf"""["']{re.escape(name)}["']""")
    return sorted(
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if quoted.search(path.read_text())
    )


@pytest.mark.parametrize("name", MEASURED)
def test_a_pass_is_named_in_at_most_three_product_files(name):
    """The table and the model task constants name it; everything else derives from them."""
    found = files_quoting(name)
    assert "schemas/passes.py" in found
    assert len(found) <= 3, found


@pytest.mark.parametrize(
    ("passes", "family", "folder"),
    [
        ("normal,seg,pose", "sapiens2", "sapiens2"),
        ("normal,seg,pose,depth", "sapiens1", "sapiens1"),
        ("depth", "sapiens2", "sapiens1"),  # ran on v1 only, whatever --family says
        ("parts", "sapiens1", "sapiens1"),  # made from v1's seg
        ("pointmap,matte", "sapiens1", "sapiens2"),  # Sapiens2-only passes
        ("normal,pointmap", "sapiens1", "sapiens1"),  # a mix: its --family
        ("normal,depth", "sapiens2", "sapiens2"),
        ("depth,motion", "sapiens2", "sapiens1"),  # motion runs beside any family
        ("normal,motion", "sapiens1", "sapiens1"),
    ],
)
def test_the_output_folder_names_the_family_the_passes_ran_on(tmp_path, passes, family, folder):
    from tasks.output_paths import ShotOutputPaths

    spec = parse_spec(spec_data("/p/plate.####.exr", tmp_path, passes=passes, family=family))
    assert spec.output_family == folder
    paths = ShotOutputPaths.for_shot(
        "/out", "abc", "sq010", "sh020", "v001", family=spec.output_family
    )
    assert paths.root == f"/out/abc/sq010/sh020/{folder}_v001"
    assert paths.exr(1001) == f"{paths.root}/sh020_{folder}_v001.1001.exr"


def test_what_the_models_run_follows_needs_and_sources():
    assert pass_table.model_passes(["pose"]) == ("seg", "pose")  # boxes from a person mask
    assert pass_table.model_passes(["pose", "matte"]) == ("matte", "pose")
    assert pass_table.model_passes(["depth"]) == ("depth", "seg")  # normalised over the person
    assert pass_table.model_passes(["parts"]) == ("seg",)  # made from seg's output
    assert pass_table.run_for(["depth"]) == {"seg": ("depth",)}
    assert pass_table.run_for(["pose", "depth", "parts"]) == {"seg": ("depth", "parts", "pose")}
    assert pass_table.run_for(["pose", "matte", "seg"]) == {}  # every model pass asked for
    assert pass_table.derived_from("seg") == (pass_table.BY_NAME["parts"],)
    assert pass_table.families_of("parts") == pass_table.families_of("seg")
    assert pass_table.checkpoint_inputs("parts") == ("seg",)
    assert pass_table.checkpoint_inputs("pose") == ("pose", "seg", "matte")


def test_a_pass_no_model_makes_runs_none_and_depends_on_no_checkpoint():
    assert pass_table.model_passes(["motion", "normal"]) == ("normal",)
    assert pass_table.model_passes(["motion"]) == ()
    assert pass_table.run_for(["motion", "parts"]) == {"seg": ("parts",)}
    assert pass_table.checkpoint_inputs("motion") == ()
    assert pass_table.families_of("motion") == pass_table.FAMILIES
    assert pass_table.family_of("motion", "sapiens1") == "sapiens1"
    assert pass_table.job_family(["motion"], "sapiens1") == "sapiens1"
    assert pass_table.derived_from("motion") == ()
    assert "motion" not in pass_table.family_help()  # the family choice is not its
    with pytest.raises(ValueError, match="motion is made by no model"):
        pass_table.model_task("motion")
    assert "motion" not in pass_table.DEFAULT_PASSES


def test_a_stabilised_version_fuses_each_pass_by_the_rule_the_table_names():
    """`Pass.fusion` is declared once per pass; `parts` is fused as a matte only when seg is
    not in the version (else made again from seg's fused probabilities); pose and motion are
    not fused. Every rule the table names has its code in the stabiliser."""
    from tasks.stabilise.rules import DISTANCE

    assert set(pass_table.FUSIONS) == set(DISTANCE)
    assert pass_table.fusion_rules(pass_table.PASS_NAMES) == {
        "normal": "unit_vectors",
        "pointmap": "points",
        "depth": "relative_depth",
        "albedo": "colour",
        "matte": "alpha",
        "seg": "labels",
    }
    assert pass_table.fusion_rules(["parts", "pose", "motion"]) == {"parts": "alpha"}
    assert pass_table.fusion_rules(["seg", "parts"]) == {"seg": "labels"}


def test_the_exr_parts_keep_their_order_and_every_pass_has_its_outputs():
    parts = [layer.part for layer in pass_table.exr_layers(pass_table.PASS_NAMES)]
    assert parts == [
        "N", "P", "relDepth", "albedo", "matte", "CryptoBodyPart", "seg", "parts", "motion"
    ]  # fmt: skip
    assert pass_table.expected_outputs(["parts", "pose"], previews=True) == {
        ("exr", "parts"), ("zarr", "parts"), ("preview", "parts"),
        ("zarr", "pose"), ("pose_json", "pose"), ("preview", "pose"),
    }  # fmt: skip
    assert pass_table.expected_outputs(["motion"], previews=False) == {
        ("exr", "motion"), ("zarr", "motion")
    }  # fmt: skip
    assert "parts" not in pass_table.DEFAULT_PASSES  # the demo's outputs stay as they were


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"passes": "normal,shadow"}, ("unknown pass 'shadow'", "known: normal")),
        ({"passes": "parts,normal,parts"}, ("pass 'parts' is given twice",)),
        (
            {"passes": "parts", "checkpoints": {"parts": "/ckpt/x.safetensors"}},
            ("parts has no checkpoint of its own", "seg=FILE"),
        ),
        (
            {"passes": "motion,normal", "checkpoints": {"motion": "/ckpt/x.safetensors"}},
            ("motion has no checkpoint: no model makes it",),
        ),
        (
            {"passes": "motion"},
            ("passes motion run no model", "ask for one too", "--passes motion,normal"),
        ),
    ],
)
def test_bad_pass_input_is_refused_naming_the_pass(tmp_path, extra, words):
    with pytest.raises(SpecError) as caught:
        parse_spec(spec_data("/plates/p.####.exr", tmp_path, **extra))
    for word in words:
        assert word in str(caught.value), str(caught.value)


def test_class_groups_sum_the_probabilities_of_their_classes_by_name():
    names = ["Background", "Hair", "Face_Neck", "Torso", "Tongue"]
    probabilities = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15]).reshape(5, 1, 1).repeat(1, 2, 3)
    groups = {"face": ("Face_Neck", "Tongue", "Eyeglass"), "hair": ("Hair",), "none": ("X",)}
    mattes = class_groups(probabilities, groups, names)
    assert mattes.shape == (3, 2, 3)
    torch.testing.assert_close(mattes[:, 0, 0], torch.tensor([0.45, 0.2, 0.0]))


@pytest.fixture(scope="module")
def parts_chunk(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    pattern = make_plate(root / "plates", frames=2)
    spec = parse_spec(spec_data(pattern, root / "out", model_size="tiny", passes="parts,matte"))
    job = small_chunk_job(root, pattern, spec, (1001, 1002))
    return job, process_chunk(job)


def test_parts_runs_seg_without_writing_it(parts_chunk):
    job, summary = parts_chunk
    assert [f.status for f in summary.frames] == ["done", "done"]
    assert {o.pass_name for f in summary.frames for o in f.outputs} == {"parts", "matte"}
    with OpenEXR.File(job.paths.exr(1001), separate_channels=True) as exr:
        assert [part.name() for part in exr.parts] == ["matte", "parts"]
        channels = exr.parts[1].channels
        assert sorted(channels) == [f"parts.{g}" for g in sorted(pass_table.PART_GROUPS)]
        for channel in channels.values():
            assert channel.pixels.dtype == np.float16
            assert channel.pixels.shape == (SMALL[1], SMALL[0])
            assert np.all((channel.pixels >= 0) & (channel.pixels <= 1))
    stored = read_stored_frame(job.paths.zarr, 0, ["parts"])["parts"]  # frame 1001
    assert stored.shape == (SMALL[1], SMALL[0], len(pass_table.PART_GROUPS))
    with OpenEXR.File(job.paths.exr(1001), separate_channels=True) as exr:
        for c, group in enumerate(pass_table.PART_GROUPS):
            exr_plane = exr.parts[1].channels[f"parts.{group}"].pixels
            np.testing.assert_array_equal(stored[..., c], exr_plane)  # the same values
    previews = [o for f in summary.frames for o in f.outputs if o.kind == "preview"]
    assert {o.pass_name for o in previews} == {"parts", "matte"}
