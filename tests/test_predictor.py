"""The batched multi-task predictor and the upstream pre/post-processing geometry."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sapiens
from sapiens.preprocess import letterbox, normalize, restore, stretch
from schemas.passes import PASSES, model_task
from tests.model_helpers import SMALL_HW, tiny

# every Sapiens2 pass (depth is Sapiens v1's: tests/test_sapiens1_models.py)
PASS_TASK = {p.name: p.models["sapiens2"] for p in PASSES if "sapiens2" in p.models}


@pytest.fixture(scope="module")
def predictor() -> sapiens.Predictor:
    return sapiens.Predictor(
        {p: tiny(t, seed=i) for i, (p, t) in enumerate(PASS_TASK.items())}, batch_size=2
    )


def test_every_pass_for_every_tile(predictor: sapiens.Predictor) -> None:
    tiles = np.random.default_rng(0).random((3, 131, 97, 3), dtype=np.float32)
    out = predictor.predict(tiles)
    assert out["normal"].shape == (3, 131, 97, 3)
    assert out["albedo"].shape == (3, 131, 97, 3)
    assert out["pointmap"].shape == (3, 131, 97, 3)
    assert out["seg"].shape == (3, 131, 97, 29)
    assert out["matte"].shape == (3, 131, 97)
    assert out["matte_fg"].shape == (3, 131, 97, 3)
    assert out["focal"].shape == (3,)
    assert all(v.dtype == np.float32 for v in out.values())
    np.testing.assert_allclose(np.linalg.norm(out["normal"], axis=-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(out["seg"].sum(-1), 1.0, atol=1e-5)
    assert out["albedo"].min() >= 0 and out["albedo"].max() <= 1
    assert out["matte"].min() >= 0 and out["matte"].max() <= 1


def test_batching_does_not_change_results(predictor: sapiens.Predictor) -> None:
    tiles = np.random.default_rng(1).random((3, 64, 48, 3), dtype=np.float32)
    together = predictor.predict(tiles, ["seg"])["seg"]
    alone = predictor.predict(tiles[2:], ["seg"])["seg"]
    np.testing.assert_allclose(together[2:], alone, atol=1e-5)


class _Counting(torch.nn.Module):
    """A model that records the batch of every call."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.info, self.batches = inner, inner.info, []

    def forward(self, x: torch.Tensor):
        self.batches.append(x.shape[0])
        return self.inner(x)


def test_on_a_cpu_a_call_holds_at_most_one_native_inputs_pixels() -> None:
    """A model of native (1024x768) input runs one input per call on a CPU, whatever the
    batch size; small inputs share a call up to the batch size; other devices keep it."""
    native = _Counting(sapiens.build_model("tiny", "seg", input_hw=(1024, 768), seed=0))
    small = _Counting(tiny("seg", seed=0))
    predictor = sapiens.Predictor({"native": native, "small": small}, batch_size=4)
    tiles = torch.rand((3, 3, 64, 48), generator=torch.Generator().manual_seed(0))
    predictor.predict_batch(tiles, "native")
    predictor.predict_batch(tiles, "small")
    assert native.batches == [1, 1, 1]
    assert small.batches == [3]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert sapiens.predictor.sub_batch(4, cpu, (512, 384)) == 4
    assert sapiens.predictor.sub_batch(8, cpu, (512, 384)) == 4
    assert sapiens.predictor.sub_batch(8, cpu, (4096, 3072)) == 1
    assert sapiens.predictor.sub_batch(8, cuda, (1024, 768)) == 8


def test_focal_is_in_input_pixels(predictor: sapiens.Predictor) -> None:
    """The same picture at twice the size has twice the focal length in pixels."""
    small = np.random.default_rng(2).random((1, 128, 96, 3), dtype=np.float32)
    big = small.repeat(2, axis=1).repeat(2, axis=2)
    f_small = predictor.predict(small, ["pointmap"])["focal"][0]
    f_big = predictor.predict(big, ["pointmap"])["focal"][0]
    assert f_big == pytest.approx(2 * f_small, rel=0.05)


def test_pose_pass(predictor: sapiens.Predictor) -> None:
    image = np.random.default_rng(3).random((300, 200, 3), dtype=np.float32)
    result = predictor.predict_pose(image, [[20, 30, 150, 280], [0, 0, 50, 60]])
    assert result.keypoints.shape == (2, 308, 2)
    assert result.scores.shape == (2, 308)
    assert predictor.predict_pose(image, np.zeros((0, 4))).keypoints.shape == (0, 308, 2)


def test_features_pass_pads_instead_of_cropping() -> None:
    pred = sapiens.Predictor({"features": tiny(None)})
    out = pred.predict(np.zeros((1, 100, 90, 3), np.float32), ["features"])["features"]
    assert out.shape == (1, 64, 7, 6)  # ceil(100/16), ceil(90/16): nothing cropped


def test_wrong_model_for_a_pass() -> None:
    tasks = {p.name: model_task(p.name) for p in PASSES if p.models}
    with pytest.raises(ValueError, match="'normal' needs a normal model, got seg"):
        sapiens.Predictor({"normal": tiny("seg")}, expected_tasks=tasks)
    with pytest.raises(ValueError, match="unknown output"):
        sapiens.Predictor({"shadow": tiny("seg")}, expected_tasks=tasks)
    with pytest.raises(ValueError, match="'depth' needs a depth model, got seg"):
        sapiens.Predictor({"depth": tiny("seg")}, expected_tasks=tasks)


def test_nan_tiles_rejected(predictor: sapiens.Predictor) -> None:
    tiles = np.zeros((1, 32, 32, 3), np.float32)
    tiles[0, 3, 3, 1] = np.inf
    with pytest.raises(ValueError, match="NaN or Inf"):
        predictor.predict(tiles, ["seg"])


def test_pass_not_loaded(predictor: sapiens.Predictor) -> None:
    only_seg = sapiens.Predictor({"seg": tiny("seg")})
    with pytest.raises(ValueError, match="no model loaded for \\['normal'\\]"):
        only_seg.predict(np.zeros((1, 32, 32, 3), np.float32), ["normal"])


def test_letterbox_geometry_as_upstream() -> None:
    x = torch.rand(1, 3, 1080, 1920)
    canvas, geom = letterbox(x, (1024, 768))
    assert canvas.shape[-2:] == (1024, 768)
    # scale = min(768/1920, 1024/1080) = 0.4 -> 768 x int(1080 * 0.4) = 432; pad 296 -> 296
    assert geom.resized_hw == (432, 768)
    assert geom.pad == (0, 0, 296, 296)
    assert float(canvas[..., :296, :].abs().max()) == 0.0
    back = restore(canvas, geom)
    assert back.shape[-2:] == (1080, 1920)


def test_native_tile_passes_through_untouched() -> None:
    x = torch.rand(2, 3, 1024, 768)
    canvas, geom = letterbox(x, (1024, 768))
    assert torch.equal(canvas, x) and torch.equal(restore(canvas, geom), x)
    stretched, geom = stretch(x, (1024, 768))
    assert torch.equal(stretched, x)


def test_normalize_statistics() -> None:
    x = torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1) / 255.0
    assert torch.allclose(normalize(x), torch.zeros(1, 3, 1, 1), atol=1e-5)


def test_small_input_hw_for_tests() -> None:
    assert tiny("normal").info.input_hw == SMALL_HW
