"""A compiled model sees one batch shape per pass: the predictor pads a short batch to its
sub-batch size and drops the padding's outputs, and after an out-of-memory it keeps the halved
size and pads to that; the real inputs' outputs are those of unpadded calls."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import sapiens
from schemas.passes import PASSES
from tests.model_helpers import tiny

PASS_TASK = {p.name: p.models["sapiens2"] for p in PASSES if "sapiens2" in p.models}
DENSE = [name for name, task in PASS_TASK.items() if task != "pose"]


class _Recording(nn.Module):
    """A real (tiny) model that records each call's batch and, like a device too small for
    them, raises CUDA's out-of-memory error on batches larger than ``max_batch``."""

    def __init__(self, inner: nn.Module, max_batch: int = 64) -> None:
        super().__init__()
        self.inner, self.info, self.max_batch = inner, inner.info, max_batch
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor):
        self.batches.append(x.shape[0])
        if x.shape[0] > self.max_batch:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return self.inner(x)


def _tiles(count: int, seed: int = 0) -> torch.Tensor:
    return torch.rand((count, 3, 131, 97), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def models() -> dict[str, nn.Module]:
    return {name: tiny(task, seed=i) for i, (name, task) in enumerate(PASS_TASK.items())}


@pytest.mark.parametrize("count", [3, 5])
def test_padding_keeps_every_real_tiles_output(models, count: int) -> None:
    """Every dense pass and output of ``count`` tiles at batch size 4, padded against not.
    Not always bit for bit: on a CPU the network's kernels (a batch of 1 against 4) and the
    post-processing's (3 images resized against 4) take other paths by batch size, which moves
    the last bits of fp32 (measured: at most 5e-6 on unit normals, 3e-7 elsewhere; the same
    rows of one batch size are bit-identical whatever fills the rest). 1e-5 is the bound
    batching already has (``tests/test_predictor.py``); a wrong row would be off by far more."""
    plain = sapiens.Predictor(models, batch_size=4, pad_batches=False)
    padded = sapiens.Predictor(models, batch_size=4, pad_batches=True)
    tiles = _tiles(count)
    for name in DENSE:
        want, got = plain.predict_batch(tiles, name), padded.predict_batch(tiles, name)
        assert want.keys() == got.keys()
        for key in want:
            assert got[key].shape == want[key].shape, (name, key)
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5)


def test_a_padded_model_sees_one_batch_shape_whatever_the_batch() -> None:
    seg = _Recording(tiny("seg", seed=1))
    eager = _Recording(tiny("seg", seed=1))
    predictor = sapiens.Predictor({"seg": seg, "eager": eager}, batch_size=4)
    assert predictor.padded == {"seg": False, "eager": False}  # eager models: no padding
    predictor.padded["seg"] = True
    for count in (5, 3, 1, 4):  # a frame's tiles, then the short last groups of a chunk
        predictor.predict_batch(_tiles(count), "seg")
        predictor.predict_batch(_tiles(count), "eager")
    assert seg.batches == [4, 4, 4, 4, 4]
    assert eager.batches == [4, 1, 3, 1, 4]


def test_a_compiled_model_is_padded_by_default() -> None:
    model = tiny("seg", seed=2)
    model.head_module.compile(backend="eager")  # as sapiens.torch_compile compiles a part
    predictor = sapiens.Predictor({"seg": model, "plain": tiny("seg", seed=2)}, batch_size=4)
    assert predictor.padded == {"seg": True, "plain": False}
    assert sapiens.predictor.is_compiled(torch.compile(tiny("seg"), backend="eager"))


def test_after_an_out_of_memory_every_batch_is_padded_to_the_size_that_fitted(caplog) -> None:
    seg = _Recording(tiny("seg", seed=1), max_batch=2)
    reference = sapiens.Predictor({"seg": tiny("seg", seed=1)}, batch_size=8)
    predictor = sapiens.Predictor({"seg": seg}, batch_size=8, pad_batches=True)
    tiles = _tiles(5)
    with caplog.at_level(logging.WARNING, logger="sapiens.predictor"):
        out = predictor.predict_batch(tiles, "seg")["seg"]
    assert seg.batches == [8, 4, 2, 2, 2]  # halved twice, then 2 + 2 + 1 padded to 2
    assert "2 at a time" in caplog.text
    want = reference.predict_batch(tiles, "seg")["seg"]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    seg.batches.clear()
    for count in (1, 3, 8):  # later batches start at the size that fitted, padded to it
        predictor.predict_batch(_tiles(count), "seg")
    assert set(seg.batches) == {2}
    seg.batches.clear()
    predictor.predict_batch(_tiles(1)[..., :64, :48], "seg")  # another input size: its own
    assert seg.batches == [8, 4, 2]


def test_pose_crops_are_padded_to_one_call_size() -> None:
    pose = _Recording(tiny("pose", seed=3))
    padded = sapiens.Predictor({"pose": pose}, batch_size=2, pad_batches=True)
    plain = sapiens.Predictor({"pose": tiny("pose", seed=3)}, batch_size=2)
    image = torch.rand((300, 200, 3), generator=torch.Generator().manual_seed(4)).numpy()
    for boxes in ([[20, 30, 150, 280]], [[20, 30, 150, 280], [0, 0, 50, 60], [9, 9, 99, 199]]):
        got, want = padded.predict_pose(image, boxes), plain.predict_pose(image, boxes)
        assert got.keypoints.shape == want.keypoints.shape == (len(boxes), 308, 2)
        # decoded from the heatmaps' maxima: equal here; 1e-3 px leaves the sub-pixel
        # refinement its last bits (the batch-size-dependent kernels above)
        torch.testing.assert_close(
            torch.from_numpy(got.keypoints), torch.from_numpy(want.keypoints), rtol=0, atol=1e-3
        )
    assert set(pose.batches) == {4}  # two people and their mirrored crops per call


def test_a_compiled_model_compiles_once_for_a_pass_of_short_batches() -> None:
    """Through dynamo (its eager backend: the same graphs and recompiles as inductor, without
    building code): the first call compiles, later batches of other sizes reuse it; unpadded,
    each new size would compile again."""
    from torch._dynamo.utils import counters

    from sapiens.torch_compile import compiled_parts

    torch._dynamo.reset()
    model = tiny("seg", seed=5)
    for part in compiled_parts(model):
        part.compile(backend="eager", dynamic=False)
    predictor = sapiens.Predictor({"seg": model}, batch_size=4)
    predictor.predict_batch(_tiles(4), "seg")
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > 0
    for count in (5, 3, 1, 2):
        predictor.predict_batch(_tiles(count), "seg")
    assert counters["stats"]["unique_graphs"] == compiled
    predictor.padded["seg"] = False
    predictor.predict_batch(_tiles(3), "seg")
    assert counters["stats"]["unique_graphs"] > compiled
    torch._dynamo.reset()
