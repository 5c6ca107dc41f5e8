"""Fixtures of the CUDA checks: fp32 on the GPU as on the CPU (no TF32), and a memory limit
that is always lifted again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def ieee_fp32() -> Iterator[None]:
    """Plain fp32 matrix products and convolutions on the GPU (cuDNN uses TF32 by default),
    so a network's outputs there can be held to the CPU tests' tolerances."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def memory_limit() -> Iterator:
    """``limit(bytes)`` caps what this process's caching allocator may hold on the GPU at
    ``bytes`` above what it holds now (``torch.cuda.set_per_process_memory_fraction``); lifted
    after the test."""
    device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory

    def limit(extra_bytes: int) -> None:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        held = torch.cuda.memory_reserved(device)
        torch.cuda.set_per_process_memory_fraction(min(1.0, (held + extra_bytes) / total), device)

    yield limit
    torch.cuda.set_per_process_memory_fraction(1.0, device)
    torch.cuda.empty_cache()
