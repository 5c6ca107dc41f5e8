"""glibc's (and torch's) allocator settings for the worker processes this platform starts (and the
benchmarks that stand in for them): one arena, and freed blocks of any size kept for reuse.
No Dask here, so a benchmark on a GPU node without Dask (bench.gpu) runs with them too."""

from __future__ import annotations

import os

# glibc's allocator, for the worker processes this platform starts: one arena, and freed
# blocks of any size kept for reuse instead of being returned to the kernel. Frames allocate
# the same large arrays over and over (a 4K frame's 29 class planes are 1 GB; each model batch
# of seg tiles 365 MB on the CPU); by default each is mmapped afresh and page-faulted in, and
# freed blocks of worker threads' arenas are unmapped. Measured on the project's 2-core VM
# (`python -m bench.io --sizes 4096x2160 --frames 3`, realistic content, per-pixel work on the
# CPU): 10.1 core-s/frame and 0.13 frames/s by default, 6.2 and 0.24 with these. Memory then
# stays at its high-water mark: a 200-frame 1080p shot through the embedded cluster
# (`python -m bench.shot`) ran at 0.22 frames/s against 0.11 with Dask's settings, its
# workers at 2.4 GB against 1.2, still rising about 0.45 MB a frame at the end (Dask's:
# flat after mid-shot, about 1,000 s in). Both fit Dask's profiler (its history of 1,000
# one-second call trees: Python objects, whatever the allocator; tracemalloc found it the
# whole of the growth on 320x180 shots), now off on our workers (`flows.cluster`): a
# 1,000-frame 320x180 shot's workers then end within 5% of their first tenth, the C heap
# flat (not re-measured at 1080p). Variables the user has set are left as they are.
#
# glibc reads them once, when a process starts: a Dask nanny must put them in the worker
# process's environment before spawning it (`nanny_spawn_env`); Dask's `env=` sets them only
# once the process runs, and its own default MALLOC_TRIM_THRESHOLD_ (64 KiB) would win.
# Memory kept for reuse would keep a worker that Dask paused above its memory limit's pause
# fraction paused for good; `flows.worker_memory` returns it then.
#
# torch's own CPU tensors do not come back from glibc's kept blocks: every tensor of 100 MB,
# 400 MB or 1 GB allocated again after one of its size was freed page-faults all of its 4 KiB
# pages in, with these settings as without (torch 2.13, counted with getrusage's minor
# faults). torch's THP_MEM_ALLOC_ENABLE=1 has it ask for transparent huge pages on tensors of
# 2 MB and more (madvise; the kernel's default "madvise" mode grants them): the same tensors
# are then reused with no fault at all. Measured on the project's 2-core VM: a 1 GB clone
# 0.35-0.39 s -> 0.095 s; temporal stabilisation, when it still made a frame's 1 GB of seg
# probabilities afresh each frame, 2.67 -> 2.30 core-s per 4096x2160 frame (`python -m
# bench.temporal --size 4096x2160 --frames 12 --cost-only`, with and without it). The first
# such allocation in a process can stall while the kernel gathers huge pages (2.3 s for 1 GB,
# once).
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
