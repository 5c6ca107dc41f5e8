"""The pass table (`schemas.passes`): one declaration per pass, what derives from it and the
bad input it refuses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from schemas import passes as pass_table
from schemas.spec import SpecError, parse_spec
from tests.shot_helpers import spec_data

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


def test_what_the_models_run_follows_needs_and_sources():
    assert pass_table.model_passes(["pose"]) == ("seg", "pose")  # boxes from a person mask
    assert pass_table.model_passes(["pose", "matte"]) == ("matte", "pose")
    assert pass_table.model_passes(["depth"]) == ("depth", "seg")  # normalised over the person
    assert pass_table.checkpoint_inputs("pose") == ("pose", "seg", "matte")


def test_the_exr_parts_keep_their_order_and_every_pass_has_its_outputs():
    parts = [layer.part for layer in pass_table.exr_layers(pass_table.PASS_NAMES)]
    assert parts == ["N", "P", "relDepth", "albedo", "matte", "CryptoBodyPart", "seg"]
    assert pass_table.expected_outputs(["seg", "pose"], previews=True) == {
        ("exr", "seg"), ("zarr", "seg"), ("preview", "seg"),
        ("zarr", "pose"), ("pose_json", "pose"), ("preview", "pose"),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"passes": "normal,shadow"}, ("unknown pass 'shadow'", "known: normal")),
        ({"passes": "seg,normal,seg"}, ("pass 'seg' is given twice",)),
    ],
)
def test_bad_pass_input_is_refused_naming_the_pass(tmp_path, extra, words):
    with pytest.raises(SpecError) as caught:
        parse_spec(spec_data("/plates/p.####.exr", tmp_path, **extra))
    for word in words:
        assert word in str(caught.value), str(caught.value)
