"""`svfx models convert`: released Sapiens v1 `.pth` (and `.pt2`) files become safetensors
through `sapiens.pth_reader`, an allow-list unpickler that never runs a pickled call.

Every file here is a small random-weight model saved with torch's own writers (torch.save,
torch.jit.save, torch.export.save) in each released layout, or a hostile/damaged variant of
one. The v1 size table gets a tiny test row ("sapiens_test") so that identification runs for
real on tensors small enough to write in milliseconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import types
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner, Result

from cli.main import app as svfx_app
from sapiens.errors import CheckpointError
from sapiens.pth_reader import pth_name_for, read_pth
from sapiens.safetensors_format import DTYPE_BYTES, read_tensor_index
from tasks.checkpoints.convert import convert_checkpoint

ROOT = Path(__file__).resolve().parents[1]
C, DEPTH, HEADS, FFN = 32, 2, 2, 128  # the "sapiens_test" row
HEAD_CH = 8
runner = CliRunner()
# torch.jit.trace/save are deprecated, but the released `_torchscript.pt2` files were made so
jit_deprecated = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


@pytest.fixture(autouse=True)
def tiny_v1_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from sapiens import v1_arch

    monkeypatch.setitem(v1_arch.V1_SIZES, "sapiens_test", (C, DEPTH, HEADS, FFN))


# -- model files ----------------------------------------------------------------------------
def v1_state(task: str | None, *, seed: int = 0, outputs: int | None = None) -> dict:
    """A v1 state dict with upstream names: bare pretrain keys (`task` None) or `backbone.*`
    with `decode_head.*` (seg, depth, normal) or `head.*` (pose). Random weights."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    bb: dict[str, torch.Tensor] = {
        "pos_embed": rand(1, 17 if task is None else 12, C),  # 4x4 + cls, or a 4x3 grid
        "patch_embed.projection.weight": rand(C, 3, 16, 16),
        "patch_embed.projection.bias": rand(C),
        "ln1.weight": rand(C),
        "ln1.bias": rand(C),
    }
    if task is None:
        bb["cls_token"] = rand(1, 1, C)
    for i in range(DEPTH):
        p = f"layers.{i}."
        for name, shape in {
            "ln1.weight": (C,),
            "ln1.bias": (C,),
            "ln2.weight": (C,),
            "ln2.bias": (C,),
            "attn.qkv.weight": (3 * C, C),
            "attn.qkv.bias": (3 * C,),
            "attn.proj.weight": (C, C),
            "attn.proj.bias": (C,),
            "ffn.layers.0.0.weight": (FFN, C),
            "ffn.layers.0.0.bias": (FFN,),
            "ffn.layers.1.weight": (C, FFN),
            "ffn.layers.1.bias": (C,),
        }.items():
            bb[p + name] = rand(*shape)
    if task is None:
        return bb
    prefix, last = ("head.", "final_layer") if task == "pose" else ("decode_head.", "conv_seg")
    out = outputs or {"seg": 28, "depth": 1, "normal": 3, "pose": 17}[task]
    head = {
        "deconv_layers.0.weight": rand(C, HEAD_CH, 4, 4),
        "deconv_layers.3.weight": rand(HEAD_CH, HEAD_CH, 4, 4),
        "conv_layers.0.weight": rand(HEAD_CH, HEAD_CH, 1, 1),
        "conv_layers.0.bias": rand(HEAD_CH),
        f"{last}.weight": rand(out, HEAD_CH, 1, 1),
        f"{last}.bias": rand(out),
    }
    return {
        **{f"backbone.{k}": v for k, v in bb.items()},
        **{prefix + k: v for k, v in head.items()},
    }


@contextlib.contextmanager
def fake_mmengine() -> Iterator[type]:
    """A class at `mmengine.config.config.ConfigDict` while a file is saved (pickle names it
    by module and qualname), pickled as addict's Dict is: a dict whose state is itself."""

    class ConfigDict(dict):
        def __getstate__(self) -> dict:
            return self

        def __setstate__(self, state: dict) -> None:
            self.update(state)

    ConfigDict.__module__ = "mmengine.config.config"
    ConfigDict.__qualname__ = "ConfigDict"
    names = ("mmengine", "mmengine.config", "mmengine.config.config")
    modules = {name: types.ModuleType(name) for name in names}
    modules["mmengine"].config = modules["mmengine.config"]  # type: ignore[attr-defined]
    modules["mmengine.config"].config = modules["mmengine.config.config"]  # type: ignore[attr-defined]
    modules["mmengine.config.config"].ConfigDict = ConfigDict  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in names}
    sys.modules.update(modules)
    try:
        yield ConfigDict
    finally:  # gone before anything is read: the reader must not need it
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def save_pose(path: Path, state: dict) -> Path:
    """A pose file as released: `{'state_dict', 'meta'}` with a ConfigDict, numpy arrays
    and dtypes and bytes in `meta`."""
    with fake_mmengine() as config_dict:
        meta = {
            "cfg": config_dict(model=config_dict(type="TopdownPoseEstimator", flip=True)),
            "dataset_meta": {
                "sigmas": np.linspace(0.1, 0.9, 17, dtype=np.float32),
                "flip_indices": np.arange(17, dtype=np.int64),
                "skeleton": np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),
                "names": np.array(["nose", "left_eye"]),
            },
            "dtype": np.dtype("float64"),
            "big": np.arange(3, dtype=">f4"),
            "blob": b"\x00\x01raw bytes",
            "epoch": 210,
        }
        torch.save({"state_dict": state, "meta": meta}, path)
    return path


def rewrite_zip(src: Path, dst: Path, edit: Callable[[str, bytes], bytes | None]) -> Path:
    """A copy of a zip with each record passed through `edit` (None drops it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)
    return dst


def bits(value: torch.Tensor | np.ndarray) -> bytes:
    """The raw little-endian bytes of a tensor, for bit-for-bit comparison."""
    if isinstance(value, torch.Tensor):
        value = value.detach().contiguous()
        if value.dtype == torch.bfloat16:
            value = value.view(torch.int16)
        value = value.numpy()
    return np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()


def assert_same_tensors(path: Path, expected: dict) -> None:
    """The safetensors file holds exactly these tensors, bit for bit."""
    with safe_open(str(path), framework="pt") as fh:
        assert sorted(fh.keys()) == sorted(expected)
        for key, value in expected.items():
            got = fh.get_tensor(key)
            assert got.dtype == value.dtype and got.shape == value.shape, key
            assert bits(got) == bits(value), key


def metadata_of(path: Path) -> dict[str, str]:
    return read_tensor_index(path)[1]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def no_files_but(directory: Path, *names: str) -> None:
    """Nothing was written beside the inputs: no DST, no hidden temporary file."""
    assert sorted(p.name for p in directory.iterdir()) == sorted(names)


def convert_cli(*args: str) -> Result:
    return runner.invoke(svfx_app, ["models", "convert", *args])


def assert_one_line_refusal(result: Result, *words: str) -> None:
    assert result.exit_code == 2, (result.output, result.exception)
    assert not result.exception or isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.stderr, (word, result.stderr)


# -- the released layouts, round trip ---------------------------------------------------------
def test_a_flat_pretrain_dict_converts_bit_for_bit(tmp_path):
    state = OrderedDict(v1_state(None))
    src = tmp_path / "sapiens_test_epoch_1_clean.pth"
    torch.save(state, src)
    dst = tmp_path / "out" / "pretrain.safetensors"
    result = convert_checkpoint(src, dst)
    assert_same_tensors(dst, state)
    meta = metadata_of(dst)
    assert meta == {
        "format": "pt",
        "family": "sapiens1",
        "arch": "sapiens_test",
        "size": "test",
        "task": "pretrain",
        "input_hw": "64,64",
        "source_file": src.name,
        "source_sha256": sha256(src),
        "source_format": "torch.save",
    }
    assert result.sha256 == sha256(dst) and result.source_sha256 == sha256(src)
    assert result.tensors == len(state)


@pytest.mark.parametrize(("task", "outputs"), [("seg", 28), ("depth", 1), ("normal", 3)])
def test_a_finetune_file_keeps_only_its_state_dict(tmp_path, task, outputs):
    state = v1_state(task)
    src = tmp_path / f"{task}.pth"
    torch.save({"state_dict": state, "meta": {"epoch": 151, "mmengine_version": "0.10.3"}}, src)
    dst = tmp_path / f"{task}.safetensors"
    convert_checkpoint(src, dst)
    assert_same_tensors(dst, state)  # meta is not there
    meta = metadata_of(dst)
    assert (meta["family"], meta["size"], meta["task"]) == ("sapiens1", "test", task)
    assert meta["input_hw"] == "64,48"
    assert meta.get("classes") == ("28" if task == "seg" else None)
    assert list(read_tensor_index(dst)[0]) == sorted(state)  # all F32: in name order


def test_a_pose_file_with_configdict_numpy_meta_converts(tmp_path):
    state = v1_state("pose")
    src = save_pose(tmp_path / "sapiens_test_coco_best_coco_AP_796.pth", state)
    assert "mmengine" not in sys.modules
    data = zipfile.ZipFile(src).read(f"{src.stem}/data.pkl")
    for name in (b"mmengine.config.config\nConfigDict", b"_reconstruct", b"numpy\ndtype"):
        assert name in data  # the file really holds what released pose files hold
    dst = tmp_path / "pose.safetensors"
    convert_checkpoint(src, dst)
    assert_same_tensors(dst, state)
    meta = metadata_of(dst)
    assert (meta["task"], meta["keypoints"], meta["keypoint_set"]) == ("pose", "17", "coco")


def test_numpy_1_names_as_in_the_released_pose_files_are_read(tmp_path):
    """numpy 2 writes `numpy._core.multiarray`; the released files (numpy 1) say
    `numpy.core.multiarray`. Re-zipped by Python's zipfile: storages not 64-byte aligned."""
    state = v1_state("pose", outputs=308)
    new = save_pose(tmp_path / "new.pth", state)

    def numpy1(name: str, data: bytes) -> bytes:
        if name.endswith("data.pkl"):
            assert b"numpy._core.multiarray\n_reconstruct" in data
            return data.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
        return data

    src = rewrite_zip(new, tmp_path / "old.pth", numpy1)
    checkpoint = read_pth(src)
    assert checkpoint.layout == "state_dict"
    assert {k: bits(a) for k, a in checkpoint.arrays.items()} == {
        k: bits(v) for k, v in state.items()
    }
    dst = tmp_path / "goliath.safetensors"
    convert_checkpoint(src, dst)
    assert metadata_of(dst)["keypoint_set"] == "goliath"


def test_dtypes_views_and_shared_storages_are_read_bit_for_bit(tmp_path):
    """BF16 stays BF16 (uint16 bits in numpy), views keep their offset and strides."""
    base = torch.randn(6, 5)
    tensors = {
        "f32": torch.randn(3, 4),
        "bf16": torch.randn(4, 3).to(torch.bfloat16),
        "f16": torch.randn(5).half(),
        "f64": torch.randn(2, 2).double(),
        "i64": torch.arange(7),
        "i32": torch.arange(5, dtype=torch.int32),
        "u8": torch.arange(9, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "transposed": base.t(),
        "slice": base[2:4, 1:],
        "whole": base,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "expanded": torch.randn(3, 1).expand(3, 4),
        "nan": torch.tensor([float("nan"), float("inf"), -0.0]),
    }
    src = tmp_path / "dtypes.pth"
    torch.save(tensors, src)
    checkpoint = read_pth(src)
    assert checkpoint.dtypes["bf16"] == "BF16" and checkpoint.arrays["bf16"].dtype == np.uint16
    assert checkpoint.dtypes["bool"] == "BOOL" and checkpoint.dtypes["f64"] == "F64"
    for key, value in tensors.items():
        assert checkpoint.arrays[key].shape == tuple(value.shape), key
        assert bits(checkpoint.arrays[key]) == bits(value), key
    from tasks.checkpoints.convert import write_safetensors

    out = tmp_path / "dtypes.safetensors"
    with open(out, "wb") as fh:
        write_safetensors(fh, checkpoint.arrays, checkpoint.dtypes, {"format": "pt"})
    assert_same_tensors(out, {k: v.contiguous() for k, v in tensors.items()})
    entries, _ = read_tensor_index(out)  # widest first: every tensor aligned to its itemsize
    assert all(e.begin % DTYPE_BYTES[e.dtype] == 0 for e in entries.values())


def test_a_big_endian_archive_is_written_little_endian(tmp_path):
    state = {"w": torch.randn(3, 4), "b": torch.arange(5)}
    little = tmp_path / "little.pth"
    torch.save(state, little)
    sizes = {"0": 4, "1": 8}  # storage keys in save order: w (f32), b (i64)

    def big(name: str, data: bytes) -> bytes:
        if name.endswith("/byteorder"):
            return b"big"
        key = name.rsplit("/", 1)[-1]
        if "/data/" in name and key in sizes:
            return np.frombuffer(data, dtype=f"<u{sizes[key]}").byteswap().tobytes()
        return data

    checkpoint = read_pth(rewrite_zip(little, tmp_path / "big.pth", big))
    assert checkpoint.arrays["w"].dtype.byteorder == ">"
    assert bits(checkpoint.arrays["w"]) == bits(state["w"])
    assert bits(checkpoint.arrays["b"]) == bits(state["b"])


def test_reading_needs_no_torch(tmp_path):
    """The reader and the converter run with `import torch` made impossible."""
    src = tmp_path / "seg.pth"
    torch.save({"state_dict": v1_state("seg"), "meta": {}}, src)
    pose = save_pose(tmp_path / "pose.pth", v1_state("pose"))
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from sapiens import v1_arch\n"
        f"v1_arch.V1_SIZES['sapiens_test'] = {(C, DEPTH, HEADS, FFN)}\n"
        "from tasks.checkpoints.convert import convert_checkpoint\n"
        f"r = convert_checkpoint({str(src)!r}, {str(tmp_path / 'a.safetensors')!r})\n"
        f"p = convert_checkpoint({str(pose)!r}, {str(tmp_path / 'b.safetensors')!r})\n"
        "print(r.metadata['task'], p.metadata['task'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["seg", "pose"]


# -- hostile pickles: refused, and nothing runs ----------------------------------------------
class Payload:
    """An object whose unpickling calls `call(*args)`: what a malicious checkpoint holds."""

    def __init__(self, call: Callable, *args: object) -> None:
        self.call, self.args = call, args

    def __reduce__(self) -> tuple:
        return self.call, self.args


def payloads(marker: Path) -> dict[str, Payload]:
    """Payloads by the global name torch.save's protocol-2 pickle gives their callable
    (protocol 2 writes Python 3 names as Python 2's: `__builtin__`, `commands`)."""
    touch = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    return {
        "posix.system": Payload(os.system, f"touch {marker}"),
        "__builtin__.eval": Payload(eval, touch),
        "__builtin__.exec": Payload(exec, touch),
        "commands.call": Payload(subprocess.call, ["touch", str(marker)]),
    }


@pytest.mark.parametrize(
    ("name", "spelled"),
    [
        ("posix.system", "posix.system"),
        ("__builtin__.eval", "__builtin__.eval (builtins.eval)"),
        ("__builtin__.exec", "__builtin__.exec (builtins.exec)"),
        ("commands.call", "commands.call (subprocess.call)"),
    ],
)
def test_a_hostile_pickle_is_refused_and_never_runs(tmp_path, name, spelled):
    marker = tmp_path / "pwned"
    src = tmp_path / "evil.pth"
    meta = {"note": payloads(marker)[name]}
    torch.save({"state_dict": v1_state("seg"), "meta": meta}, src)
    assert not marker.exists()
    with pytest.raises(CheckpointError) as refused:
        read_pth(src)
    assert refused.value.path == str(src)
    assert f"asks for the global {spelled}," in refused.value.reason
    assert "nothing in the file was run" in refused.value.reason
    result = convert_cli(str(src), str(tmp_path / "evil.safetensors"))
    assert_one_line_refusal(result, str(src), spelled)
    assert not marker.exists()
    no_files_but(tmp_path, "evil.pth")
    # the control: an unrestricted load of the same file does run it
    torch.load(src, weights_only=False)
    assert marker.exists()


def torch_zip(path: Path, pickle_bytes: bytes, **records: bytes) -> Path:
    """A zip laid out as torch.save lays it out, around a hand-written data.pkl."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickle_bytes)
        zf.writestr("archive/byteorder", b"little")
        zf.writestr("archive/version", b"3\n")
        for name, data in records.items():
            zf.writestr(f"archive/{name}", data)
    return path


@pytest.mark.parametrize(
    ("label", "program", "global_name"),
    [
        ("protocol 0 REDUCE", b"cposix\nsystem\n(S'touch {m}'\ntR.", "posix.system"),
        ("INST opcode", b"(S'touch {m}'\nios\nsystem\n.", "os.system"),
        ("a module class outside TorchScript", b"\x80\x02c__torch__\nM\n)\x81}b.", "__torch__.M"),
        ("torch.load itself", b"\x80\x02ctorch\nload\nX\x01\x00\x00\x00x\x85R.", "torch.load"),
        ("a numpy scalar", b"\x80\x02cnumpy.core.multiarray\nscalar\n.", "scalar"),
        ("protocol 4 STACK_GLOBAL", b"builtins.eval", "builtins.eval"),
    ],
)
def test_hand_written_hostile_pickles_are_refused(tmp_path, label, program, global_name):
    marker = tmp_path / "pwned"
    if program == b"builtins.eval":
        program = pickle.dumps(payloads(marker)["__builtin__.eval"], protocol=4)
    src = torch_zip(tmp_path / "x.pth", program.replace(b"{m}", str(marker).encode()))
    with pytest.raises(CheckpointError, match="refused") as refused:
        read_pth(src)
    assert global_name in refused.value.reason, label
    assert not marker.exists()


def test_storage_stand_ins_cannot_be_abused(tmp_path):
    """A REDUCE on an allowed marker, or a storage that is not a storage, is a plain refusal."""
    call_marker = b"\x80\x02ctorch\nFloatStorage\n)R."
    with pytest.raises(CheckpointError, match="damaged"):
        read_pth(torch_zip(tmp_path / "a.pth", call_marker))
    not_a_storage = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(K\x00K\x00))\x89NtR."
    with pytest.raises(CheckpointError, match="not a storage"):
        read_pth(torch_zip(tmp_path / "b.pth", not_a_storage))
    persid = (  # ('storage', FloatStorage, '0', 'cpu', 4 elements) for an 8-byte record
        b"\x80\x02(X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
        b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ."
    )
    with pytest.raises(CheckpointError, match="holds 8 bytes"):
        read_pth(torch_zip(tmp_path / "c.pth", persid, **{"data/0": b"\x00" * 8}))


def test_a_tensor_reaching_past_its_storage_is_refused(tmp_path):
    src = tmp_path / "ok.pth"
    torch.save({"w": torch.randn(2, 3)}, src)

    def stretch(name: str, data: bytes) -> bytes:
        if name.endswith("data.pkl"):  # size (2, 3) -> (2, 9): past the 6 stored floats
            assert b"K\x02K\x03\x86" in data
            return data.replace(b"K\x02K\x03\x86", b"K\x02K\x09\x86", 1)
        return data

    with pytest.raises(CheckpointError, match="reaches element"):
        read_pth(rewrite_zip(src, tmp_path / "stretched.pth", stretch))


# -- damaged and foreign files ----------------------------------------------------------------
def test_a_truncated_file_is_refused_and_nothing_is_written(tmp_path):
    whole = tmp_path / "whole.pth"
    torch.save({"state_dict": v1_state("seg"), "meta": {}}, whole)
    src = tmp_path / "cut.pth"
    src.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated") as refused:
        read_pth(src)
    assert refused.value.path == str(src)
    result = convert_cli(str(src), str(tmp_path / "cut.safetensors"))
    assert_one_line_refusal(result, str(src), "truncated")
    no_files_but(tmp_path, "whole.pth", "cut.pth")


def test_a_missing_storage_is_named(tmp_path):
    src = tmp_path / "ok.pth"
    torch.save({"state_dict": v1_state("seg"), "meta": {}}, src)
    gone = rewrite_zip(
        src, tmp_path / "gone.pth", lambda n, d: None if n.endswith("/data/3") else d
    )
    with pytest.raises(CheckpointError, match=r"references storage ok/data/3, which the archive"):
        read_pth(gone)


def test_a_damaged_storage_fails_its_crc(tmp_path):
    src = tmp_path / "ok.pth"
    torch.save({"w": torch.zeros(64)}, src)
    data = bytearray(src.read_bytes())
    info = zipfile.ZipFile(src).getinfo("ok/data/0")
    at = data.index(b"\x00" * 64, info.header_offset + 30)
    data[at + 10] ^= 0xFF
    src.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC"):
        read_pth(src)


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("legacy", ["legacy pickle format", "re-save it in the zip format"]),
        ("pickle", ["a pickle, protocol", "not torch's zip format"]),
        ("tar", ["tar archive", "re-save"]),
        ("text", ["not a torch checkpoint: it is not a zip archive"]),
        ("empty", ["empty file"]),
        ("safetensors", ["already a safetensors file"]),
        ("other zip", ["not a torch checkpoint (no data.pkl)"]),
    ],
)
def test_a_file_that_is_not_a_torch_zip_says_what_it_is(tmp_path, kind, words):
    src = tmp_path / "weights.pth"
    if kind == "legacy":
        torch.save({"w": torch.randn(2)}, src, _use_new_zipfile_serialization=False)
    elif kind == "pickle":
        src.write_bytes(pickle.dumps({"w": [1.0, 2.0]}, protocol=4))
    elif kind == "tar":
        with tarfile.open(src, "w") as tar:
            info = tarfile.TarInfo("sys_info")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    elif kind == "text":
        src.write_text("hello, not weights\n" * 10)
    elif kind == "empty":
        src.write_bytes(b"")
    elif kind == "safetensors":
        from safetensors.torch import save_file

        save_file({"w": torch.randn(2)}, str(src))
    else:
        with zipfile.ZipFile(src, "w") as zf:
            zf.writestr("photos/a.txt", b"x")
    with pytest.raises(CheckpointError) as refused:
        read_pth(src)
    for word in words:
        assert word in refused.value.reason, (word, refused.value.reason)
    result = convert_cli(str(src), str(tmp_path / "w.safetensors"))
    assert_one_line_refusal(result, str(src), words[0])


def test_tensors_that_are_no_v1_model_are_refused(tmp_path):
    src = tmp_path / "other.pth"
    torch.save({"encoder.weight": torch.randn(4, 4)}, src)
    result = convert_cli(str(src), str(tmp_path / "other.safetensors"))
    assert_one_line_refusal(result, str(src), "not a Sapiens v1 checkpoint")
    no_files_but(tmp_path, "other.pth")


def test_a_dict_with_other_entries_is_refused(tmp_path):
    src = tmp_path / "mixed.pth"
    torch.save({"w": torch.randn(2), "epoch": 3}, src)
    with pytest.raises(CheckpointError, match=r"not named tensors: \['epoch'\]"):
        read_pth(src)


# -- .pt2 files ------------------------------------------------------------------------------
class Holder(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def module_from_state(state: dict) -> torch.nn.Module:
    """A module tree whose parameters carry exactly these dotted names."""
    root = Holder()
    for key, value in state.items():
        *path, leaf = key.split(".")
        module: torch.nn.Module = root
        for part in path:
            child = module._modules.get(part)
            if child is None:
                child = torch.nn.Module()
                module.add_module(part, child)
            module = child
        module.register_parameter(leaf, torch.nn.Parameter(value, requires_grad=False))
    return root


@jit_deprecated
def test_a_torchscript_pt2_is_read_without_its_code(tmp_path):
    """torch.jit.save's data.pkl rebuilds tensors with `_rebuild_tensor_v2` from storages,
    like torch.save, with the module tree as `__torch__.*` objects (kept as inert attribute
    bags). The traced model's non-persistent preprocessor buffers are left out."""
    state = v1_state("normal")
    model = module_from_state(state)
    model.data_preprocessor = torch.nn.Module()
    model.data_preprocessor.register_buffer("mean", torch.tensor([123.7, 116.3, 103.5]), False)
    traced = torch.jit.trace(model, torch.randn(2))
    src = tmp_path / "sapiens_test_normal_render_people_epoch_66_torchscript.pt2"
    torch.jit.save(traced, str(src))
    records = zipfile.ZipFile(src).namelist()
    assert any("/code/" in n for n in records) and any(n.endswith("constants.pkl") for n in records)
    dst = tmp_path / "normal.safetensors"
    result = convert_checkpoint(src, dst)
    assert_same_tensors(dst, state)
    assert metadata_of(dst)["source_format"] == "TorchScript"
    assert metadata_of(dst)["task"] == "normal"
    assert result.notes == [
        "left out data_preprocessor.mean (a non-persistent buffer TorchScript keeps; "
        "a .pth has none)"
    ]


def test_a_torchscript_module_that_is_hostile_is_refused(tmp_path):
    """`__torch__.*` classes are attribute bags only inside a TorchScript archive; any other
    global there is refused as anywhere else."""
    evil = (  # a module whose attribute x is posix.system("true")
        b"\x80\x02c__torch__\nM\n)\x81}(X\x01\x00\x00\x00x"
        b"cposix\nsystem\nX\x04\x00\x00\x00true\x85Rub."
    )
    src = torch_zip(
        tmp_path / "m_torchscript.pt2",
        evil,
        **{"constants.pkl": b"\x80\x02).", "code/__torch__.py": b""},
    )
    with pytest.raises(CheckpointError, match=r"posix\.system") as refused:
        read_pth(src)
    assert "convert m.pth instead" in refused.value.reason


def test_a_torch_export_pt2_keeps_its_bf16_weights(tmp_path):
    state = {k: v.to(torch.bfloat16) for k, v in v1_state("depth").items()}
    program = torch.export.export(module_from_state(state), (torch.randn(2),))
    src = tmp_path / "sapiens_test_render_people_epoch_100_bfloat16.pt2"
    torch.export.save(program, str(src))
    dst = tmp_path / "depth.safetensors"
    result = convert_checkpoint(src, dst)
    assert_same_tensors(dst, state)
    assert {read_tensor_index(dst)[0][k].dtype for k in state} == {"BF16"}
    assert metadata_of(dst)["source_format"] == "torch.export"
    assert any("bf16" in note for note in result.notes)


def test_a_torch_2_3_export_archive_is_read(tmp_path):
    """torch <= 2.5 wrote `serialized_state_dict.pt` (torch.save of the Parameters) beside
    the program's JSON; the released `_bfloat16.pt2` files come from torch 2.3."""
    state = {k: v.to(torch.bfloat16) for k, v in v1_state("seg").items()}
    saved = {k: torch.nn.Parameter(v) for k, v in state.items()}
    saved["data_preprocessor.mean"] = torch.tensor([123.7, 116.3, 103.5], dtype=torch.bfloat16)
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    src = tmp_path / "sapiens_test_goliath_best_goliath_mIoU_7994_epoch_151_bfloat16.pt2"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("serialized_exported_program.json", json.dumps({"graph_module": {}}))
        zf.writestr("serialized_state_dict.pt", buffer.getvalue())
        zf.writestr("serialized_constants.pt", b"")
        zf.writestr("version", "5.1")
    assert b"_rebuild_parameter" in zipfile.ZipFile(io.BytesIO(buffer.getvalue())).read(
        "archive/data.pkl"
    )
    dst = tmp_path / "seg.safetensors"
    result = convert_checkpoint(src, dst)
    assert_same_tensors(dst, state)  # the preprocessor's mean is left out, and said so
    assert any(note.startswith("left out data_preprocessor.mean") for note in result.notes)


def test_an_unreadable_bf16_pt2_names_the_pth_to_convert(tmp_path):
    src = tmp_path / "sapiens_1b_goliath_best_goliath_mIoU_7994_epoch_151_bfloat16.pt2"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("serialized_exported_program.json", "{}")
    result = convert_cli(str(src), str(tmp_path / "seg.safetensors"))
    assert_one_line_refusal(
        result,
        str(src),
        "without serialized_state_dict.pt",
        "convert sapiens_1b_goliath_best_goliath_mIoU_7994_epoch_151.pth instead",
    )


@jit_deprecated
def test_a_pt2_of_another_model_names_the_pth_to_convert(tmp_path):
    traced = torch.jit.trace(
        module_from_state({"encoder.weight": torch.randn(4, 4)}), torch.ones(1)
    )
    src = tmp_path / "sapiens_1b_epoch_173_torchscript.pt2"
    torch.jit.save(traced, str(src))
    result = convert_cli(str(src), str(tmp_path / "pretrain.safetensors"))
    assert_one_line_refusal(
        result, "not a Sapiens v1 checkpoint", "convert sapiens_1b_epoch_173_clean.pth instead"
    )
    no_files_but(tmp_path, src.name)


def test_pt2_names_map_to_their_pth():
    assert pth_name_for("sapiens_1b_epoch_173_bfloat16.pt2") == "sapiens_1b_epoch_173_clean.pth"
    assert pth_name_for("sapiens_0.3b_epoch_1600_torchscript.pt2") == (
        "sapiens_0.3b_epoch_1600_clean.pth"
    )
    assert pth_name_for("sapiens_2b_render_people_epoch_25_bfloat16.pt2") == (
        "sapiens_2b_render_people_epoch_25.pth"
    )
    assert pth_name_for("sapiens_1b_coco_best_coco_AP_821_torchscript.pt2") == (
        "sapiens_1b_coco_best_coco_AP_821.pth"
    )
    assert pth_name_for("model.pth") is None


# -- the command ------------------------------------------------------------------------------
def test_the_command_converts_and_says_what_it_wrote(tmp_path):
    src = save_pose(tmp_path / "pose.pth", v1_state("pose"))
    dst = tmp_path / "pose.safetensors"
    result = convert_cli(str(src), str(dst))
    assert result.exit_code == 0, (result.output, result.exception)
    out = result.stdout
    assert f"wrote {dst.resolve()}" in out
    assert "sapiens1 test pose (17 keypoints, coco)" in out
    assert f"sha256: {sha256(dst)}" in out
    assert f"source sha256: {sha256(src)}" in out
    as_json = runner.invoke(
        svfx_app, ["models", "convert", str(src), str(dst), "--force", "--json"]
    )
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.stdout)
    assert report["sha256"] == sha256(dst)
    assert report["metadata"]["family"] == "sapiens1"


def test_an_existing_destination_needs_force(tmp_path):
    src = tmp_path / "seg.pth"
    torch.save({"state_dict": v1_state("seg"), "meta": {}}, src)
    dst = tmp_path / "seg.safetensors"
    dst.write_bytes(b"keep me")
    assert_one_line_refusal(convert_cli(str(src), str(dst)), str(dst), "--force")
    assert dst.read_bytes() == b"keep me"
    result = convert_cli(str(src), str(dst), "--force")
    assert result.exit_code == 0, result.output
    assert metadata_of(dst)["task"] == "seg"
    no_files_but(tmp_path, "seg.pth", "seg.safetensors")


def test_the_destination_must_be_safetensors(tmp_path):
    src = tmp_path / "seg.pth"
    torch.save(v1_state("seg"), src)
    assert_one_line_refusal(
        convert_cli(str(src), str(tmp_path / "seg.pt")), "must end in .safetensors"
    )
    assert_one_line_refusal(convert_cli(str(src), str(src)), "must end in .safetensors")
    missing = tmp_path / "nope.pth"
    assert_one_line_refusal(
        convert_cli(str(missing), str(tmp_path / "x.safetensors")), "no such file"
    )


def test_models_without_a_subcommand_still_lists(tmp_path, monkeypatch):
    monkeypatch.setenv("SVFX_HOME", str(tmp_path / "home"))
    root = tmp_path / "checkpoints"
    root.mkdir()
    result = runner.invoke(svfx_app, ["models", "--checkpoint-root", str(root), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    help_text = runner.invoke(svfx_app, ["models", "--help"]).stdout
    assert "convert" in help_text and "--checkpoint-root" in help_text


# -- the loader still refuses pickles ---------------------------------------------------------
def test_the_loader_still_refuses_the_pth_itself(tmp_path):
    import sapiens
    from tasks.checkpoints.files import describe_checkpoint, scan_checkpoints

    root = tmp_path / "root"
    root.mkdir()
    src = root / "sapiens_test_goliath.pth"
    torch.save({"state_dict": v1_state("seg"), "meta": {}}, src)
    with pytest.raises(CheckpointError, match="pickled weights") as refused:
        sapiens.load_model(src)
    assert refused.value.path == str(src)
    with pytest.raises(CheckpointError, match="pickled weights"):
        describe_checkpoint(src)
    assert scan_checkpoints(root) == []  # a .pth under the root is not even looked at
    convert_checkpoint(src, root / "seg.safetensors")
    with pytest.raises(CheckpointError, match="pickled weights"):
        sapiens.load_model(src)  # converting changes nothing about the source
