"""Checkpoints verified once, up front, in the flow process: header, shapes against the
inferred model, every floating tensor finite (numpy on the raw bits), remembered per file."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import sapiens
import tasks.checkpoints.verify as verify_mod
from sapiens.finite import nonfinite_tensors
from sapiens.loading import save_model, verify_checkpoint
from sapiens.model import build_model
from sapiens.safetensors_format import read_tensor_index
from tasks.checkpoints.errors import CheckpointChoiceError
from tasks.checkpoints.files import CheckpointRef, describe_checkpoint
from tasks.checkpoints.verify import verify_checkpoints


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Caches go to a throwaway SVFX_HOME, never the user's."""
    monkeypatch.setenv("SVFX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _save_tiny(path: Path, task: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(build_model("tiny", task, input_hw=(256, 192), seed=0), path)
    return path


def _poison(path: Path, value: float = float("nan"), *, keys: int = 1) -> list[str]:
    """Put `value` into the first element of the first `keys` 2-D floating tensors."""
    tensors = load_file(str(path))
    names = [k for k, t in tensors.items() if t.is_floating_point() and t.ndim > 1][:keys]
    for name in names:
        tensors[name].view(-1)[0] = value
    save_file(tensors, str(path), metadata={"untrained": "true"})
    return names


# -- the raw-bits check --------------------------------------------------------------------
FLOAT_DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e5m2,
    torch.float8_e4m3fn,
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_raw_bits_agree_with_torch_isfinite(tmp_path: Path, dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    edge = [info.max, -info.max, info.tiny, -info.tiny, 0.0, -0.0, info.smallest_normal / 4]
    specials = [float("nan"), float("inf"), float("-inf")]
    tensors = {"edge": torch.tensor(edge, dtype=torch.float64).to(dtype)}
    for i, value in enumerate(specials):
        t = torch.zeros(3, 5, dtype=torch.float64)
        t[2, 4] = value
        tensors[f"special{i}"] = t.to(dtype)
    tensors["ints"] = torch.full((4,), -1, dtype=torch.int64)  # all ones: not a float
    path = tmp_path / "dtypes.safetensors"
    save_file(tensors, str(path))
    entries, _ = read_tensor_index(path)
    expected = [
        k for k, t in tensors.items() if t.is_floating_point() and not t.double().isfinite().all()
    ]
    assert "special0" in expected and "edge" not in expected  # (e4m3fn has no Inf)
    assert nonfinite_tensors(path, entries) == expected


def test_a_nan_in_the_last_block_of_a_tensor_is_found(tmp_path: Path) -> None:
    t = torch.zeros(1000, dtype=torch.float32)
    t[-1] = float("nan")
    path = tmp_path / "blocks.safetensors"
    save_file({"a": torch.ones(77, dtype=torch.bfloat16), "b": t}, str(path))
    entries, _ = read_tensor_index(path)
    assert nonfinite_tensors(path, entries, block_bytes=64) == ["b"]


def test_the_check_streams_in_fixed_blocks(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    save_file({f"w{i}": torch.randn(1024, 1024) for i in range(8)}, str(path))  # 32 MiB
    entries, _ = read_tensor_index(path)
    tracemalloc.start()
    try:
        assert nonfinite_tensors(path, entries, block_bytes=1 << 20) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB for a 32 MiB file"


def test_a_file_cut_short_after_its_header_was_read_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.safetensors"
    save_file({"a": torch.ones(100), "b": torch.ones(100)}, str(path))
    entries, _ = read_tensor_index(path)
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(sapiens.CheckpointError, match=r"could not read tensor 'b'.*ends at byte"):
        nonfinite_tensors(path, entries)


def test_an_unknown_dtype_is_not_passed_silently(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}
    raw = json.dumps(header).encode()
    path = tmp_path / "f4.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\x00\x00")
    entries, _ = read_tensor_index(path)
    with pytest.raises(sapiens.CheckpointError, match="cannot check tensors of dtype F4"):
        nonfinite_tensors(path, entries)


# -- verify_checkpoint (sapiens) -----------------------------------------------------------
def test_verify_checkpoint_passes_a_good_file_and_names_what_it_holds(tmp_path: Path) -> None:
    info = verify_checkpoint(_save_tiny(tmp_path / "seg.safetensors", "seg"))
    assert (info.arch, info.task, info.trained) == ("sapiens2_tiny", "seg", False)


def test_verify_checkpoint_names_the_nan_tensors(tmp_path: Path) -> None:
    path = _save_tiny(tmp_path / "seg.safetensors", "seg")
    bad = _poison(path, keys=2)
    with pytest.raises(sapiens.CheckpointError) as err:
        verify_checkpoint(path)
    assert str(path) in str(err.value)
    assert "NaN or Inf values in 2 tensor(s)" in str(err.value)
    assert all(name in str(err.value) for name in bad)


def test_verify_checkpoint_checks_shapes_like_load_model(tmp_path: Path) -> None:
    path = _save_tiny(tmp_path / "normal.safetensors", "normal")
    tensors = load_file(str(path))
    del tensors["backbone.blocks.2.attn.proj.bias"]
    save_file(tensors, str(path))
    with pytest.raises(sapiens.CheckpointError, match=r"does not match the inferred model"):
        verify_checkpoint(path)


# -- verify_checkpoints (planning): every bad file, once per file --------------------------
@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths `verify_checkpoint` really ran on (not answered from the cache)."""
    calls: list[str] = []

    def counting(path: str) -> object:
        calls.append(path)
        return verify_checkpoint(path)

    monkeypatch.setattr(verify_mod, "verify_checkpoint", counting)
    return calls


def test_good_checkpoints_are_verified_once(tmp_path: Path, home: Path, counted) -> None:
    refs = {
        "normal": describe_checkpoint(_save_tiny(tmp_path / "n.safetensors", "normal")),
        "seg": describe_checkpoint(_save_tiny(tmp_path / "s.safetensors", "seg")),
    }
    verify_checkpoints(refs)
    assert sorted(counted) == sorted(r.path for r in refs.values())
    verify_checkpoints(refs)  # a re-run: a stat and a cache look-up per file
    assert len(counted) == 2
    cached = json.loads((home / "checkpoint-verified.json").read_text())
    assert {key.rsplit("|", 1)[1] for key in cached} == {ref.sha256 for ref in refs.values()}


def test_every_bad_file_is_listed_with_its_passes(tmp_path: Path) -> None:
    good = _save_tiny(tmp_path / "good_pose.safetensors", "pose")
    nan = _save_tiny(tmp_path / "nan_seg.safetensors", "seg")
    inf = _save_tiny(tmp_path / "inf_normal.safetensors", "normal")
    nan_keys = _poison(nan)
    inf_keys = _poison(inf, float("inf"))
    refs = {
        "pose": describe_checkpoint(good),
        "seg": describe_checkpoint(nan),
        "normal": describe_checkpoint(inf),
    }
    with pytest.raises(CheckpointChoiceError) as err:
        verify_checkpoints(refs)
    message = str(err.value)
    assert "2 checkpoint file(s) failed verification" in message
    assert f"seg: {nan.resolve()}: NaN or Inf" in message and nan_keys[0] in message
    assert f"normal: {inf.resolve()}: NaN or Inf" in message and inf_keys[0] in message
    assert str(good.resolve()) not in message


def test_a_failure_is_not_remembered_and_a_changed_file_is_checked_again(
    tmp_path: Path, counted
) -> None:
    path = _save_tiny(tmp_path / "seg.safetensors", "seg")
    verify_checkpoints({"seg": describe_checkpoint(path)})
    _poison(path)
    os.utime(path, ns=(1, 1))  # a rewrite within the same mtime tick still differs
    with pytest.raises(CheckpointChoiceError, match="NaN or Inf"):
        verify_checkpoints({"seg": describe_checkpoint(path)})
    with pytest.raises(CheckpointChoiceError, match="NaN or Inf"):
        verify_checkpoints({"seg": describe_checkpoint(path)})
    assert len(counted) == 3


def test_a_file_changed_after_it_was_chosen_is_refused(tmp_path: Path) -> None:
    path = _save_tiny(tmp_path / "seg.safetensors", "seg")
    ref = describe_checkpoint(path)
    _poison(path, 0.5)  # finite, but not the file whose sha256 the run records
    with pytest.raises(CheckpointChoiceError, match="changed since it was chosen"):
        verify_checkpoints({"seg": ref})


def test_a_missing_file_is_reported_not_raised(tmp_path: Path) -> None:
    ref = CheckpointRef(
        str(tmp_path / "gone.safetensors"), "0" * 64, "sapiens2_tiny", "seg", True, 1
    )
    with pytest.raises(CheckpointChoiceError, match=r"seg: .*gone.safetensors: cannot read it"):
        verify_checkpoints({"seg": ref})


def test_without_svfx_home_it_verifies_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, counted
) -> None:
    monkeypatch.delenv("SVFX_HOME")
    refs = {"seg": describe_checkpoint(_save_tiny(tmp_path / "seg.safetensors", "seg"))}
    verify_checkpoints(refs)
    verify_checkpoints(refs)
    assert len(counted) == 2
