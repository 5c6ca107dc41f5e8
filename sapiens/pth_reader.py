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

Parts: `pth_archive` (the zip records), `pth_unpickler` (the allow-listed unpickler and its
stand-ins); this module tells the formats apart and gathers the tensors.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CheckpointError
from .pth_archive import ReaderRefusal, TorchZip
from .pth_unpickler import (
    ScriptObject,
    StorageRecord,
    TensorView,
    rebuild_tensor,
    unpickle_torch_zip,
)
from .safetensors_format import foreign_format

# torch.export's schema.ScalarType -> (safetensors dtype, numpy type of its raw bits), as
# `pth_unpickler.STORAGE_DTYPES` says for storage classes (torch/_export/serde/schema.py)
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


def _read(path: str, verify_crc: bool) -> TorchCheckpoint:
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(path, "no such file")
    size = p.stat().st_size
    try:
        with open(p, "rb") as fh:
            head = fh.read(512)
            if not head.startswith(b"PK\x03\x04"):
                raise ReaderRefusal(_not_a_zip(head, size))
            mm = np.memmap(p, dtype=np.uint8, mode="r")
            return _dispatch(path, TorchZip(fh, mm, 0, size, "the file", verify_crc))
    except ReaderRefusal as exc:
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


def _dispatch(path: str, top: TorchZip) -> TorchCheckpoint:
    names = top.infos
    if "serialized_state_dict.pt" in names:  # torch.export.save, torch <= 2.5
        inner = unpickle_torch_zip(top.nested("serialized_state_dict.pt"), script=False)
        return _result(path, "torch.export", "exported program", _plain_state(inner, "state dict"))
    if "serialized_exported_program.json" in names:
        raise ReaderRefusal("a torch.export archive without serialized_state_dict.pt")
    folder = top.folder()
    if f"{folder}archive_format" in names or any(
        n.startswith(f"{folder}data/weights/") for n in names
    ):
        return _result(path, "torch.export", "exported program", _export_weights(top, folder))
    if f"{folder}data.pkl" not in names:
        raise ReaderRefusal("a zip archive, but not a torch checkpoint (no data.pkl)")
    if f"{folder}constants.pkl" in names:  # TorchScript: never read code/ or constants.pkl
        root = unpickle_torch_zip(top, script=True)
        if not isinstance(root, ScriptObject):
            raise ReaderRefusal("a TorchScript archive whose data.pkl is not a module")
        found: dict[str, TensorView] = {}
        _module_tensors(root, "", found, set())
        return _result(path, "TorchScript", "module tree", found)
    obj = unpickle_torch_zip(top, script=False)
    layout = "flat dict"
    if isinstance(obj, dict) and "state_dict" in obj:
        obj, layout = obj["state_dict"], "state_dict"  # finetune files: meta is dropped
    return _result(path, "torch.save", layout, _plain_state(obj, layout))


def _result(path: str, source: str, layout: str, found: dict[str, TensorView]) -> TorchCheckpoint:
    """The checkpoint, less (for the deployment formats) the buffers a `.pth` never has."""
    dropped: list[str] = []
    if source != "torch.save":
        dropped = sorted(k for k in found if k.startswith(DEPLOY_ONLY_PREFIXES))
    kept = {k: t for k, t in found.items() if k not in dropped}
    if not kept:
        raise ReaderRefusal(f"a {source} archive with no tensors")
    return TorchCheckpoint(
        path,
        source,
        layout,
        {k: t.array for k, t in kept.items()},
        {k: t.dtype for k, t in kept.items()},
        tuple(f"{k} (a non-persistent buffer {source} keeps; a .pth has none)" for k in dropped),
    )


def _plain_state(obj: object, what: str) -> dict[str, TensorView]:
    """A name -> tensor dict, refused when it holds anything else."""
    if not isinstance(obj, dict):
        raise ReaderRefusal(f"the {what} is a {type(obj).__name__}, not a dict of tensors")
    others = [
        str(k) for k, v in obj.items() if not (isinstance(k, str) and isinstance(v, TensorView))
    ]
    if others:
        raise ReaderRefusal(f"the {what} holds entries that are not named tensors: {others[:8]}")
    if not obj:
        raise ReaderRefusal(f"the {what} holds no tensors")
    return obj


def _module_tensors(
    obj: ScriptObject, prefix: str, out: dict[str, TensorView], seen: set[int]
) -> None:
    """Parameters and buffers of a TorchScript module tree, by dotted attribute path."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    for name, value in obj.attributes.items():
        if not isinstance(name, str):
            continue
        if isinstance(value, TensorView):
            out[prefix + name] = value
        elif isinstance(value, ScriptObject):
            _module_tensors(value, f"{prefix}{name}.", out, seen)


def _export_weights(top: TorchZip, folder: str) -> dict[str, TensorView]:
    """Weights of a torch >= 2.6 PT2 archive: raw records and a JSON config of their
    dtypes, sizes and strides (or, older, one nested torch.save state dict)."""
    weights = f"{folder}data/weights/"
    configs = sorted(
        n for n in top.infos if re.fullmatch(rf"{re.escape(weights)}[^/]+_weights_config\.json", n)
    )
    legacy = sorted(n for n in top.infos if re.fullmatch(rf"{re.escape(weights)}[^/]+\.pt", n))
    if len(configs) + len(legacy) != 1:
        raise ReaderRefusal(
            f"a torch.export archive with {len(configs) + len(legacy)} weight sets under "
            f"{weights} (one model expected)"
        )
    if legacy:
        return _plain_state(unpickle_torch_zip(top.nested(legacy[0]), script=False), "state dict")
    try:
        config = json.loads(top.read(configs[0]))["config"]
    except (ValueError, KeyError, TypeError):
        config = None
    if not isinstance(config, dict):
        raise ReaderRefusal(f"{configs[0]} is not a weights config")
    order = top.byteorder(folder)
    return {
        str(fqn): _export_tensor(top, weights, fqn, entry, order) for fqn, entry in config.items()
    }


def _export_tensor(top: TorchZip, weights: str, fqn: str, entry: Any, order: str) -> TensorView:
    try:
        record = weights + str(entry["path_name"])
        if record not in top.infos or "/" in str(entry["path_name"]):
            raise ReaderRefusal(f"weight {fqn} names record {record}, which the archive lacks")
        if entry["use_pickle"]:
            tensor = unpickle_torch_zip(top.nested(record), script=False)
            if not isinstance(tensor, TensorView):
                raise ReaderRefusal(
                    f"weight {fqn} is pickled as a {type(tensor).__name__}, not a tensor"
                )
            return tensor
        meta = entry["tensor_meta"]
        dtype, bits = EXPORT_DTYPES[int(meta["dtype"])]
        size = [int(d["as_int"]) for d in meta["sizes"]]
        stride = [int(d["as_int"]) for d in meta["strides"]]
        offset = int(meta["storage_offset"]["as_int"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReaderRefusal(
            f"weight {fqn}: unreadable entry in the weights config ({exc!r})"
        ) from None
    raw = top.raw(record)
    itemsize = np.dtype(bits).itemsize
    if raw.size % itemsize:
        raise ReaderRefusal(
            f"record {record} holds {raw.size} bytes, not a whole number of {dtype}"
        )
    storage = StorageRecord(record, dtype, raw.view(np.dtype(bits).newbyteorder(order)))
    return rebuild_tensor(storage, offset, tuple(size), tuple(stride))
