"""`svfx models convert`: a released Sapiens v1 checkpoint (`.pth`, `_torchscript.pt2`,
`_bfloat16.pt2`) becomes a `.safetensors` file the loader takes.

Why a separate step: the loader refuses every pickle, so pickled weights are converted once,
explicitly, by `sapiens.pth_reader` (an allow-list unpickler that runs nothing of the file's).
What the file holds (family, size, task) is read off its tensors by `sapiens.v1_arch`, never
off its name, and written into the metadata with the source's name and sha256, so a converted
file says where it came from. Tensors keep their upstream names and their dtype, bit for bit
(BF16 stays BF16). Every check runs before the first byte is written, and the file appears
atomically (`storage.atomic`), so a refusal or a failure leaves no DST behind.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from sapiens.arch import POSE, SEG
from sapiens.errors import CheckpointError
from sapiens.info import ModelInfo
from sapiens.pth_reader import TorchCheckpoint, pth_hint, read_pth
from sapiens.safetensors_format import sha256_file
from sapiens.v1_arch import identify_v1, keypoint_set
from storage.atomic import atomic_open

SUFFIX = ".safetensors"


@dataclass(frozen=True)
class ConvertResult:
    """What was written, for the CLI's report."""

    src: str
    dst: str
    sha256: str  # of DST
    size_bytes: int
    source_sha256: str
    tensors: int
    metadata: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def convert_checkpoint(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *, force: bool = False
) -> ConvertResult:
    """Convert `src` to safetensors at `dst` (which must end in `.safetensors`, and must not
    exist unless `force`). CheckpointError naming the file for every refusal, before DST is
    touched; StorageError when writing DST fails (nothing is left behind then either)."""
    src, dst = os.fspath(src), os.fspath(dst)
    _check_destination(src, dst, force)
    checkpoint = read_pth(src)
    try:
        info = identify_v1(checkpoint.shapes, path=src)
    except CheckpointError as exc:
        hint = pth_hint(src)  # a .pt2 whose module is not laid out as the released .pth
        if hint is None:
            raise
        raise CheckpointError(src, f"{exc.reason}; {hint}") from None
    try:
        source_sha256 = sha256_file(src)
    except OSError as exc:
        raise CheckpointError(src, f"cannot read: {exc}") from None
    metadata = describe(checkpoint, info, source_sha256)
    writer = atomic_open(dst)
    with writer as handle:
        write_safetensors(handle, checkpoint.arrays, checkpoint.dtypes, metadata)
    assert writer.result is not None
    notes = [f"left out {line}" for line in checkpoint.dropped]
    if "BF16" in checkpoint.dtypes.values():
        notes.append("the weights are bf16 as stored in the source (not widened to fp32)")
    return ConvertResult(
        src=str(Path(src).resolve()),
        dst=str(Path(dst).resolve()),
        sha256=writer.result.sha256,
        size_bytes=writer.result.size,
        source_sha256=source_sha256,
        tensors=len(checkpoint.arrays),
        metadata=metadata,
        notes=notes,
    )


def _check_destination(src: str, dst: str, force: bool) -> None:
    if not dst.endswith(SUFFIX):
        raise CheckpointError(
            dst, f"the converted file must end in {SUFFIX} (the checkpoint root lists only those)"
        )
    target = Path(dst)
    if target.is_dir():
        raise CheckpointError(dst, "is a directory")
    if Path(src).is_file() and target.exists() and target.resolve() == Path(src).resolve():
        raise CheckpointError(dst, "is the source file itself")
    if target.exists() and not force:
        raise CheckpointError(dst, "already exists; pass --force to replace it")


def describe(checkpoint: TorchCheckpoint, info: ModelInfo, source_sha256: str) -> dict[str, str]:
    """The safetensors metadata (all strings): what the tensors are and where they came from."""
    task = info.task or "pretrain"
    meta = {
        "format": "pt",
        "family": info.family,
        "arch": info.arch,
        "size": info.arch.removeprefix("sapiens_"),
        "task": task,
        "input_hw": f"{info.input_hw[0]},{info.input_hw[1]}",
        "source_file": Path(checkpoint.path).name,
        "source_sha256": source_sha256,
        "source_format": checkpoint.source,
    }
    if info.head is not None and task == POSE:
        meta["keypoints"] = str(info.head.out_channels)
        meta["keypoint_set"] = keypoint_set(info) or "unknown"
    elif info.head is not None and task == SEG:
        meta["classes"] = str(info.head.out_channels)
    return meta


def write_safetensors(
    handle: BinaryIO,
    arrays: Mapping[str, np.ndarray],
    dtypes: Mapping[str, str],
    metadata: Mapping[str, str],
) -> None:
    """The safetensors layout, streamed one tensor at a time (the source stays memory-mapped,
    so memory holds at most one tensor): 8-byte little-endian header length, the JSON header
    padded with spaces to a multiple of 8, then each tensor's little-endian bytes. Widest
    dtypes first, so every tensor starts aligned to its element size.
    Not safetensors' save_file: it builds the whole file in memory, and numpy has no bf16."""
    order = sorted(arrays, key=lambda key: (-arrays[key].dtype.itemsize, key))
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for key in order:
        nbytes = arrays[key].size * arrays[key].dtype.itemsize
        header[key] = {
            "dtype": dtypes[key],
            "shape": list(arrays[key].shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    handle.write(struct.pack("<Q", len(raw)))
    handle.write(raw)
    for key in order:
        array = arrays[key]
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        if little.size:
            handle.write(little.reshape(-1).view(np.uint8).data)
