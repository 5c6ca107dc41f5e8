"""A whole frame through ``FrameInference`` on CUDA gives what it gives on the CPU.

Two questions, kept apart so a difference says where it comes from:

- the per-pixel work on the device (tiles, blending, normal rotation and renormalisation,
  seg labels and Cryptomatte ranks, previews, conversion to each EXR type): the CUDA run is
  fed the very network outputs the CPU run got (recorded, replayed), so only that work
  differs. It is held to the CPU tests' tolerances (tests/test_device_pixels.py): normals
  within one half ulp, other floats within float32 rounding, every array of the same type
  and shape; labels and Cryptomatte IDs equal except where two classes tie (coverages within
  1e-5 of each other, where any order of summing may pick either);
- the networks themselves: the same weights in fp32 on the GPU (TF32 off) agree with the CPU
  within the model tests' tolerance (relative error 1e-3, tests/test_model_numerics.py), and
  bf16 stays near them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from torch import Tensor

import sapiens
from sapiens.seg_classes import SEG_CLASSES
from schemas.passes import model_task
from tasks.frame_inference import FrameInference
from tests.cuda import CUDA
from tests.frame_helpers import frame_spec, read_frame
from tests.model_helpers import rel_err, tiny

pytestmark = CUDA

HEIGHT, WIDTH = 300, 430  # several tiny-model tiles each way, the last ones shifted inward
PASSES = ("pointmap", "normal", "albedo", "matte", "seg")
TIE = 1e-5


def _models() -> dict[str, torch.nn.Module]:
    return {name: tiny(model_task(name), seed=i) for i, name in enumerate(PASSES, 1)}


class Recording:
    """A predictor that keeps every network output it gives, in order."""

    def __init__(self, predictor: sapiens.Predictor) -> None:
        self.inner = predictor
        self.device = predictor.device
        self.infos = predictor.infos
        self.calls: list[tuple[str, tuple[int, ...], dict[str, Tensor]]] = []

    def predict_batch(self, x: Tensor, name: str) -> dict[str, Tensor]:
        out = self.inner.predict_batch(x, name)
        self.calls.append((name, tuple(x.shape), {k: v.clone() for k, v in out.items()}))
        return out


class Replaying:
    """A predictor on ``device`` that answers with what a ``Recording`` got, in the same
    order, after checking it is asked the same thing."""

    def __init__(self, recording: Recording, device: torch.device) -> None:
        self.device = device
        self.infos = recording.infos
        self.calls = list(recording.calls)

    def predict_batch(self, x: Tensor, name: str) -> dict[str, Tensor]:
        want_name, want_shape, out = self.calls.pop(0)
        assert (name, tuple(x.shape)) == (want_name, want_shape)
        assert x.device.type == self.device.type
        return {k: v.to(self.device) for k, v in out.items()}


def _run(inference: FrameInference, rgb: np.ndarray) -> dict[str, np.ndarray]:
    (frame,) = inference.run([read_frame(rgb)])
    return frame.arrays.wait()


def _near_ties(crypto: np.ndarray) -> np.ndarray:
    """(ranks, H, W): where a Cryptomatte rank's coverage is within ``TIE`` of the rank above
    or below it, so either class may take that rank (planes: id, coverage, id, ...)."""
    coverage = crypto[1::2]
    close = np.abs(np.diff(coverage, axis=0)) < TIE  # rank r and r + 1
    ties = np.zeros(coverage.shape, dtype=bool)
    ties[:-1] |= close
    ties[1:] |= close
    return ties


def _assert_same_frame(cpu: Mapping[str, np.ndarray], gpu: Mapping[str, np.ndarray]) -> None:
    assert sorted(cpu) == sorted(gpu)
    for key in cpu:  # the EXR types: every array of the same type and shape
        assert (gpu[key].dtype, gpu[key].shape) == (cpu[key].dtype, cpu[key].shape), key
    ranks = _near_ties(cpu["seg/ranks"])
    ties = ranks[0]  # the label: the first rank
    assert ties.mean() < 0.01  # a check that excuses most pixels would check nothing
    for key, want in cpu.items():
        got = gpu[key]
        if key in ("seg/id", "seg"):
            assert np.array_equal(got[~ties], want[~ties]), key
        elif key == "seg/ranks":
            assert np.array_equal(got[0::2][~ranks], want[0::2][~ranks])
            np.testing.assert_allclose(got[1::2], want[1::2], rtol=0, atol=TIE)
        elif key == "preview/seg":  # labels picked at preview size: ties may show there
            assert np.mean(got != want) <= max(0.001, 2 * ties.mean()), key
        elif want.dtype == np.float16:  # N, matte: within one half ulp
            one_ulp = np.abs(np.spacing(want)).astype(np.float32)
            assert (np.abs(got.astype(np.float32) - want.astype(np.float32)) <= one_ulp).all()
        elif want.dtype == np.float32:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=key)
        else:
            assert np.array_equal(got, want), key


def test_the_device_work_on_cuda_equals_the_cpu_given_the_same_network_outputs():
    rgb = np.random.default_rng(3).random((HEIGHT, WIDTH, 3), dtype=np.float32)
    spec = frame_spec(PASSES, batch_size=2, previews=True)
    recording = Recording(sapiens.Predictor(_models(), batch_size=2))
    cpu = _run(FrameInference(spec, recording, SEG_CLASSES), rgb)  # type: ignore[arg-type]
    replaying = Replaying(recording, torch.device("cuda"))
    gpu = _run(FrameInference(spec, replaying, SEG_CLASSES), rgb)  # type: ignore[arg-type]
    assert not replaying.calls  # every recorded batch was asked for again
    assert len(recording.calls) > len(PASSES)  # tiles in several batches per pass
    _assert_same_frame(cpu, gpu)
    assert not any(gpu[f"nonfinite/{name}"] for name in PASSES)


@pytest.mark.parametrize("name", PASSES)
def test_the_networks_on_cuda_agree_with_the_cpu(name, ieee_fp32):
    models = _models()
    tiles = torch.rand((3, 3, 256, 192), generator=torch.Generator().manual_seed(7))
    on_cpu = sapiens.Predictor({name: models[name]}).predict_batch(tiles, name)
    gpu_model = copy.deepcopy(models[name])
    fp32 = sapiens.Predictor({name: gpu_model}, device="cuda", dtype=torch.float32)
    on_gpu = fp32.predict_batch(tiles.cuda(), name)
    assert sorted(on_gpu) == sorted(on_cpu)
    for key, want in on_cpu.items():
        assert rel_err(on_gpu[key].cpu(), want) < 1e-3, key
    bf16 = sapiens.Predictor({name: copy.deepcopy(models[name])}, device="cuda")
    assert bf16.dtype == torch.bfloat16  # the default on CUDA
    for key, value in bf16.predict_batch(tiles.cuda(), name).items():
        assert torch.isfinite(value).all(), key
        assert rel_err(value.cpu(), on_cpu[key]) < 0.1, key
