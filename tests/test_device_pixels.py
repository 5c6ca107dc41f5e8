"""The per-pixel work on the model's device (here the CPU) gives what the host's numpy code it
replaced gave (tests/numpy_reference.py): bit for bit where that code was exact; normals
rotated into the frame's camera within 1e-6 before they become half (einsum and BLAS sum the
three products in different orders), so at most one half ulp apart in the file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sapiens.seg_classes import SEG_CLASSES
from storage.cryptomatte import channel_names
from tasks import pixel_blocks
from tasks.anamorphic import resample_width
from tasks.frame_inference import FrameInference, default_focal
from tasks.normal_rotation import normalize_vectors, rotate_normals, tile_rotation
from tasks.tiling import plan_frame
from tests import numpy_reference
from tests.frame_helpers import frame_spec, read_frame
from tests.model_helpers import SMALL_HW, tiny

HEIGHT, WIDTH = 300, 430  # several 256x192 tiles each way, the last ones shifted inward


def _hwc(tensor: torch.Tensor) -> np.ndarray:
    return np.moveaxis(tensor.numpy(), 0, -1)


def _chw(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(array, -1, 0)))


@pytest.mark.parametrize("block_bytes", [None, 1 << 12])
def test_normalising_equals_the_numpy_code(monkeypatch, block_bytes):
    if block_bytes:
        monkeypatch.setattr(pixel_blocks, "CPU_BLOCK_BYTES", block_bytes)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(70, 90, 3)).astype(np.float32) * 0.7
    vectors[0, :5] = 0.0
    vectors[1, :5] = 1e-9
    vectors[2, :5] = [3.4e18, 0.0, -2.0]
    expected = numpy_reference.normalize_vectors(vectors)
    got = _hwc(normalize_vectors(_chw(vectors)))
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("width", [17, 80, 151, 300])
def test_resampling_equals_the_numpy_code(width):
    values = np.random.default_rng(1).random((6, 151, 29), dtype=np.float32)
    expected = numpy_reference.resample_width(values, width)
    got = _hwc(resample_width(_chw(values), width))
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_rotating_agrees_with_the_numpy_code_within_1e_6():
    plan = plan_frame(2160, 3840, "normal")
    values = np.random.default_rng(2).normal(size=(64, 48, 3)).astype(np.float32)
    values = numpy_reference.normalize_vectors(values)
    for tile in (plan.tiles[0], plan.tiles[-1], plan.tiles[len(plan.tiles) // 2]):
        rotation = tile_rotation(tile, (2160, 3840), 2600.0)
        expected = numpy_reference.rotate_normals(values, rotation)
        got = _hwc(rotate_normals(_chw(values), rotation))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def inference():
    models = {
        "pointmap": tiny("pointmap", seed=1),
        "normal": tiny("normal", seed=2),
        "albedo": tiny("albedo", seed=3),
        "matte": tiny("matting", seed=4),
        "seg": tiny("seg", seed=5),
    }
    import sapiens

    predictor = sapiens.Predictor(models, batch_size=1)
    spec = frame_spec(
        ("normal", "pointmap", "albedo", "matte", "seg"), batch_size=1, previews=False
    )
    return FrameInference(spec, predictor, SEG_CLASSES)


def test_a_whole_frame_equals_the_numpy_pipeline_it_replaced(inference):
    # Model outputs per tile through the numpy code (rotate, blend, normalise, rank, argmax,
    # half) against the device path; the same tiles, one per model batch, so the network's
    # outputs are the same bits on both sides.
    rgb = np.random.default_rng(3).random((HEIGHT, WIDTH, 3), dtype=np.float32)
    (frame,) = inference.run([read_frame(rgb)])
    got = frame.arrays.wait()
    predictor = inference.predictor
    pointmap = predictor.predict(rgb[None], ["pointmap"])
    focal = float(pointmap["focal"][0])
    assert frame.focal == focal
    assert np.array_equal(got["pointmap"], np.moveaxis(pointmap["pointmap"][0], -1, 0))

    blended = {}
    for name, channels in (("normal", 3), ("albedo", 3), ("matte", None), ("seg", 29)):
        tile_hw = SMALL_HW
        plan = plan_frame(HEIGHT, WIDTH, name, tile_hw, min(128, min(tile_hw) // 4))
        assert len(plan.tiles) > 2
        blender = numpy_reference.FrameBlender.for_plan(plan, channels)
        for tile in plan.tiles:
            values = predictor.predict(rgb[tile.box.slices][None], [name])[name][0]
            if name == "normal":
                rotation = tile_rotation(tile, (HEIGHT, WIDTH), focal or default_focal(1, 1))
                values = numpy_reference.rotate_normals(values, rotation)
            blender.add(tile, values)
        blended[name] = blender.result()

    normal = numpy_reference.normalize_vectors(blended["normal"])
    half = np.moveaxis(normal, -1, 0).astype(np.float16)
    one_ulp = np.abs(np.spacing(half)).astype(np.float32)
    assert (np.abs(got["normal"].astype(np.float32) - half.astype(np.float32)) <= one_ulp).all()
    assert np.mean(got["normal"] == half) > 0.99
    assert np.array_equal(got["albedo"], blended["albedo"])
    assert np.array_equal(got["matte"], blended["matte"].astype(np.float16))
    ranks = numpy_reference.rank_channels(blended["seg"], SEG_CLASSES, "CryptoBodyPart")
    assert list(ranks) == channel_names("CryptoBodyPart", 6)
    assert np.array_equal(got["seg/ranks"], np.stack(list(ranks.values())))
    labels = numpy_reference.class_labels(blended["seg"], np.uint32)
    assert np.array_equal(got["seg/id"].view(np.uint32), labels)
    assert np.array_equal(got["seg"], labels.astype(np.uint8))
    assert not any(got[f"nonfinite/{name}"] for name in blended)
