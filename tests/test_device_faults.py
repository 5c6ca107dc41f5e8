"""What the model's device can do to a frame, and how the worker survives it: a model batch
that runs out of device memory is retried in halves, one input that never fits fails its frame
by name, and a model that makes NaN or Inf fails its frame by name with nothing written; the
other frames of the chunk go on, and the worker lives (models stay resident)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import OpenEXR
import pytest
import torch
from torch import nn

import sapiens
from sapiens.errors import DeviceMemoryError
from schemas.spec import parse_spec
from storage.zarr_store import committed_frames
from tasks.chunk_worker import ChunkJob, process_chunk
from tests.model_helpers import tiny
from tests.shot_helpers import SMALL, make_plate, small_chunk_job, spec_data

FRAMES = (1001, 1002, 1003)
BRIGHT = 1002  # this frame's plate is white: the poisoned models react to it


class _Poisoned(nn.Module):
    """A real (tiny) model that misbehaves: out of memory for batches larger than
    ``max_batch`` and, on inputs as bright as a white plate, ``on_bright`` (oom or nan)."""

    def __init__(self, inner: nn.Module, *, max_batch: int = 64, on_bright: str = "") -> None:
        super().__init__()
        self.inner = inner
        self.info = inner.info
        self.max_batch = max_batch
        self.on_bright = on_bright
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor):
        self.batches.append(x.shape[0])
        white = (x > 2.2).all(dim=1).float().mean(dim=(1, 2))  # share of white pixels
        bright = bool((white > 0.35).any())
        if x.shape[0] > self.max_batch or (bright and self.on_bright == "oom"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        out = self.inner(x)
        if bright and self.on_bright == "nan":
            out = out.clone()
            out[:, :, out.shape[2] // 2, out.shape[3] // 2] = float("nan")
        return out


def test_a_batch_that_does_not_fit_is_halved_and_the_size_that_fits_is_kept(caplog):
    model = _Poisoned(tiny("seg", seed=1), max_batch=1)
    reference = sapiens.Predictor({"seg": tiny("seg", seed=1)}, batch_size=4)
    predictor = sapiens.Predictor({"seg": model}, batch_size=4)
    tiles = torch.rand((5, 3, 64, 48), generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING, logger="sapiens.predictor"):
        out = predictor.predict_batch(tiles, "seg")["seg"]
    assert model.batches[:3] == [4, 2, 1]  # halved twice, then one at a time
    assert torch.allclose(out, reference.predict_batch(tiles, "seg")["seg"], atol=1e-5)
    assert "out of device memory" in caplog.text and "1 at a time" in caplog.text
    model.batches.clear()
    predictor.predict_batch(tiles, "seg")  # the size that fitted is remembered
    assert set(model.batches) == {1}


def test_one_input_that_does_not_fit_names_the_pass_and_the_size():
    model = _Poisoned(tiny("normal"), max_batch=0)
    predictor = sapiens.Predictor({"normal": model}, batch_size=2)
    with pytest.raises(DeviceMemoryError, match=r"normal model ran out of cpu memory on one 48x64"):
        predictor.predict_batch(torch.rand((3, 3, 64, 48)), "normal")


@pytest.fixture(scope="module")
def chunk(tmp_path_factory):
    """A three-frame chunk whose middle frame is a white plate, and a job for it."""
    root = tmp_path_factory.mktemp("faults")
    pattern = make_plate(root / "plates", frames=3)
    plates = root / "plates"
    w, h = SMALL
    white = np.ones((h, w, 3), np.float16) * 50
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    OpenEXR.File(header, {"RGB": white}).write(str(plates / f"astronaut.{BRIGHT}.exr"))
    spec = parse_spec(spec_data(pattern, root / "out", passes="normal,seg,pose", chunk_frames=8))

    def job(version: str) -> ChunkJob:
        return small_chunk_job(root, pattern, spec, FRAMES, version=version)

    return job


def _predictor(on_bright: str, poisoned: str) -> sapiens.Predictor:
    models = {"normal": tiny("normal", seed=1), "seg": tiny("seg", seed=2)}
    models["pose"] = tiny("pose", seed=3)
    models[poisoned] = _Poisoned(models[poisoned], on_bright=on_bright)
    return sapiens.Predictor(models, batch_size=2)


def _check_only_the_bright_frame_failed(job: ChunkJob, summary, reason: str) -> None:
    status = {f.frame: f.status for f in summary.frames}
    assert status == {1001: "done", 1002: "failed", 1003: "done"}
    failed = next(f for f in summary.frames if f.frame == BRIGHT)
    assert f"astronaut.{BRIGHT}.exr" in failed.error and str(BRIGHT) in failed.error
    assert reason in failed.error, failed.error
    assert failed.outputs == []
    assert not Path(job.paths.exr(BRIGHT)).exists()
    assert not Path(job.paths.frame_record(BRIGHT)).exists()
    assert Path(job.paths.exr(1003)).is_file()
    assert set(committed_frames(job.paths.zarr)) == {1001, 1003}


def test_a_frame_that_never_fits_fails_by_name_and_the_chunk_goes_on(chunk):
    job = chunk("v001")
    summary = process_chunk(job, predictor=_predictor("oom", "seg"))
    _check_only_the_bright_frame_failed(
        job, summary, "DeviceMemoryError: the seg model ran out of cpu memory on one 192x180 input"
    )


def test_a_frame_the_model_makes_nan_fails_by_name_with_nothing_written(chunk):
    job = chunk("v002")
    summary = process_chunk(job, predictor=_predictor("nan", "normal"))
    _check_only_the_bright_frame_failed(
        job, summary, "the model's normal output holds NaN or Inf values"
    )
