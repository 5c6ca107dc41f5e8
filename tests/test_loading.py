"""Checkpoint loading: round trips, inference from the file, and every kind of bad file."""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import sapiens
import sapiens.loading
from sapiens.arch import BackboneSpec
from sapiens.backbone import Sapiens2Backbone
from sapiens.info import ModelInfo
from tests.model_helpers import SMALL_HW, tiny

TASKS = ["normal", "albedo", "pointmap", "seg", "pose", "matting"]


def _roundtrip(model: torch.nn.Module, path: Path, x: torch.Tensor) -> torch.nn.Module:
    sapiens.save_model(model, path)
    loaded = sapiens.load_model(path)
    with torch.no_grad():
        a, b = model(x), loaded(x)
    for u, v in zip(
        a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,), strict=True
    ):
        assert torch.equal(u, v)
    return loaded


@pytest.mark.parametrize("task", TASKS)
def test_task_roundtrip_and_inference(task: str, tmp_path: Path) -> None:
    model = tiny(task, seed=11)
    loaded = _roundtrip(model, tmp_path / f"{task}.safetensors", torch.randn(1, 3, *SMALL_HW))
    info = loaded.info
    assert info.task == task
    assert info.arch == "sapiens2_tiny"
    assert info.backbone == model.info.backbone
    assert info.head == model.info.head
    assert info.trained is False and "UNTRAINED" in info.label
    assert len(info.sha256) == 64
    assert list(loaded.state_dict()) == list(model.state_dict())


def test_tokenizer_roundtrip(tmp_path: Path) -> None:
    model = tiny(None, tokenizer=True, seed=12)
    loaded = _roundtrip(model, tmp_path / "pretrain4k.safetensors", torch.randn(1, 3, 256, 192))
    assert loaded.info.backbone.tokenizer_depth == 1
    assert loaded.info.arch == "sapiens2_tiny_4k"
    assert loaded.info.task is None


def test_inference_of_odd_custom_sizes(tmp_path: Path) -> None:
    """Width 96, 3 heads of 32, 5 blocks with a made-up K/V schedule, no config anywhere."""
    spec = BackboneSpec("custom", 96, 5, 3, (3, 1, 3, 1, 3), 200, tokenizer_depth=2)
    backbone = Sapiens2Backbone(spec)
    path = tmp_path / "custom.safetensors"
    save_file({k: v.contiguous() for k, v in backbone.state_dict().items()}, str(path))
    loaded = sapiens.load_model(path)
    assert loaded.info.backbone == spec
    assert loaded.info.trained  # no metadata: assumed real
    with torch.no_grad():
        assert loaded(torch.randn(1, 3, 128, 64)).shape == (1, 96, 2, 1)


def test_upstream_prefixed_task_file_without_metadata(tmp_path: Path) -> None:
    """A task file exactly as upstream writes it: prefixes, bf16 periods, no metadata."""
    model = tiny("seg", seed=13)
    path = tmp_path / "seg.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    loaded = sapiens.load_model(path)
    assert loaded.info.task == "seg" and loaded.info.head.out_channels == 29


def test_load_to_bfloat16_keeps_rope_periods(tmp_path: Path) -> None:
    path = tmp_path / "normal.safetensors"
    sapiens.save_model(tiny("normal"), path)
    loaded = sapiens.load_model(path, dtype=torch.bfloat16)
    assert loaded.backbone.blocks[0].attn.wq.weight.dtype == torch.bfloat16
    assert loaded.backbone.rope_embed.periods.dtype == torch.bfloat16
    assert not any(p.is_meta for p in loaded.parameters())


def test_expect_task_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "seg.safetensors"
    sapiens.save_model(tiny("seg"), path)
    with pytest.raises(sapiens.CheckpointError, match="holds a seg model, not normal"):
        sapiens.load_model(path, expect_task="normal")


# ----------------------------------------------------------------------------- bad files


def _good_file(tmp_path: Path) -> Path:
    path = tmp_path / "good.safetensors"
    sapiens.save_model(tiny("normal"), path)
    return path


def test_truncated_file(tmp_path: Path) -> None:
    data = _good_file(tmp_path).read_bytes()
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(sapiens.CheckpointError, match=r"truncated.safetensors: truncated"):
        sapiens.load_model(bad)


def test_corrupt_header(tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.safetensors"
    bad.write_bytes(struct.pack("<Q", 40) + b"{not json at all" + b"\x00" * 100)
    with pytest.raises(sapiens.CheckpointError, match="corrupt safetensors header"):
        sapiens.load_model(bad)


def test_garbage_file(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(sapiens.CheckpointError, match="not a safetensors file"):
        sapiens.load_model(bad)


@pytest.mark.parametrize("suffix", [".pth", ".bin", ".ckpt"])
def test_pickle_suffix_refused_with_conversion_hint(tmp_path: Path, suffix: str) -> None:
    bad = tmp_path / f"model{suffix}"
    torch.save({"w": torch.zeros(2)}, bad)
    with pytest.raises(sapiens.CheckpointError, match=r"pickled weights .* refused.*save_file"):
        sapiens.load_model(bad)


def test_pickle_disguised_as_safetensors(tmp_path: Path) -> None:
    bad = tmp_path / "sneaky.safetensors"
    torch.save({"w": torch.zeros(2)}, bad)
    with pytest.raises(sapiens.CheckpointError, match="pickle/zip torch file"):
        sapiens.load_model(bad)


def _with_header_length(src: Path, dst: Path, fits: Callable[[int], bool]) -> int:
    """Copy a safetensors file, padding its JSON header with spaces (which the format allows)
    to the first multiple of 8 that `fits`; returns the new header length."""
    data = src.read_bytes()
    (old,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + old].rstrip(b" ")
    length = next(n for n in range(len(header), len(header) + (1 << 17)) if n % 8 == 0 and fits(n))
    dst.write_bytes(struct.pack("<Q", length) + header.ljust(length, b" ") + data[8 + old :])
    return length


@pytest.mark.parametrize(
    ("name", "fits", "first_bytes"),
    [
        ("x80", lambda n: n & 0xFF == 0x80, b"\x80"),
        ("PK", lambda n: n & 0xFFFF == 0x4B50, b"PK"),
    ],
)
def test_a_header_length_starting_like_pickle_or_zip_loads(
    tmp_path: Path, name: str, fits: Callable[[int], bool], first_bytes: bytes
) -> None:
    """About 1 file in 32 has a header length whose first byte is 0x80; some start "PK"."""
    source = _good_file(tmp_path)
    path = tmp_path / f"{name}.safetensors"
    _with_header_length(source, path, fits)
    assert path.read_bytes().startswith(first_bytes)
    with safe_open(str(path), framework="pt") as fh:  # the reference reader accepts it
        assert sorted(fh.keys()) == sorted(sapiens.loading.read_header(source)[0])
    loaded, original = sapiens.load_model(path), sapiens.load_model(source)
    assert loaded.info.task == "normal"
    for key, tensor in original.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], tensor), key


def test_a_legacy_torch_pickle_is_refused_with_the_hint(tmp_path: Path) -> None:
    bad = tmp_path / "legacy.safetensors"
    torch.save({"w": torch.zeros(2)}, bad, _use_new_zipfile_serialization=False)
    with pytest.raises(sapiens.CheckpointError, match=r"legacy pickle.*pickled weights .* refused"):
        sapiens.load_model(bad)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_a_plain_pickle_is_refused_with_the_hint(tmp_path: Path, protocol: int) -> None:
    bad = tmp_path / "plain.safetensors"
    bad.write_bytes(pickle.dumps({"w": [0.0] * 100}, protocol=protocol))
    with pytest.raises(sapiens.CheckpointError, match=rf"a pickle, protocol {protocol}.*save_file"):
        sapiens.load_model(bad)


def test_a_zip_torch_file_is_refused_with_the_hint(tmp_path: Path) -> None:
    bad = tmp_path / "zipped.safetensors"
    torch.save({"w": torch.zeros(2)}, bad)
    assert bad.read_bytes()[:4] == b"PK\x03\x04"
    with pytest.raises(sapiens.CheckpointError, match=r"zip archive.*pickled weights .* refused"):
        sapiens.load_model(bad)


def test_bytes_0x80_without_a_pickle_protocol_are_not_called_a_pickle(tmp_path: Path) -> None:
    bad = tmp_path / "odd.safetensors"
    bad.write_bytes(b"\x80\x00" + b"\x00" * 62)
    with pytest.raises(sapiens.CheckpointError, match="not a safetensors file") as err:
        sapiens.load_model(bad)
    assert "pickle" not in str(err.value)


def test_offsets_that_do_not_fit_the_dtype_are_named(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}
    raw = json.dumps(header).encode()
    bad = tmp_path / "offsets.safetensors"
    bad.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * 16)
    with pytest.raises(sapiens.CheckpointError, match=r"tensor 'w': F32 \[4\] does not fit"):
        sapiens.loading.read_header(bad)


def test_bytes_after_the_last_tensor_are_refused_as_safetensors_does(tmp_path: Path) -> None:
    bad = tmp_path / "trailing.safetensors"
    bad.write_bytes(_good_file(tmp_path).read_bytes() + b"\x00" * 8)
    with pytest.raises(sapiens.CheckpointError, match="8 bytes after the last tensor"):
        sapiens.loading.read_header(bad)


def test_a_gap_between_tensors_is_refused(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
    }
    raw = json.dumps(header).encode()
    bad = tmp_path / "gap.safetensors"
    bad.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * 12)
    with pytest.raises(sapiens.CheckpointError, match="tensor 'b' leaves a gap"):
        sapiens.loading.read_header(bad)


def test_other_model_family(tmp_path: Path) -> None:
    path = tmp_path / "vit.safetensors"
    save_file(
        {
            "pos_embed": torch.zeros(1, 197, 8),
            "blocks.0.attn.qkv.weight": torch.zeros(24, 8),
            "cls_token": torch.zeros(1, 1, 8),
        },
        str(path),
    )
    with pytest.raises(sapiens.CheckpointError, match="absolute position embedding"):
        sapiens.load_model(path)


def test_unknown_key_layout(tmp_path: Path) -> None:
    path = tmp_path / "odd.safetensors"
    save_file({"encoder.layer.0.weight": torch.zeros(2, 2)}, str(path))
    with pytest.raises(sapiens.CheckpointError, match="unknown key layout"):
        sapiens.load_model(path)


def test_wrapper_prefix_is_named(tmp_path: Path) -> None:
    model = tiny("seg")
    path = tmp_path / "wrapped.safetensors"
    save_file({f"module.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(path))
    with pytest.raises(sapiens.CheckpointError, match=r"starts with 'module\."):
        sapiens.load_model(path)


def test_missing_and_misshaped_tensors_are_listed(tmp_path: Path) -> None:
    sd = {k: v.contiguous() for k, v in tiny("normal").state_dict().items()}
    del sd["backbone.blocks.2.attn.proj.bias"]
    sd["backbone.blocks.1.ffn.w3.weight"] = torch.zeros(64, 100)
    sd["decode_head.extra.weight"] = torch.zeros(3)
    path = tmp_path / "broken.safetensors"
    save_file(sd, str(path))
    with pytest.raises(sapiens.CheckpointError) as err:
        sapiens.load_model(path)
    msg = str(err.value)
    assert "broken.safetensors" in msg
    assert "backbone.blocks.2.attn.proj.bias" in msg
    assert "backbone.blocks.1.ffn.w3.weight: file (64, 100) vs model (64, 256)" in msg
    assert "decode_head.extra.weight" in msg


def test_matting_layout_mismatch_is_reported(tmp_path: Path) -> None:
    sd = {k: v.contiguous() for k, v in tiny("normal").state_dict().items()}
    sd = {k.replace("conv_normal", "conv_matting"): v for k, v in sd.items()}
    sd["decode_head.matting_refiner.weight"] = torch.zeros(4, 4)
    path = tmp_path / "matting_v2.safetensors"
    save_file(sd, str(path))
    with pytest.raises(
        sapiens.CheckpointError, match="matting head's upstream layout is unverified"
    ):
        sapiens.load_model(path)


def test_nan_weights(tmp_path: Path) -> None:
    sd = {k: v.contiguous() for k, v in tiny("seg").state_dict().items()}
    sd["decode_head.conv_seg.weight"][0, 0] = float("nan")
    path = tmp_path / "nan.safetensors"
    save_file(sd, str(path))
    with pytest.raises(sapiens.CheckpointError, match=r"conv_seg\.weight"):
        sapiens.load_model(path)


def test_missing_file() -> None:
    with pytest.raises(sapiens.CheckpointError, match="no such file"):
        sapiens.load_model("/nonexistent/model.safetensors")


def test_header_metadata_is_kept(tmp_path: Path) -> None:
    path = _good_file(tmp_path)
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    header = json.loads(path.read_bytes()[8 : 8 + n])
    assert header["__metadata__"]["untrained"] == "true"
    assert isinstance(sapiens.load_model(path).info, ModelInfo)


# ----------------------------------------------------------------------------- bad inputs


def test_nan_input_is_a_clear_error() -> None:
    model = tiny(None)
    x = torch.zeros(1, 3, *SMALL_HW)
    x[0, 1, 5, 5] = float("nan")
    with pytest.raises(sapiens.InputError, match="1 NaN or Inf"):
        model(x)


def test_input_smaller_than_a_patch() -> None:
    with pytest.raises(sapiens.InputError, match="smaller than one 16x16 patch"):
        tiny(None)(torch.zeros(1, 3, 8, 8))


def test_input_not_a_multiple_is_not_cropped() -> None:
    with pytest.raises(sapiens.InputError, match="not a multiple of 16"):
        tiny(None)(torch.zeros(1, 3, 100, 96))
    with pytest.raises(sapiens.InputError, match="not a multiple of 64"):
        tiny(None, tokenizer=True)(torch.zeros(1, 3, 96, 64))


def test_the_same_model_saves_to_the_same_bytes(tmp_path: Path) -> None:
    """safetensors writes its metadata in hash order; save_model sorts it, so equal models
    give equal files (and sha256s) however many times, in whichever process, they are saved."""
    from sapiens.model import build_model

    model = build_model("tiny", "normal", input_hw=(256, 192), seed=3)
    digests = {sapiens.loading.save_model(model, tmp_path / f"{i}.safetensors") for i in range(4)}
    assert len(digests) == 1
    with safe_open(str(tmp_path / "0.safetensors"), "pt") as f:
        assert f.metadata()["untrained"] == "true"
    sapiens.loading.load_model(tmp_path / "0.safetensors")  # still a file the loader takes


def _mapped(path: Path) -> bool:
    """Whether any part of the file is memory-mapped in this process now."""
    target = str(path.resolve())
    with open("/proc/self/maps") as fh:
        return any(line.rstrip().endswith(target) for line in fh)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loaded_weights_hold_their_own_memory_not_a_map_of_the_file(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    """Loading reads the file into the weights once: no memory map of it stays behind (its
    read pages would count in the worker's memory beside the cast weights, or be the weights
    themselves, pages Dask counts as unmanaged and a rewrite of the file would fault)."""
    path = tmp_path / "m.safetensors"
    sapiens.save_model(tiny("normal", seed=5), path)
    loaded = sapiens.load_model(path, dtype=dtype)
    assert not _mapped(path)
    for name, t in loaded.state_dict().items():
        assert t.dtype == (torch.bfloat16 if name.endswith("periods") else dtype), name
