"""The restricted unpickler of the checkpoint reader (`sapiens.pth_reader`) and its
stand-ins: every global a pickle names goes through `find_class`, which hands back OUR
stand-in for the few names a checkpoint needs (tensor rebuilds, storage types, OrderedDict
and, for the pose files' `meta`, numpy arrays and dtypes, `_codecs.encode` and mmengine's
ConfigDict) and refuses any other name before it is looked up, so nothing of the file's
choosing is imported or called. Tensors are numpy views of the archive's raw storages."""

from __future__ import annotations

import collections
import io
import pickle
import re
from collections.abc import Callable
from math import prod
from typing import Any

import numpy as np

from .pth_archive import ReaderRefusal, TorchZip

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
_NUMPY_DTYPE_NAME = re.compile(r"b1|[iu][1248]|f(2|4|8|16)|c(8|16|32)|[US]\d{1,9}")


class _Inert:
    """Base of every object the unpickler makes: BUILD (`__setstate__`) on it is refused
    unless the class says what state it takes."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        raise ReaderRefusal(f"the pickle sets the state of a {type(self).__name__.strip('_')}")


class _StorageType(_Inert):
    """What `torch.FloatStorage` & co. become: a marker that says the dtype, never called."""

    __slots__ = ("bits", "dtype", "name")

    def __init__(self, name: str, dtype: str | None, bits: str | None) -> None:
        self.name, self.dtype, self.bits = name, dtype, bits


class StorageRecord(_Inert):
    """One storage record: its safetensors dtype and its elements (a view of the file)."""

    __slots__ = ("dtype", "elements", "key")

    def __init__(self, key: str, dtype: str, elements: np.ndarray) -> None:
        self.key, self.dtype, self.elements = key, dtype, elements


class TensorView(_Inert):
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
            raise ReaderRefusal("a numpy array with a state numpy does not write")
        shape, dtype, fortran, raw = state[-4:]
        if not isinstance(dtype, _SafeDtype) or not _int_tuple(shape):
            raise ReaderRefusal("a numpy array with a malformed shape or dtype")
        if isinstance(raw, str):
            raw = raw.encode("latin-1")  # protocol-0/1 pickles keep bytes as latin-1 text
        if not isinstance(raw, bytes):
            raise ReaderRefusal(
                "a numpy array of Python objects (refused: unpickling them runs code)"
            )
        dt = dtype.numpy()
        if len(raw) != prod(shape) * dt.itemsize:
            raise ReaderRefusal(f"a numpy array of shape {shape} with {len(raw)} bytes")
        flat = np.frombuffer(raw, dtype=dt) if raw else np.zeros(0, dtype=dt)
        self.array = flat.reshape(shape, order="F" if fortran else "C")


class _SafeDtype(_Inert):
    """`numpy.dtype(name, align, copy)` for plain numeric and string dtypes only (no object,
    structured or datetime dtypes), its byte order set from the pickled state."""

    __slots__ = ("byteorder", "name")

    def __init__(self, name: object, align: object = False, copy: object = True) -> None:
        if not isinstance(name, str) or not _NUMPY_DTYPE_NAME.fullmatch(name):
            raise ReaderRefusal(
                f"numpy dtype {name!r} (only plain numeric and string dtypes are read)"
            )
        self.name, self.byteorder = name, "="

    def __setstate__(self, state: object) -> None:
        if not isinstance(state, tuple) or len(state) < 2 or state[1] not in ("<", ">", "|", "="):
            raise ReaderRefusal("a numpy dtype with a state numpy does not write")
        if len(state) > 4 and (state[3] is not None or state[4] is not None):
            raise ReaderRefusal("a structured numpy dtype")
        self.byteorder = state[1]

    def numpy(self) -> np.dtype:
        dt = np.dtype(self.name)
        return dt.newbyteorder(self.byteorder) if self.byteorder in "<>" else dt


class _ConfigDict(dict):
    """mmengine's ConfigDict (an addict.Dict: a dict whose pickled state is itself) as a
    plain dict."""

    def __setstate__(self, state: object) -> None:
        if state is not None and not isinstance(state, dict):
            raise ReaderRefusal("a ConfigDict whose state is not a dict")
        if state is not None and state is not self:
            self.update(state)


class ScriptObject(_Inert):
    """A TorchScript module (`__torch__.*`): its pickled attributes, nothing more. Its class,
    and the code in the archive's `code/`, are never loaded."""

    __slots__ = ("_attributes",)

    @property
    def attributes(self) -> dict:
        return getattr(self, "_attributes", {})

    def __setstate__(self, state: object) -> None:
        if hasattr(self, "_attributes") or not isinstance(state, dict):
            raise ReaderRefusal("a TorchScript object whose state is not an attribute dict")
        self._attributes = state


def _int_tuple(value: object) -> bool:
    return isinstance(value, tuple | list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


def rebuild_tensor(storage: object, offset: object, size: object, stride: object) -> TensorView:
    """`torch._utils.rebuild_tensor`: the tensor as a read-only strided view of its
    storage, after checking every element it can reach lies inside the storage."""
    if not isinstance(storage, StorageRecord):
        raise ReaderRefusal("a tensor rebuilt from something that is not a storage")
    if not (isinstance(offset, int) and offset >= 0 and _int_tuple(size) and _int_tuple(stride)):
        raise ReaderRefusal(
            f"a tensor with a malformed offset, size or stride ({offset}, {size}, {stride})"
        )
    size, stride = tuple(size), tuple(stride)  # type: ignore[arg-type]
    if len(size) != len(stride):
        raise ReaderRefusal(f"a tensor of size {size} with stride {stride}")
    elements = storage.elements
    if prod(size) == 0:
        return TensorView(storage.dtype, np.zeros(size, dtype=elements.dtype))
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= elements.size:
        raise ReaderRefusal(
            f"a tensor of size {list(size)} reaches element {last} of storage {storage.key}, "
            f"which holds {elements.size}"
        )
    item = elements.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        elements[offset:], shape=size, strides=[s * item for s in stride], writeable=False
    )
    return TensorView(storage.dtype, view)


def _rebuild_tensor_v2(
    storage: object,
    offset: object,
    size: object,
    stride: object,
    requires_grad: object = False,
    backward_hooks: object = None,
    metadata: object = None,
) -> TensorView:
    """`torch._utils._rebuild_tensor_v2`; `requires_grad` and hooks mean nothing here."""
    if metadata:
        raise ReaderRefusal("a tensor with conjugate or negative bits set (not a weight)")
    return rebuild_tensor(storage, offset, size, stride)


def _rebuild_parameter(data: object, requires_grad: object, backward_hooks: object) -> TensorView:
    """`torch._utils._rebuild_parameter`: a Parameter is its tensor."""
    if not isinstance(data, TensorView):
        raise ReaderRefusal("a Parameter around something that is not a tensor")
    return data


def _np_reconstruct(cls: object, shape: object, typecode: object) -> _SafeArray:
    """`numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')`: an empty array slot."""
    if not isinstance(cls, _NdarrayType):
        raise ReaderRefusal("numpy _reconstruct of something other than an ndarray")
    return _SafeArray()


def _codecs_encode(text: object, encoding: object = "utf-8", errors: object = "strict") -> bytes:
    """`_codecs.encode(str, 'latin1')`: how protocol-2 pickles write bytes. Only latin-1."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise ReaderRefusal(
            f"_codecs.encode to {encoding!r} (only latin-1 text, as pickle writes bytes)"
        )
    return text.encode("latin-1")


_NDARRAY = _NdarrayType()
ALLOWED_GLOBALS: dict[tuple[str, str], object] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "rebuild_tensor"): rebuild_tensor,
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
        self, data: bytes, record: str, storage: Callable[[object], StorageRecord], script: bool
    ) -> None:
        super().__init__(io.BytesIO(data))
        self._record, self._storage, self._script = record, storage, script

    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED_GLOBALS.get((module, name))
        if found is not None:
            return found
        if self._script and (module == "__torch__" or module.startswith("__torch__.")):
            return ScriptObject
        raise ReaderRefusal(
            f"refused: {self._record} asks for the global {_spelled(module, name)}, which is "
            "not on the allow-list (tensor rebuilds, storages, OrderedDict; numpy arrays/dtypes, "
            "_codecs.encode and ConfigDict for pose meta); nothing in the file was run"
        )

    def persistent_load(self, pid: object) -> StorageRecord:
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


def unpickle_torch_zip(archive: TorchZip, *, script: bool) -> object:
    """`data.pkl` of a torch zip, its storages read from `data/<key>`."""
    folder = archive.folder()
    record = f"{folder}data.pkl"
    if record not in archive.infos:
        raise ReaderRefusal(f"{archive.what} has no {record}")
    order = archive.byteorder(folder)
    storages: dict[str, StorageRecord] = {}

    def storage(pid: object) -> StorageRecord:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise ReaderRefusal(
                f"{record} holds a persistent id that is not a storage: {pid!r:.80}"
            )
        _, kind, key, _location, numel = pid
        if isinstance(key, bytes):
            key = key.decode("ascii", "replace")
        if not isinstance(kind, _StorageType) or kind.dtype is None or kind.bits is None:
            raise ReaderRefusal(
                f"storage {key!r:.40} has no dtype (a storage type torch does not write)"
            )
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise ReaderRefusal(f"{record} holds a malformed storage reference: {pid!r:.80}")
        if key in storages:
            if storages[key].dtype != kind.dtype:
                raise ReaderRefusal(
                    f"storage {key} is used as both {storages[key].dtype} and {kind.dtype}"
                )
            return storages[key]
        name = f"{folder}data/{key}"
        if name not in archive.infos:
            raise ReaderRefusal(f"{record} references storage {name}, which the archive lacks")
        bits = np.dtype(kind.bits).newbyteorder(order)
        nbytes = archive.infos[name].file_size
        if nbytes != numel * bits.itemsize:
            raise ReaderRefusal(
                f"storage {name} holds {nbytes} bytes, the pickle says {numel} x {kind.dtype}"
            )
        storages[key] = StorageRecord(name, kind.dtype, archive.raw(name).view(bits))
        return storages[key]

    unpickler = _RestrictedUnpickler(archive.read(record), record, storage, script)
    try:
        return unpickler.load()
    except ReaderRefusal:
        raise
    except Exception as exc:  # a malformed pickle: whatever the unpickler trips on
        raise ReaderRefusal(f"damaged {record}: {type(exc).__name__}: {exc}") from None
