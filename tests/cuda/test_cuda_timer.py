"""``DeviceTimer`` on CUDA: what it measures equals the wall time of a run the host waited for
from start to end, and measuring never makes the host wait for the device."""

from __future__ import annotations

import time

import torch

from sapiens.device_timer import DeviceTimer
from tests.cuda import CUDA

pytestmark = CUDA


def test_the_device_timer_agrees_with_wall_time_on_a_synchronised_run():
    device = torch.device("cuda")
    timer = DeviceTimer(device)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        with timer.measure():
            for _ in range(10):
                torch.matmul(a, b, out=c)
    queued = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    measured = timer.seconds()
    print(f"wall {wall * 1e3:.1f} ms, measured {measured * 1e3:.1f}, queued in {queued * 1e3:.1f}")
    assert abs(measured - wall) <= 0.05 * wall + 0.002
    assert queued < 0.5 * measured  # the host queued the work and went on
