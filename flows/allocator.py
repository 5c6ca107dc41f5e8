"""glibc's (and torch's) allocator settings for the worker processes this platform starts (and the
benchmarks that stand in for them): one arena, and freed blocks of any size kept for reuse.
No Dask here, so a benchmark on a GPU node without Dask (bench.gpu) runs with them too."""

from __future__ import annotations

import os

# One glibc arena, and freed blocks of any size kept for reuse instead of returned to the
# kernel: frames allocate the same large arrays over and over, which glibc's defaults would
# mmap and page-fault in afresh each time. torch's THP_MEM_ALLOC_ENABLE asks for transparent
# huge pages on large tensors, so torch's own tensors are reused without faults too. glibc
# reads these once, at process start: a nanny puts them in the worker's environment before
# spawning it (`flows.cluster.nanny_spawn_env`); `flows.worker_memory` returns kept memory
# when Dask pauses a worker. The measurements behind them: docs/design/allocator.md.
ALLOCATOR_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": str(16 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
    "MALLOC_TOP_PAD_": str(256 << 20),
    "THP_MEM_ALLOC_ENABLE": "1",
}


def allocator_env() -> dict[str, str]:
    """ALLOCATOR_ENV less what the user's environment sets."""
    return {key: value for key, value in ALLOCATOR_ENV.items() if key not in os.environ}


def allocator_settings() -> dict[str, str]:
    """The allocator settings worker processes start with: the user's where set, else ours."""
    return {key: os.environ.get(key, value) for key, value in ALLOCATOR_ENV.items()}
