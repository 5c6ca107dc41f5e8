"""Reading a safetensors file's tensors one at a time into memory of their own, cast on the way.

Why not `safetensors.safe_open(...).get_tensor`: it hands out views of one memory map of the
whole file. A tensor kept as it is (fp32 loaded as fp32, or the bf16 RoPE periods of any load)
then keeps the whole map alive, and every page of it that was read counts in the worker's
resident size beside the cast copies (docs/design/cpu-inference.md); an fp32 load holds the
map as the weights themselves (pages Dask counts as unmanaged memory, and a file rewritten
under a running worker would crash it with SIGBUS).

Here each tensor is read with plain reads (`readinto`) straight into its own memory, or, when
it is cast, into one scratch buffer it is cast from: memory ends at the weights' bytes in the
target dtype (and, while loading, the scratch buffer: the largest cast tensor of the file).
The byte ranges come from `read_tensor_index`, which has already checked them (no gaps,
overlaps or short file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import BinaryIO

import torch

from .finite import read_exactly
from .safetensors_format import TensorEntry

# safetensors dtype names -> torch dtypes (little-endian, as the format stores them)
TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3": torch.float8_e4m3fn,
    "I16": torch.int16,
    "U16": torch.uint16,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "U64": torch.uint64,
}


def read_tensors(
    path: str,
    entries: Mapping[str, TensorEntry],
    dtype_for: Callable[[str, torch.dtype], torch.dtype],
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor, in file order (sequential reads), each in CPU memory of
    its own, of the dtype `dtype_for(name, file dtype)` says. A tensor kept in its file's dtype
    is read straight into its own memory; one that is cast is read into a scratch buffer
    allocated once (as large as the largest of them) and cast from there, so the freed
    originals leave no holes between the weights for the allocator to keep. OSError if the
    file cannot be read; ValueError for a dtype torch has no type for."""
    ordered = sorted(entries.items(), key=lambda item: item[1].begin)
    plan = [(key, entry, *_dtypes(key, entry, dtype_for)) for key, entry in ordered]
    cast_bytes = [e.end - e.begin for _k, e, src, dst in plan if src != dst]
    scratch = torch.empty(max(cast_bytes, default=0), dtype=torch.uint8)
    with open(path, "rb", buffering=0) as fh:
        for key, entry, src, dst in plan:
            fh.seek(entry.begin)
            if src == dst:
                tensor = torch.empty(entry.shape, dtype=src)
                _read_exactly(fh, tensor.view(-1).view(torch.uint8))
            else:
                raw = scratch[: entry.end - entry.begin]
                _read_exactly(fh, raw)
                tensor = torch.empty(entry.shape, dtype=dst)
                tensor.copy_(raw.view(src).view(entry.shape))
            yield key, tensor


def _dtypes(
    key: str, entry: TensorEntry, dtype_for: Callable[[str, torch.dtype], torch.dtype]
) -> tuple[torch.dtype, torch.dtype]:
    src = TORCH_DTYPES.get(entry.dtype)
    if src is None:
        raise ValueError(f"tensor {key!r} has dtype {entry.dtype}, which torch lacks")
    return src, dtype_for(key, src)


def _read_exactly(fh: BinaryIO, raw: torch.Tensor) -> None:
    if raw.numel():
        read_exactly(fh, memoryview(raw.numpy()))
