"""Reading a safetensors file's header, and telling it apart from pickled torch files; putting
the metadata a writer left in hash order into key order (`sort_metadata`).

No torch here (only the standard library), so the flow process can read headers cheaply.

A safetensors file is an 8-byte little-endian header length N, N bytes of a JSON object
(which may end in spaces: writers pad it to a multiple of 8), then the tensor bytes. The
first byte of N is therefore anything, 0x80 included, and its first two bytes can read "PK":
such files must not be taken for a pickle or a zip by their first bytes. So the file is parsed
as safetensors first; only when that fails are other formats recognised, by their full
signatures, to give the conversion hint instead of a bare "not safetensors".

Not `safetensors.safe_open`: it hides each tensor's byte range and names no fault in its errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import BinaryIO

from .errors import CheckpointError, NotSafetensors

PICKLE_SUFFIXES = {".pth", ".pt", ".bin", ".ckpt", ".pkl", ".pickle"}
CONVERT_HINT = (
    "pickled weights can run arbitrary code when loaded, so they are refused. Convert the "
    "file to safetensors once: `svfx models convert FILE.pth FILE.safetensors` reads a "
    "released Sapiens .pth without running any of its code; for other files, "
    "safetensors.torch.save_file on the state dict in a trusted environment"
)
MAX_HEADER_BYTES = 100 << 20  # the limit the safetensors library itself enforces
# Bytes per element of each safetensors dtype (sub-byte F4/F6 types are not handled).
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
# torch.save's legacy (non-zip) format: a protocol-2 pickle of this magic number comes first.
_LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_SNIFF_BYTES = len(_LEGACY_TORCH_MAGIC)

Shapes = dict[str, tuple[int, ...]]


def count_blocks(shapes: Mapping[str, tuple[int, ...]], pattern: str) -> int:
    """How many numbered blocks ``pattern`` (one group: the index) finds among the tensor
    names; ValueError naming the missing ones when the numbering has holes."""
    rx = re.compile(pattern)
    idx = {int(m.group(1)) for k in shapes if (m := rx.match(k))}
    if idx and idx != set(range(len(idx))):
        missing = sorted(set(range(max(idx) + 1)) - idx)
        raise ValueError(f"blocks {missing} are missing")
    return len(idx)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header describes it; `begin`/`end` are absolute offsets in the file."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: str | os.PathLike[str]) -> tuple[Shapes, dict[str, str], dict[str, str]]:
    """Tensor shapes, dtypes and the metadata of a safetensors file, with checks that turn a
    truncated or corrupt file into a plain error instead of a crash in the reader."""
    entries, metadata = read_tensor_index(path)
    shapes = {key: entry.shape for key, entry in entries.items()}
    dtypes = {key: entry.dtype for key, entry in entries.items()}
    return shapes, dtypes, metadata


def read_tensor_index(
    path: str | os.PathLike[str],
) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Every tensor's dtype, shape and byte range, and the file's metadata; CheckpointError
    naming the file for anything that is not a complete safetensors file."""
    path = os.fspath(path)
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(path, "no such file")
    if p.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(path, CONVERT_HINT)
    size = p.stat().st_size
    with open(p, "rb") as fh:
        try:
            header, data_start = _parse_header(fh, size)
        except NotSafetensors as exc:
            fh.seek(0)
            raise CheckpointError(path, _refusal(fh.read(_SNIFF_BYTES), exc.reason)) from None
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(path, "corrupt safetensors header (__metadata__ is not an object)")
    entries = {key: _entry(path, key, value, data_start) for key, value in header.items()}
    expected = _data_end(path, entries, data_start)
    if size < expected:
        raise CheckpointError(
            path, f"truncated: the header describes {expected} bytes but the file has {size}"
        )
    if size > expected:  # the safetensors reader refuses these too
        raise CheckpointError(
            path, f"{size - expected} bytes after the last tensor the header describes"
        )
    return entries, {str(k): str(v) for k, v in metadata.items()}


def sort_metadata(path: str | os.PathLike[str]) -> bool:
    """Rewrite the header of a file just written, in place, with its ``__metadata__`` entries
    in key order; True when done (False: no metadata, or it would not fit, never for ASCII).

    safetensors writes that map in hash order, different in each process, so two saves of the
    same tensors and metadata differ in bytes and sha256; sorted, they are equal. Only the
    order changes, so the header keeps its length (padded with spaces as writers pad it) and
    the tensor bytes are not touched."""
    with open(path, "r+b") as fh:
        header, data_start = _parse_header(fh, os.fstat(fh.fileno()).st_size)
        metadata = header.get("__metadata__")
        if not isinstance(metadata, dict) or not metadata:
            return False
        header["__metadata__"] = dict(sorted(metadata.items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > data_start - 8:
            return False
        fh.seek(8)
        fh.write(text.ljust(data_start - 8, b" "))
    return True


def _data_end(path: str, entries: dict[str, TensorEntry], data_start: int) -> int:
    """Where the tensor data ends; the tensors must tile it without gaps or overlaps, as the
    safetensors reader requires."""
    end = data_start
    for key, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != end:
            what = "overlaps the tensor before it" if entry.begin < end else "leaves a gap"
            raise CheckpointError(path, f"corrupt header: tensor {key!r} {what}")
        end = entry.end
    return end


def _parse_header(fh: BinaryIO, size: int) -> tuple[dict, int]:
    """The header's JSON object and where the tensor data starts."""
    head = fh.read(8)
    if len(head) < 8:
        raise NotSafetensors(f"not a safetensors file ({size} bytes, too short)")
    (header_len,) = struct.unpack("<Q", head)
    if header_len < 2 or header_len > min(size - 8, MAX_HEADER_BYTES):
        raise NotSafetensors(
            f"not a safetensors file (its first 8 bytes give a header of {header_len} bytes, "
            f"which a {size}-byte file cannot hold); truncated, corrupt or another format"
        )
    raw = fh.read(header_len)
    if raw[:1] != b"{":
        raise NotSafetensors("not a safetensors file (the header does not start with '{')")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotSafetensors(f"corrupt safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise NotSafetensors("corrupt safetensors header (not a JSON object)")
    return header, 8 + header_len


def _refusal(first_bytes: bytes, reason: str) -> str:
    """The message for a file that is not safetensors: the conversion hint when its signature
    says it is a torch pickle or zip, else what was wrong with it as safetensors."""
    foreign = foreign_format(first_bytes)
    if foreign is None:
        return reason
    return f"this is a pickle/zip torch file ({foreign}), not safetensors; {CONVERT_HINT}"


def foreign_format(first_bytes: bytes) -> str | None:
    """What a file that failed to parse as safetensors is, by its full signature, or None."""
    if first_bytes.startswith(_LEGACY_TORCH_MAGIC):
        return "torch.save's legacy pickle format"
    if first_bytes[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "a zip archive, as torch.save writes"
    if first_bytes[:1] == b"\x80" and first_bytes[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return f"a pickle, protocol {first_bytes[1]}"
    return None


def _entry(path: str, key: str, value: object, data_start: int) -> TensorEntry:
    try:
        dtype = str(value["dtype"])  # type: ignore[index]
        shape = tuple(int(d) for d in value["shape"])  # type: ignore[index]
        begin, end = (int(o) for o in value["data_offsets"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(path, f"corrupt header entry for tensor {key!r}") from None
    itemsize = DTYPE_BYTES.get(dtype)
    negative = begin < 0 or any(d < 0 for d in shape)
    if negative or begin > end or (itemsize and end - begin != prod(shape) * itemsize):
        raise CheckpointError(
            path,
            f"corrupt header entry for tensor {key!r}: {dtype} {list(shape)} does not fit "
            f"its byte range {begin}..{end}",
        )
    return TensorEntry(dtype, shape, data_start + begin, data_start + end)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The file's hex sha256, read in blocks (memory stays flat however big the file)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
