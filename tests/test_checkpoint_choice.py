"""Model size `auto` and the choice of checkpoints: the largest size that covers every pass
under the root (or the configured one), tiny untrained models only without checkpoints, and
errors that name what is missing and every file skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

import tasks.checkpoints.files as ck
from sapiens.errors import CheckpointError
from sapiens.loading import save_model
from sapiens.model import build_model
from schemas.settings import Settings
from schemas.spec import parse_spec
from tasks.checkpoints.auto_size import pick_model_size, preferred_size
from tasks.checkpoints.choice import resolve_checkpoints
from tasks.checkpoints.errors import CheckpointChoiceError
from tasks.checkpoints.families import wanted_arch
from tasks.checkpoints.files import CheckpointRef

NORMAL_SEG = {"normal": "normal", "seg": "seg"}
THREE = {"normal": "normal", "seg": "seg", "pose": "pose"}


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SVFX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def ref(size: str, task: str, *, trained: bool = True) -> CheckpointRef:
    arch = wanted_arch(size)
    return CheckpointRef(f"/ckpt/{arch}_{task}.safetensors", "0" * 64, arch, task, trained, 1)


def refs(*items: tuple[str, str]) -> list[CheckpointRef]:
    return [ref(size, task) for size, task in items]


def _save_tiny(path: Path, task: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(build_model("tiny", task, input_hw=(256, 192), seed=0), path)
    return path


# -- the resolution logic, on lists of scanned checkpoints ---------------------------------
def test_auto_takes_the_largest_size_that_covers_every_pass() -> None:
    found = refs(("0.4b", "normal"), ("0.4b", "seg"), ("1b", "normal"), ("1b", "seg"))
    size, reason = pick_model_size(NORMAL_SEG, found, root="/ckpt")
    assert size == "1b"
    assert "largest size with a checkpoint for every pass under /ckpt" in reason
    assert "also complete: 0.4b" in reason


def test_auto_skips_a_larger_size_that_lacks_a_pass() -> None:
    found = refs(("0.4b", "normal"), ("0.4b", "seg"), ("5b", "normal"))
    assert pick_model_size(NORMAL_SEG, found)[0] == "0.4b"


def test_the_configured_size_is_honoured_when_it_covers_every_pass() -> None:
    found = refs(("0.4b", "normal"), ("0.4b", "seg"), ("1b", "normal"), ("1b", "seg"))
    size, reason = pick_model_size(NORMAL_SEG, found, preferred="0.4b")
    assert size == "0.4b" and "configured size" in reason


def test_a_configured_size_that_lacks_a_pass_gives_way_and_says_so() -> None:
    found = refs(("0.4b", "normal"), ("0.4b", "seg"), ("1b", "normal"))
    size, reason = pick_model_size(NORMAL_SEG, found, preferred="1b")
    assert size == "0.4b"
    assert "the configured size 1b lacks seg" in reason


def test_the_4k_variant_only_when_asked() -> None:
    found = refs(("0.4b", "normal"), ("1b-4k", "normal"))
    assert pick_model_size({"normal": "normal"}, found)[0] == "0.4b"
    assert pick_model_size({"normal": "normal"}, found, preferred="1b-4k")[0] == "1b-4k"
    with pytest.raises(CheckpointChoiceError, match=r"auto never picks 1b-4k.*--model-size 1b-4k"):
        pick_model_size({"normal": "normal"}, refs(("1b-4k", "normal"), ("0.4b", "seg")))


def test_partial_coverage_is_an_error_listing_what_each_size_has() -> None:
    found = refs(("0.4b", "normal"), ("0.4b", "seg"), ("1b", "normal"), ("1b", "pose"))
    with pytest.raises(CheckpointChoiceError) as err:
        pick_model_size(THREE | {"albedo": "albedo"}, found, root="/ckpt")
    message = str(err.value)
    assert (
        "no Sapiens2 size under /ckpt has a checkpoint for every pass (normal, seg, pose, albedo)"
        in (message)
    )
    assert "0.4b: has normal, seg; lacks pose, albedo" in message
    assert "1b: has normal, pose; lacks seg, albedo" in message
    assert "no size has: albedo" in message


def test_untrained_files_count_only_when_the_root_has_no_trained_ones() -> None:
    tiny_all = [ref("tiny", t, trained=False) for t in THREE]
    size, reason = pick_model_size(THREE, tiny_all)
    assert size == "tiny" and "the root holds only untrained checkpoints" in reason
    mixed = [*tiny_all, *refs(("0.4b", "normal"), ("1b", "seg"))]
    with pytest.raises(CheckpointChoiceError, match="files marked untrained were left out"):
        pick_model_size(THREE, mixed)


def test_a_single_incomplete_size_is_returned_for_per_pass_errors() -> None:
    size, reason = pick_model_size(THREE, refs(("1b", "normal")), root="/ckpt")
    assert size == "1b" and "the only size under /ckpt" in reason


def test_nothing_usable_is_an_error_naming_the_skipped_files() -> None:
    skipped = [CheckpointError("/ckpt/a.safetensors", "truncated: ...")]
    with pytest.raises(CheckpointChoiceError) as err:
        pick_model_size(THREE, [], root="/ckpt", skipped=skipped)
    assert "no usable Sapiens2 checkpoint under /ckpt" in str(err.value)
    assert "/ckpt/a.safetensors: truncated" in str(err.value)


@pytest.mark.parametrize(
    ("value", "size"),
    [(None, None), ("", None), ("AUTO", None), ("1B", "1b"), ("sapiens2_1b_4k", "1b-4k")],
)
def test_configured_sizes_are_normalised(value: str | None, size: str | None) -> None:
    assert preferred_size(value) == size


def test_an_unknown_configured_size_is_refused() -> None:
    with pytest.raises(CheckpointChoiceError, match=r"'3b' \(SVFX_MODEL_SIZE\); known: auto"):
        preferred_size("3b")


# -- resolve_checkpoints end to end --------------------------------------------------------
def test_no_root_gives_tiny_untrained_models(tmp_path: Path) -> None:
    choice = resolve_checkpoints(["normal"], "auto", untrained_dir=tmp_path / "untrained")
    assert choice.size == "tiny" and "no checkpoint root" in choice.reason
    assert "UNTRAINED" not in choice.reason  # the warning says it, once
    assert not choice.checkpoints["normal"].trained


def test_an_empty_root_gives_tiny_untrained_models(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    choice = resolve_checkpoints(
        ["seg"], "auto", root=str(tmp_path / "root"), untrained_dir=tmp_path / "untrained"
    )
    assert choice.size == "tiny" and "no *.safetensors under" in choice.reason
    assert Path(choice.checkpoints["seg"].path).parent == tmp_path / "untrained"


def test_a_root_that_is_not_a_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointChoiceError, match="is not a directory"):
        resolve_checkpoints(["seg"], "auto", root=str(tmp_path / "typo"), untrained_dir=tmp_path)


def test_auto_uses_the_files_under_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    normal = _save_tiny(root / "a" / "n.safetensors", "normal")
    seg = _save_tiny(root / "b" / "s.safetensors", "seg")
    choice = resolve_checkpoints(["normal", "seg"], "auto", root=str(root))
    assert choice.size == "tiny" and "the only size" not in choice.reason
    assert choice.checkpoints["normal"].path == str(normal.resolve())
    assert choice.checkpoints["seg"].path == str(seg.resolve())


def test_auto_with_mixed_sizes_under_a_root(tmp_path: Path, monkeypatch) -> None:
    """Real 0.4b/1b files are gigabytes: the scan is stood in for; the rest runs as is."""
    found = refs(("0.4b", "normal"), ("0.4b", "seg"), ("1b", "normal"), ("1b", "seg"))
    monkeypatch.setattr(ck, "scan_checkpoints", lambda root: found)
    choice = resolve_checkpoints(["normal", "seg"], "auto", root=str(tmp_path))
    assert choice.size == "1b"
    assert choice.checkpoints == {"normal": found[2], "seg": found[3]}
    choice = resolve_checkpoints(["normal", "seg"], "auto", root=str(tmp_path), preferred="0.4b")
    assert choice.checkpoints == {"normal": found[0], "seg": found[1]}
    with pytest.raises(CheckpointChoiceError, match=r"1b: has normal, seg; lacks pose"):
        resolve_checkpoints(["normal", "seg", "pose"], "auto", root=str(tmp_path))


def test_a_root_of_only_corrupt_files_names_each_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    good = _save_tiny(tmp_path / "good.safetensors", "normal")
    root.mkdir()
    (root / "cut.safetensors").write_bytes(good.read_bytes()[:100_000])  # past the header
    (root / "junk.safetensors").write_bytes(b"\xff" * 64)
    for size in ("auto", "tiny"):
        with pytest.raises(CheckpointChoiceError) as err:
            resolve_checkpoints(["normal"], size, root=str(root), untrained_dir=tmp_path)
        message = str(err.value)
        assert f"{root / 'cut.safetensors'}: truncated" in message, message
        assert f"{root / 'junk.safetensors'}: not a safetensors file" in message, message


def test_a_missing_pass_names_the_skipped_files_too(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _save_tiny(root / "n.safetensors", "normal")
    (root / "seg.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointChoiceError) as err:
        resolve_checkpoints(["normal", "seg"], "auto", root=str(root))
    message = str(err.value)
    assert "seg: no sapiens2_tiny seg checkpoint under" in message
    assert "found: sapiens2_tiny/normal; 1 files skipped, listed below" in message
    assert "(model size auto -> tiny: the only size under" in message
    assert f"{root / 'seg.safetensors'}: not a safetensors file" in message
    assert "normal:" not in message.split("files skipped")[0].replace("found: ", "")


def test_explicit_sizes_keep_working(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _save_tiny(root / "n.safetensors", "normal")
    chosen = resolve_checkpoints(["normal"], "tiny", root=str(root)).checkpoints
    assert chosen["normal"].arch == "sapiens2_tiny"
    choice = resolve_checkpoints(["normal"], "tiny", root=str(root))
    assert (choice.size, choice.reason) == ("tiny", "asked for")


def test_every_pass_explicit_needs_no_size(tmp_path: Path) -> None:
    path = _save_tiny(tmp_path / "n.safetensors", "normal")
    choice = resolve_checkpoints(["normal"], "auto", explicit={"normal": str(path)})
    assert choice.size == "tiny" and "explicit" in choice.reason


def test_auto_is_the_default_size(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec({"plate": "/p/plate.####.exr", "show": "x", "sequence": "s", "shot": "h"})
    assert spec.model_size == "auto"
    assert Settings().scan_model_size == "auto"
    monkeypatch.setenv("SVFX_MODEL_SIZE", "0.4b")
    assert Settings().model_size == "0.4b"
