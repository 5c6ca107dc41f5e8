"""Whether every floating tensor of a safetensors file is finite, checked on the raw bits.

Why the bits: a float is NaN or Inf exactly when its exponent field is all ones, in every
format a checkpoint uses (IEEE binary64/32/16, bfloat16, float8 e5m2; float8 e4m3fn has no
Inf and its only NaN is all ones in exponent and mantissa). Clearing the sign bit and
comparing the largest magnitude pattern with that threshold answers "any NaN or Inf?" with two
vectorised integer passes per block. That needs no torch (the flow process can check weights
without loading a model) and no dtype conversion (numpy has no bfloat16; converting bf16 to f32
first would double the bytes touched). The file is read tensor by tensor in fixed blocks into
one reusable buffer, so memory stays at one block whatever the checkpoint's size, and the
reads are sequential (tensors are visited in file order), which the kernel reads ahead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import BinaryIO

import numpy as np

from .errors import CheckpointError
from .safetensors_format import TensorEntry

# dtype -> (the same-width unsigned type, mask clearing the sign bit, smallest non-finite pattern)
NONFINITE_BITS: dict[str, tuple[type[np.unsignedinteger], int, int]] = {
    "F64": (np.uint64, 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000),
    "F32": (np.uint32, 0x7FFF_FFFF, 0x7F80_0000),
    "F16": (np.uint16, 0x7FFF, 0x7C00),
    "BF16": (np.uint16, 0x7FFF, 0x7F80),
    "F8_E5M2": (np.uint8, 0x7F, 0x7C),
    "F8_E4M3": (np.uint8, 0x7F, 0x7F),
}
NON_FLOAT_DTYPES = {"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64"}
BLOCK_BYTES = 4 << 20  # large enough for few reads, small enough to stay in the CPU caches


def nonfinite_tensors(
    path: str | os.PathLike[str],
    entries: Mapping[str, TensorEntry],
    *,
    block_bytes: int = BLOCK_BYTES,
) -> list[str]:
    """Names of the floating tensors holding a NaN or Inf, in file order (empty: all finite).

    `entries` comes from `read_tensor_index`. A tensor of a dtype this check does not know is
    a CheckpointError rather than silently passed.
    """
    path = os.fspath(path)
    unknown = sorted({e.dtype for e in entries.values()} - set(NONFINITE_BITS) - NON_FLOAT_DTYPES)
    if unknown:
        raise CheckpointError(path, f"cannot check tensors of dtype {', '.join(unknown)}")
    block_bytes -= block_bytes % 8  # every itemsize divides it
    buffer = np.empty(block_bytes, dtype=np.uint8)
    scratch = np.empty(block_bytes, dtype=np.uint8)
    bad: list[str] = []
    floating = [(k, e) for k, e in entries.items() if e.dtype in NONFINITE_BITS]
    key = ""
    try:
        with open(path, "rb", buffering=0) as fh:
            for key, entry in sorted(floating, key=lambda item: item[1].begin):
                if not _finite(fh, entry, buffer, scratch):
                    bad.append(key)
    except OSError as exc:
        where = f"tensor {key!r}" if key else "the file"
        raise CheckpointError(path, f"could not read {where}: {exc}") from None
    return bad


def _finite(fh: BinaryIO, entry: TensorEntry, buffer: np.ndarray, scratch: np.ndarray) -> bool:
    """Read one tensor block by block; stop at the first block with a NaN or Inf."""
    uint, magnitude_mask, threshold = NONFINITE_BITS[entry.dtype]
    fh.seek(entry.begin)
    left = entry.end - entry.begin
    while left > 0:
        n = min(left, buffer.size)
        read_exactly(fh, memoryview(buffer)[:n])
        bits = buffer[:n].view(uint)
        magnitude = scratch[:n].view(uint)
        np.bitwise_and(bits, magnitude_mask, out=magnitude)
        if magnitude.max() >= threshold:
            return False
        left -= n
    return True


def read_exactly(fh: BinaryIO, view: memoryview) -> None:
    """Fill ``view`` from ``fh``; OSError naming the byte where the file ended early."""
    done = 0
    while done < len(view):
        got = fh.readinto(view[done:])
        if not got:  # the file shrank since its header was read
            raise OSError(f"the file ends at byte {fh.tell()}, before the tensor does")
        done += got
