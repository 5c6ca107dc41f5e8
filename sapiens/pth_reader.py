"""The tensors of a torch checkpoint, read without torch.load and without running anything the
file asks for: the converter's reader for released Sapiens v1 files.

Why not torch.load: a pickle is a small program whose REDUCE opcodes call any global it names
(`os.system`, `builtins.eval`, ...). Here every global goes through `find_class`, which hands
back OUR stand-in for the few names a checkpoint needs (tensor rebuilds, storage types,
OrderedDict and, for the pose files' `meta`, numpy arrays and dtypes, `_codecs.encode` and
mmengine's ConfigDict) and refuses any other name before it is looked up, so nothing of the
file's choosing is imported or called. Tensors are numpy views of the archive's raw storages,
memory-mapped, so an 8 GB file costs no 8 GB of RAM.

Formats (all zip archives; legacy tar/raw-pickle torch files are refused with how to re-save):
- torch.save: `<dir>/data.pkl` + `<dir>/data/<key>` raw storages + `<dir>/byteorder`. A flat
  tensor dict (pretrain `_clean.pth`) or `{'state_dict', 'meta'}` (finetune files: only
  `state_dict` is kept).
- TorchScript (`_torchscript.pt2`): the same `data.pkl` and storages, with the module tree as
  `__torch__.*` objects; read as inert attribute bags, `code/` is never read. The traced
  model's `data_preprocessor.*` buffers (non-persistent: a `.pth` lacks them) are dropped.
- torch.export (`_bfloat16.pt2`): the weights are data (torch <= 2.5: a nested torch.save zip
  `serialized_state_dict.pt`; later: raw records described by a JSON weights config), read
  without the graph. Any refusal of a `.pt2` names the `.pth` to convert instead.

dtypes: as stored, named as safetensors names them (F32, BF16, ...). numpy has no bfloat16,
so BF16 tensors are uint16 arrays of the raw bits, kept as BF16 (never widened to fp32): the
converter writes them bit for bit.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import re
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .errors import CheckpointError
from .safetensors_format import foreign_format

# torch storage class -> (safetensors dtype, numpy type of its raw bits, no byte order)
STORAGE_DTYPES: dict[str, tuple[str, str]] = {
    "DoubleStorage": ("F64", "f8"),
    "FloatStorage": ("F32", "f4"),
    "HalfStorage": ("F16", "f2"),
    "BFloat16Storage": ("BF16", "u2"),
    "LongStorage": ("I64", "i8"),
    "IntStorage": ("I32", "i4"),
    "ShortStorage": ("I16", "i2"),
    "CharStorage": ("I8", "i1"),
    "ByteStorage": ("U8", "u1"),
    "BoolStorage": ("BOOL", "b1"),
    "UntypedStorage": ("U8", "u1"),
}
# torch.export's schema.ScalarType -> the same pair (torch/_export/serde/schema.py)
EXPORT_DTYPES: dict[int, tuple[str, str]] = {
    1: ("U8", "u1"),
    2: ("I8", "i1"),
    3: ("I16", "i2"),
    4: ("I32", "i4"),
    5: ("I64", "i8"),
    6: ("F16", "f2"),
    7: ("F32", "f4"),
    8: ("F64", "f8"),
    12: ("BOOL", "b1"),
    13: ("BF16", "u2"),
}
# Tensors of a deployed model that a `.pth` never holds: mmengine's data preprocessor registers
# its mean/std as non-persistent buffers, which TorchScript keeps (every attribute is) and an
# exported program may keep.
DEPLOY_ONLY_PREFIXES = ("data_preprocessor.",)
RESAVE_HINT = (
    "this reader takes only torch's zip format (what torch >= 1.6 writes); the released "
    "Sapiens files are in it, so fetch the file again, or re-save it in the zip format on a "
    "machine you trust and convert that"
)
_PRETRAIN_BASE = re.compile(r"sapiens_[0-9.]+b_epoch_\d+")
_NUMPY_DTYPE_NAME = re.compile(r"b1|[iu][1248]|f(2|4|8|16)|c(8|16|32)|[US]\d{1,9}")


@dataclass(frozen=True)
class TorchCheckpoint:
    """What `read_pth` found: tensor name -> numpy array (BF16 as uint16 bits; arrays may be
    strided, big-endian views of a memory map) and each one's safetensors dtype name."""

    path: str
    source: str  # "torch.save", "TorchScript" or "torch.export"
    layout: str  # "flat dict", "state_dict", "module tree" or "exported program"
    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]
    dropped: tuple[str, ...] = ()  # tensors left out, and why, one line each

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: tuple(a.shape) for key, a in self.arrays.items()}


def read_pth(path: str | os.PathLike[str], *, verify_crc: bool = True) -> TorchCheckpoint:
    """Every tensor of a torch checkpoint (see the module docstring), or CheckpointError
    naming the file and why: not a torch zip, truncated, a storage missing or damaged (its
    CRC, when `verify_crc`), a pickled global outside the allow-list."""
    path = os.fspath(path)
    try:
        return _read(path, verify_crc)
    except CheckpointError as exc:
        hint = pth_hint(path)
        if hint is None:
            raise
        raise CheckpointError(path, f"{exc.reason}; {hint}") from None


def pth_name_for(name: str) -> str | None:
    """The released `.pth` a `.pt2` was made from (reference §4 base names), or None."""
    for suffix in ("_bfloat16.pt2", "_float16.pt2", "_torchscript.pt2"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            return f"{base}_clean.pth" if _PRETRAIN_BASE.fullmatch(base) else f"{base}.pth"
    return None


def pth_hint(path: str) -> str | None:
    pth = pth_name_for(Path(path).name)
    if pth is None:
        return None
    return f"convert {pth} instead (the released fp32 original of this file)"


# ---------------------------------------------------------------------------------------------
# Archives


class _Bad(Exception):
    """A refusal inside the reader; `read_pth` names the file."""


class _Window(io.RawIOBase):
    """A byte range of an open file as a seekable file, so zipfile can read a zip stored
    inside another (torch.export's nested state dict) without copying it."""

    def __init__(self, fh: BinaryIO, start: int, size: int) -> None:
        super().__init__()
        self._fh, self._start, self._size, self._pos = fh, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        self._fh.seek(self._start + self._pos)
        got = self._fh.readinto(view[:n]) or 0
        self._pos += got
        return got


class _Zip:
    """One zip archive at [start, start + size) of the file: its records by name, small ones
    read through zipfile (CRC checked), storages as views of the file's memory map."""

    def __init__(
        self, fh: BinaryIO, mm: np.ndarray, start: int, size: int, what: str, verify_crc: bool
    ) -> None:
        self.fh, self.mm, self.start, self.size, self.what = fh, mm, start, size, what
        self.verify_crc = verify_crc
        try:
            self.zf = zipfile.ZipFile(_Window(fh, start, size))
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise _Bad(
                f"truncated or damaged: {what} starts as a zip archive but its zip directory "
                f"(at the end) is missing or unreadable ({exc}); was the download cut short?"
            ) from None
        self.infos = {info.filename: info for info in self.zf.infolist()}
        self._checked: dict[str, np.ndarray] = {}

    def read(self, name: str) -> bytes:
        try:
            return self.zf.read(name)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, zlib.error) as exc:
            raise _Bad(f"damaged record {name} in {self.what}: {exc}") from None

    def span(self, name: str) -> tuple[int, int]:
        """Where an uncompressed record's bytes lie in the whole file."""
        info = self.infos[name]
        if info.compress_type != zipfile.ZIP_STORED:
            raise _Bad(f"record {name} is compressed; torch writes tensor data uncompressed")
        at = self.start + info.header_offset
        head = bytes(self.mm[at : at + 30])
        if len(head) < 30 or head[:4] != b"PK\x03\x04":
            raise _Bad(f"damaged archive: no local header for record {name}")
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        begin = at + 30 + name_len + extra_len
        end = begin + info.file_size
        if end > self.start + self.size:
            raise _Bad(
                f"truncated: record {name} needs bytes up to {end}, "
                f"{self.what} ends at {self.start + self.size}"
            )
        return begin, end

    def raw(self, name: str) -> np.ndarray:
        """A stored record as uint8 (a view of the memory map), its CRC checked once."""
        if name not in self._checked:
            begin, end = self.span(name)
            data = self.mm[begin:end]
            crc = self.infos[name].CRC
            if self.verify_crc and crc and zlib.crc32(data) != crc:
                raise _Bad(f"record {name} is damaged: its CRC does not match")
            self._checked[name] = data
        return self._checked[name]

    def nested(self, name: str) -> _Zip:
        begin, end = self.span(name)
        return _Zip(self.fh, self.mm, begin, end - begin, name, self.verify_crc)

    def folder(self) -> str:
        """The one top folder torch puts every record in ('archive/' or the file's stem)."""
        tops = {name.split("/", 1)[0] for name in self.infos if "/" in name}
        if len(tops) != 1:
            raise _Bad(
                f"{self.what} is a zip archive but not one torch writes (top folders: "
                f"{sorted(tops)[:5] or 'none'})"
            )
        return f"{tops.pop()}/"

    def byteorder(self, folder: str) -> str:
        """'<' or '>': the `byteorder` record (torch >= 2.1), little-endian without one."""
        name = f"{folder}byteorder"
        if name not in self.infos:
            return "<"
        order = self.read(name).strip()
        if order not in (b"little", b"big"):
            raise _Bad(f"record {name} says {order[:20]!r}, not little or big")
        return "<" if order == b"little" else ">"


def _read(path: str, verify_crc: bool) -> TorchCheckpoint:
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(path, "no such file")
    size = p.stat().st_size
    try:
        with open(p, "rb") as fh:
            head = fh.read(512)
            if not head.startswith(b"PK\x03\x04"):
                raise _Bad(_not_a_zip(head, size))
            mm = np.memmap(p, dtype=np.uint8, mode="r")
            return _dispatch(path, _Zip(fh, mm, 0, size, "the file", verify_crc))
    except _Bad as exc:
        raise CheckpointError(path, str(exc)) from None
    except OSError as exc:
        raise CheckpointError(path, f"cannot read: {exc}") from None


def _not_a_zip(head: bytes, size: int) -> str:
    if size == 0:
        return "empty file (0 bytes)"
    if head[257:262] == b"ustar":
        return f"a tar archive (torch's oldest save format), not torch's zip format; {RESAVE_HINT}"
    if len(head) >= 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < size:
        return "already a safetensors file: nothing to convert"
    foreign = foreign_format(head)
    if foreign is not None and "zip" not in foreign:
        return f"{foreign}, not torch's zip format; {RESAVE_HINT}"
    return (
        "not a torch checkpoint: it is not a zip archive (torch.save, torch.jit.save and "
        "torch.export.save all write one)"
    )


def _dispatch(path: str, top: _Zip) -> TorchCheckpoint:
    names = top.infos
    if "serialized_state_dict.pt" in names:  # torch.export.save, torch <= 2.5
        inner = _unpickle_torch_zip(top.nested("serialized_state_dict.pt"), script=False)
        return _result(path, "torch.export", "exported program", _plain_state(inner, "state dict"))
    if "serialized_exported_program.json" in names:
        raise _Bad("a torch.export archive without serialized_state_dict.pt")
    folder = top.folder()
    if f"{folder}archive_format" in names or any(
        n.startswith(f"{folder}data/weights/") for n in names
    ):
        return _result(path, "torch.export", "exported program", _export_weights(top, folder))
    if f"{folder}data.pkl" not in names:
        raise _Bad("a zip archive, but not a torch checkpoint (no data.pkl)")
    if f"{folder}constants.pkl" in names:  # TorchScript: never read code/ or constants.pkl
        root = _unpickle_torch_zip(top, script=True)
        if not isinstance(root, _ScriptObject):
            raise _Bad("a TorchScript archive whose data.pkl is not a module")
        found: dict[str, _Tensor] = {}
        _module_tensors(root, "", found, set())
        return _result(path, "TorchScript", "module tree", found)
    obj = _unpickle_torch_zip(top, script=False)
    layout = "flat dict"
    if isinstance(obj, dict) and "state_dict" in obj:
        obj, layout = obj["state_dict"], "state_dict"  # finetune files: meta is dropped
    return _result(path, "torch.save", layout, _plain_state(obj, layout))


def _result(path: str, source: str, layout: str, found: dict[str, _Tensor]) -> TorchCheckpoint:
    """The checkpoint, less (for the deployment formats) the buffers a `.pth` never has."""
    dropped: list[str] = []
    if source != "torch.save":
        dropped = sorted(k for k in found if k.startswith(DEPLOY_ONLY_PREFIXES))
    kept = {k: t for k, t in found.items() if k not in dropped}
    if not kept:
        raise _Bad(f"a {source} archive with no tensors")
    return TorchCheckpoint(
        path,
        source,
        layout,
        {k: t.array for k, t in kept.items()},
        {k: t.dtype for k, t in kept.items()},
        tuple(f"{k} (a non-persistent buffer {source} keeps; a .pth has none)" for k in dropped),
    )


def _plain_state(obj: object, what: str) -> dict[str, _Tensor]:
    """A name -> tensor dict, refused when it holds anything else."""
    if not isinstance(obj, dict):
        raise _Bad(f"the {what} is a {type(obj).__name__}, not a dict of tensors")
    others = [str(k) for k, v in obj.items() if not (isinstance(k, str) and isinstance(v, _Tensor))]
    if others:
        raise _Bad(f"the {what} holds entries that are not named tensors: {others[:8]}")
    if not obj:
        raise _Bad(f"the {what} holds no tensors")
    return obj


def _module_tensors(
    obj: _ScriptObject, prefix: str, out: dict[str, _Tensor], seen: set[int]
) -> None:
    """Parameters and buffers of a TorchScript module tree, by dotted attribute path."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    for name, value in obj.attributes.items():
        if not isinstance(name, str):
            continue
        if isinstance(value, _Tensor):
            out[prefix + name] = value
        elif isinstance(value, _ScriptObject):
            _module_tensors(value, f"{prefix}{name}.", out, seen)


def _export_weights(top: _Zip, folder: str) -> dict[str, _Tensor]:
    """Weights of a torch >= 2.6 PT2 archive: raw records and a JSON config of their
    dtypes, sizes and strides (or, older, one nested torch.save state dict)."""
    weights = f"{folder}data/weights/"
    configs = sorted(
        n for n in top.infos if re.fullmatch(rf"{re.escape(weights)}[^/]+_weights_config\.json", n)
    )
    legacy = sorted(n for n in top.infos if re.fullmatch(rf"{re.escape(weights)}[^/]+\.pt", n))
    if len(configs) + len(legacy) != 1:
        raise _Bad(
            f"a torch.export archive with {len(configs) + len(legacy)} weight sets under "
            f"{weights} (one model expected)"
        )
    if legacy:
        return _plain_state(_unpickle_torch_zip(top.nested(legacy[0]), script=False), "state dict")
    try:
        config = json.loads(top.read(configs[0]))["config"]
    except (ValueError, KeyError, TypeError):
        config = None
    if not isinstance(config, dict):
        raise _Bad(f"{configs[0]} is not a weights config")
    order = top.byteorder(folder)
    return {
        str(fqn): _export_tensor(top, weights, fqn, entry, order) for fqn, entry in config.items()
    }


def _export_tensor(top: _Zip, weights: str, fqn: str, entry: Any, order: str) -> _Tensor:
    try:
        record = weights + str(entry["path_name"])
        if record not in top.infos or "/" in str(entry["path_name"]):
            raise _Bad(f"weight {fqn} names record {record}, which the archive lacks")
        if entry["use_pickle"]:
            tensor = _unpickle_torch_zip(top.nested(record), script=False)
            if not isinstance(tensor, _Tensor):
                raise _Bad(f"weight {fqn} is pickled as a {type(tensor).__name__}, not a tensor")
            return tensor
        meta = entry["tensor_meta"]
        dtype, bits = EXPORT_DTYPES[int(meta["dtype"])]
        size = [int(d["as_int"]) for d in meta["sizes"]]
        stride = [int(d["as_int"]) for d in meta["strides"]]
        offset = int(meta["storage_offset"]["as_int"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _Bad(f"weight {fqn}: unreadable entry in the weights config ({exc!r})") from None
    raw = top.raw(record)
    itemsize = np.dtype(bits).itemsize
    if raw.size % itemsize:
        raise _Bad(f"record {record} holds {raw.size} bytes, not a whole number of {dtype}")
    storage = _Storage(record, dtype, raw.view(np.dtype(bits).newbyteorder(order)))
    return _rebuild_tensor(storage, offset, tuple(size), tuple(stride))


# ---------------------------------------------------------------------------------------------
# The restricted unpickler and its stand-ins


class _Inert:
    """Base of every object the unpickler makes: BUILD (`__setstate__`) on it is refused
    unless the class says what state it takes."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        raise _Bad(f"the pickle sets the state of a {type(self).__name__.strip('_')}")


class _StorageType(_Inert):
    """What `torch.FloatStorage` & co. become: a marker that says the dtype, never called."""

    __slots__ = ("bits", "dtype", "name")

    def __init__(self, name: str, dtype: str | None, bits: str | None) -> None:
        self.name, self.dtype, self.bits = name, dtype, bits


class _Storage(_Inert):
    """One storage record: its safetensors dtype and its elements (a view of the file)."""

    __slots__ = ("dtype", "elements", "key")

    def __init__(self, key: str, dtype: str, elements: np.ndarray) -> None:
        self.key, self.dtype, self.elements = key, dtype, elements


class _Tensor(_Inert):
    """What a tensor rebuild returns: a numpy view of its storage, and the dtype name."""

    __slots__ = ("array", "dtype")

    def __init__(self, dtype: str, array: np.ndarray) -> None:
        self.dtype, self.array = dtype, array


class _NdarrayType(_Inert):
    """`numpy.ndarray` as `_reconstruct`'s first argument: a marker."""

    __slots__ = ()


class _SafeArray(_Inert):
    """What `numpy.core.multiarray._reconstruct` returns: an empty slot that numpy's pickled
    state (shape, dtype, order, raw bytes) fills, checked, with `np.frombuffer`."""

    __slots__ = ("array",)

    def __setstate__(self, state: object) -> None:
        if hasattr(self, "array") or not isinstance(state, tuple) or len(state) not in (4, 5):
            raise _Bad("a numpy array with a state numpy does not write")
        shape, dtype, fortran, raw = state[-4:]
        if not isinstance(dtype, _SafeDtype) or not _int_tuple(shape):
            raise _Bad("a numpy array with a malformed shape or dtype")
        if isinstance(raw, str):
            raw = raw.encode("latin-1")  # protocol-0/1 pickles keep bytes as latin-1 text
        if not isinstance(raw, bytes):
            raise _Bad("a numpy array of Python objects (refused: unpickling them runs code)")
        dt = dtype.numpy()
        if len(raw) != prod(shape) * dt.itemsize:
            raise _Bad(f"a numpy array of shape {shape} with {len(raw)} bytes")
        flat = np.frombuffer(raw, dtype=dt) if raw else np.zeros(0, dtype=dt)
        self.array = flat.reshape(shape, order="F" if fortran else "C")


class _SafeDtype(_Inert):
    """`numpy.dtype(name, align, copy)` for plain numeric and string dtypes only (no object,
    structured or datetime dtypes), its byte order set from the pickled state."""

    __slots__ = ("byteorder", "name")

    def __init__(self, name: object, align: object = False, copy: object = True) -> None:
        if not isinstance(name, str) or not _NUMPY_DTYPE_NAME.fullmatch(name):
            raise _Bad(f"numpy dtype {name!r} (only plain numeric and string dtypes are read)")
        self.name, self.byteorder = name, "="

    def __setstate__(self, state: object) -> None:
        if not isinstance(state, tuple) or len(state) < 2 or state[1] not in ("<", ">", "|", "="):
            raise _Bad("a numpy dtype with a state numpy does not write")
        if len(state) > 4 and (state[3] is not None or state[4] is not None):
            raise _Bad("a structured numpy dtype")
        self.byteorder = state[1]

    def numpy(self) -> np.dtype:
        dt = np.dtype(self.name)
        return dt.newbyteorder(self.byteorder) if self.byteorder in "<>" else dt


class _ConfigDict(dict):
    """mmengine's ConfigDict (an addict.Dict: a dict whose pickled state is itself) as a
    plain dict."""

    def __setstate__(self, state: object) -> None:
        if state is not None and not isinstance(state, dict):
            raise _Bad("a ConfigDict whose state is not a dict")
        if state is not None and state is not self:
            self.update(state)


class _ScriptObject(_Inert):
    """A TorchScript module (`__torch__.*`): its pickled attributes, nothing more. Its class,
    and the code in the archive's `code/`, are never loaded."""

    __slots__ = ("_attributes",)

    @property
    def attributes(self) -> dict:
        return getattr(self, "_attributes", {})

    def __setstate__(self, state: object) -> None:
        if hasattr(self, "_attributes") or not isinstance(state, dict):
            raise _Bad("a TorchScript object whose state is not an attribute dict")
        self._attributes = state


def _int_tuple(value: object) -> bool:
    return isinstance(value, tuple | list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


def _rebuild_tensor(storage: object, offset: object, size: object, stride: object) -> _Tensor:
    """`torch._utils._rebuild_tensor`: the tensor as a read-only strided view of its
    storage, after checking every element it can reach lies inside the storage."""
    if not isinstance(storage, _Storage):
        raise _Bad("a tensor rebuilt from something that is not a storage")
    if not (isinstance(offset, int) and offset >= 0 and _int_tuple(size) and _int_tuple(stride)):
        raise _Bad(f"a tensor with a malformed offset, size or stride ({offset}, {size}, {stride})")
    size, stride = tuple(size), tuple(stride)  # type: ignore[arg-type]
    if len(size) != len(stride):
        raise _Bad(f"a tensor of size {size} with stride {stride}")
    elements = storage.elements
    if prod(size) == 0:
        return _Tensor(storage.dtype, np.zeros(size, dtype=elements.dtype))
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= elements.size:
        raise _Bad(
            f"a tensor of size {list(size)} reaches element {last} of storage {storage.key}, "
            f"which holds {elements.size}"
        )
    item = elements.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        elements[offset:], shape=size, strides=[s * item for s in stride], writeable=False
    )
    return _Tensor(storage.dtype, view)


def _rebuild_tensor_v2(
    storage: object,
    offset: object,
    size: object,
    stride: object,
    requires_grad: object = False,
    backward_hooks: object = None,
    metadata: object = None,
) -> _Tensor:
    """`torch._utils._rebuild_tensor_v2`; `requires_grad` and hooks mean nothing here."""
    if metadata:
        raise _Bad("a tensor with conjugate or negative bits set (not a weight)")
    return _rebuild_tensor(storage, offset, size, stride)


def _rebuild_parameter(data: object, requires_grad: object, backward_hooks: object) -> _Tensor:
    """`torch._utils._rebuild_parameter`: a Parameter is its tensor."""
    if not isinstance(data, _Tensor):
        raise _Bad("a Parameter around something that is not a tensor")
    return data


def _np_reconstruct(cls: object, shape: object, typecode: object) -> _SafeArray:
    """`numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')`: an empty array slot."""
    if not isinstance(cls, _NdarrayType):
        raise _Bad("numpy _reconstruct of something other than an ndarray")
    return _SafeArray()


def _codecs_encode(text: object, encoding: object = "utf-8", errors: object = "strict") -> bytes:
    """`_codecs.encode(str, 'latin1')`: how protocol-2 pickles write bytes. Only latin-1."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Bad(f"_codecs.encode to {encoding!r} (only latin-1 text, as pickle writes bytes)")
    return text.encode("latin-1")


_NDARRAY = _NdarrayType()
ALLOWED_GLOBALS: dict[tuple[str, str], object] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch.storage", "UntypedStorage"): _StorageType(
        "UntypedStorage", *STORAGE_DTYPES["UntypedStorage"]
    ),
    ("torch.storage", "TypedStorage"): _StorageType("TypedStorage", None, None),
    **{("torch", name): _StorageType(name, *pair) for name, pair in STORAGE_DTYPES.items()},
    ("numpy.core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _np_reconstruct,  # numpy >= 2 writes this
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _SafeDtype,
    ("_codecs", "encode"): _codecs_encode,
    ("mmengine.config.config", "ConfigDict"): _ConfigDict,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler whose globals are `ALLOWED_GLOBALS` (plus, in TorchScript archives,
    `__torch__.*` as inert attribute bags) and whose storages come from the archive."""

    def __init__(
        self, data: bytes, record: str, storage: Callable[[object], _Storage], script: bool
    ) -> None:
        super().__init__(io.BytesIO(data))
        self._record, self._storage, self._script = record, storage, script

    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED_GLOBALS.get((module, name))
        if found is not None:
            return found
        if self._script and (module == "__torch__" or module.startswith("__torch__.")):
            return _ScriptObject
        raise _Bad(
            f"refused: {self._record} asks for the global {_spelled(module, name)}, which is "
            "not on the allow-list (tensor rebuilds, storages, OrderedDict; numpy arrays/dtypes, "
            "_codecs.encode and ConfigDict for pose meta); nothing in the file was run"
        )

    def persistent_load(self, pid: object) -> _Storage:
        return self._storage(pid)


def _spelled(module: str, name: str) -> str:
    """A global as the pickle names it, and as Python 3 would resolve it when they differ
    (protocol 2 writes Python 2 names: `__builtin__.eval` is `builtins.eval`)."""
    import _compat_pickle

    if (module, name) in _compat_pickle.NAME_MAPPING:
        py3 = ".".join(_compat_pickle.NAME_MAPPING[(module, name)])
    else:
        py3 = f"{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{name}"
    return f"{module}.{name}" if py3 == f"{module}.{name}" else f"{module}.{name} ({py3})"


def _unpickle_torch_zip(archive: _Zip, *, script: bool) -> object:
    """`data.pkl` of a torch zip, its storages read from `data/<key>`."""
    folder = archive.folder()
    record = f"{folder}data.pkl"
    if record not in archive.infos:
        raise _Bad(f"{archive.what} has no {record}")
    order = archive.byteorder(folder)
    storages: dict[str, _Storage] = {}

    def storage(pid: object) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise _Bad(f"{record} holds a persistent id that is not a storage: {pid!r:.80}")
        _, kind, key, _location, numel = pid
        if isinstance(key, bytes):
            key = key.decode("ascii", "replace")
        if not isinstance(kind, _StorageType) or kind.dtype is None or kind.bits is None:
            raise _Bad(f"storage {key!r:.40} has no dtype (a storage type torch does not write)")
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise _Bad(f"{record} holds a malformed storage reference: {pid!r:.80}")
        if key in storages:
            if storages[key].dtype != kind.dtype:
                raise _Bad(f"storage {key} is used as both {storages[key].dtype} and {kind.dtype}")
            return storages[key]
        name = f"{folder}data/{key}"
        if name not in archive.infos:
            raise _Bad(f"{record} references storage {name}, which the archive lacks")
        bits = np.dtype(kind.bits).newbyteorder(order)
        nbytes = archive.infos[name].file_size
        if nbytes != numel * bits.itemsize:
            raise _Bad(
                f"storage {name} holds {nbytes} bytes, the pickle says {numel} x {kind.dtype}"
            )
        storages[key] = _Storage(name, kind.dtype, archive.raw(name).view(bits))
        return storages[key]

    unpickler = _RestrictedUnpickler(archive.read(record), record, storage, script)
    try:
        return unpickler.load()
    except _Bad:
        raise
    except Exception as exc:  # a malformed pickle: whatever the unpickler trips on
        raise _Bad(f"damaged {record}: {type(exc).__name__}: {exc}") from None
