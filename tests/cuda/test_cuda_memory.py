"""Real CUDA out-of-memory errors and real NaN from the device, and how the worker survives
them (the CPU tests raise them by hand, tests/test_device_faults.py):

- a model batch the device has no memory for (the process's allocator capped with
  ``torch.cuda.set_per_process_memory_fraction``) is halved, the size that fitted is kept for
  later batches, and the result equals an uncapped run;
- one input that never fits fails its frame by name (file, frame, pass, size) and the worker
  goes on: with the cap lifted, the same resident models finish the next chunk;
- a model that makes NaN on the GPU fails that frame by name with nothing of it written; the
  chunk's other frames are written.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import OpenEXR
import pytest
import torch
from torch import nn

import sapiens
from bench.io import chunk_job, write_plates
from sapiens.errors import DeviceMemoryError
from storage.zarr_store import committed_frames
from tasks.chunk_worker import process_chunk
from tests.cuda import CUDA
from tests.model_helpers import tiny

pytestmark = CUDA

MODEL_HW = (1024, 768)  # a tiny network working at the released input size: mostly activations
TILE = (64, 48)  # what it is given: small, so its outputs (at the tile's size) are small
FRAMES = 3
SIZE = (320, 180)  # w, h
CAPPED_SIZE = (96, 64)  # w, h: a frame whose own buffers are far below one model input's


class Counting(nn.Module):
    """A model that notes the batch size of every call it gets (before running it)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.info = inner.info
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor):
        self.batches.append(x.shape[0])
        return self.inner(x)


class NanOnBright(Counting):
    """A model whose output holds a NaN for inputs as bright as a white plate."""

    def forward(self, x: torch.Tensor):
        out = super().forward(x)
        white = (x > 2.2).all(dim=1).float().mean(dim=(1, 2))  # share of white pixels
        if bool((white > 0.35).any()):
            out = out.clone()
            out[:, :, out.shape[2] // 2, out.shape[3] // 2] = float("nan")
        return out


def _seg_model() -> Counting:
    model = sapiens.build_model("tiny", "seg", input_hw=MODEL_HW, seed=1)
    return Counting(model)


def _held_while(run) -> int:
    """Bytes the allocator took above what it held, at its peak, while ``run`` ran."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_reserved() - before


def _tiles(count: int) -> torch.Tensor:
    return torch.rand((count, 3, *TILE), generator=torch.Generator().manual_seed(0)).cuda()


def test_a_batch_that_does_not_fit_is_halved_and_the_size_that_fits_is_kept(
    memory_limit, ieee_fp32, caplog
):
    model = _seg_model()
    predictor = sapiens.Predictor({"seg": model}, device="cuda", dtype=torch.float32, batch_size=4)
    tiles = _tiles(4)
    one_by_one = [predictor.predict_batch(tiles[i : i + 1], "seg")["seg"] for i in range(4)]
    expected = torch.cat(one_by_one)
    two = _held_while(lambda: predictor.predict_batch(tiles[:2], "seg"))
    four = _held_while(lambda: predictor.predict_batch(tiles, "seg"))
    print(f"allocator peak above the model: batch 2 {two / 2**20:.0f} MiB, 4 {four / 2**20:.0f}")
    assert four > 1.3 * two  # activations dominate: the cap below separates the two sizes
    model.batches.clear()

    memory_limit((two + four) // 2)
    with caplog.at_level(logging.WARNING, logger="sapiens.predictor"):
        out = predictor.predict_batch(tiles, "seg")["seg"]
    # out of memory at 4 (in the network, or before it while preparing the batch), then halves
    assert model.batches in ([4, 2, 2], [2, 2])
    assert "out of device memory" in caplog.text and "2 at a time" in caplog.text
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    model.batches.clear()
    predictor.predict_batch(tiles, "seg")  # the size that fitted is remembered
    assert model.batches == [2, 2]


def test_an_input_that_never_fits_fails_its_frame_by_name_and_the_worker_goes_on(
    memory_limit, tmp_path
):
    model = _seg_model()
    predictor = sapiens.Predictor({"seg": model}, device="cuda", batch_size=2)
    one = _held_while(lambda: predictor.predict_batch(_tiles(1), "seg"))
    print(f"allocator peak above the model for one input: {one / 2**20:.0f} MiB")
    assert one > 64 << 20  # far above what the small frame's own buffers take
    width, height = CAPPED_SIZE
    pattern = write_plates(tmp_path / "plates", height, width, FRAMES, "realistic")

    memory_limit(one // 2)
    with pytest.raises(DeviceMemoryError, match=r"seg model ran out of cuda memory on one 48x64"):
        predictor.predict_batch(_tiles(1), "seg")
    job = chunk_job(pattern, tmp_path / "capped", FRAMES, CAPPED_SIZE, ["seg"], review_clips=False)
    summary = process_chunk(job, predictor=predictor)
    assert [f.status for f in summary.frames] == ["failed"] * FRAMES
    for frame in summary.frames:
        assert f"plate.{frame.frame}.exr" in frame.error and f"frame {frame.frame}" in frame.error
        assert "DeviceMemoryError: the seg model ran out of cuda memory on one" in frame.error
        assert not Path(job.paths.exr(frame.frame)).exists()

    # the cap lifted: the same resident models go on
    torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
    job = chunk_job(
        pattern, tmp_path / "uncapped", FRAMES, CAPPED_SIZE, ["seg"], review_clips=False
    )
    summary = process_chunk(job, predictor=predictor)
    assert [f.status for f in summary.frames] == ["done"] * FRAMES
    assert set(committed_frames(job.paths.zarr)) == set(job.frames)


def test_a_frame_the_gpu_makes_nan_fails_by_name_with_nothing_written(tmp_path):
    pattern = write_plates(tmp_path / "plates", SIZE[1], SIZE[0], FRAMES, "realistic")
    bright = 1002
    white = np.full((SIZE[1], SIZE[0], 3), 50.0, np.float16)
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    OpenEXR.File(header, {"RGB": white}).write(str(tmp_path / "plates" / f"plate.{bright}.exr"))
    models = {"normal": NanOnBright(tiny("normal", seed=1)), "seg": tiny("seg", seed=2)}
    predictor = sapiens.Predictor(models, device="cuda", batch_size=2)
    job = chunk_job(pattern, tmp_path / "out", FRAMES, SIZE, ["normal", "seg"], review_clips=False)
    summary = process_chunk(job, predictor=predictor)
    status = {f.frame: f.status for f in summary.frames}
    assert status == {1001: "done", 1002: "failed", 1003: "done"}
    failed = next(f for f in summary.frames if f.frame == bright)
    assert f"plate.{bright}.exr" in failed.error and str(bright) in failed.error
    assert "the model's normal output holds NaN or Inf values" in failed.error, failed.error
    assert failed.outputs == []
    assert not Path(job.paths.exr(bright)).exists()
    assert not Path(job.paths.frame_record(bright)).exists()
    assert Path(job.paths.exr(1003)).is_file()
    assert set(committed_frames(job.paths.zarr)) == {1001, 1003}
