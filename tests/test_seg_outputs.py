"""A frame's body-part probabilities into labels and Cryptomatte rank planes, on the model's
device: the specification's ranking, and bit for bit what the numpy code it replaced made."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sapiens.seg_classes import SEG_CLASSES
from storage import cryptomatte
from tasks import pixel_blocks
from tasks.seg_outputs import seg_outputs
from tests import numpy_reference

BODY_PARTS = list(SEG_CLASSES)
LAYER = "CryptoBodyPart"


def _rank(probabilities: np.ndarray, **kw) -> dict[str, np.ndarray]:
    """Rank planes of (H, W, C) probabilities, by channel name (as the EXR part holds them)."""
    planes = seg_outputs(_chw(probabilities), BODY_PARTS, **kw).planes.numpy()
    names = cryptomatte.channel_names(LAYER, 2 * (len(planes) // 4))
    return dict(zip(names, planes, strict=True))


def _chw(probabilities: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(probabilities, -1, 0)))


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return (exp / exp.sum(-1, keepdims=True)).astype(np.float32)


def _awkward_probabilities(height: int, width: int, seed: int, scale: float) -> np.ndarray:
    """Softmax probabilities with ties, one-hots, zeros, -0.0 and near-ties sprinkled in."""
    rng = np.random.default_rng(seed)
    p = _softmax(rng.normal(size=(height, width, 29)).astype(np.float32) * scale)
    flat = p.reshape(-1, 29)
    picks = rng.choice(len(flat), size=min(len(flat), 40), replace=False)
    for n, i in enumerate(picks):
        kind = n % 5
        flat[i] = 0.0
        if kind == 0:
            flat[i] = 1 / 29  # every class tied
        elif kind == 1:
            flat[i, n % 29] = 1.0  # one-hot
        elif kind == 2:
            flat[i, 5] = flat[i, 7] = 0.5  # two tied
        elif kind == 3:
            flat[i, 5] = 0.5
            flat[i, 7] = np.nextafter(np.float32(0.5), np.float32(1))  # tied in the keys only
        else:
            flat[i, 3] = 1.0
            flat[i, 20:] = -0.0
    return p


@pytest.mark.parametrize(
    ("size", "scale", "block_bytes"),
    [((37, 23), 3.0, None), ((203, 1500), 3.0, 1 << 16), ((64, 64), 14.0, 1 << 14),
     ((1, 1), 1.0, None), ((120, 333), 40.0, 1 << 12)],
)  # fmt: skip
def test_ranks_and_labels_equal_the_numpy_code_they_replaced(monkeypatch, size, scale, block_bytes):
    # Bands of a few rows (block_bytes), confident and soft probabilities, ties of every kind:
    # the device's planes and labels are the host code's, bit for bit.
    if block_bytes:
        monkeypatch.setattr(pixel_blocks, "CPU_BLOCK_BYTES", block_bytes)
    probabilities = _awkward_probabilities(*size, seed=size[0], scale=scale)
    expected = numpy_reference.rank_channels(probabilities, BODY_PARTS, LAYER)
    result = seg_outputs(_chw(probabilities), BODY_PARTS)
    planes = result.planes.numpy()
    assert list(expected) == cryptomatte.channel_names(LAYER, 6) and len(planes) == 12
    for plane, (name, values) in zip(planes, expected.items(), strict=True):
        assert np.array_equal(plane.view(np.uint32), values.view(np.uint32)), name
    labels = result.labels.numpy()
    assert labels.dtype == np.int32
    assert np.array_equal(labels, numpy_reference.class_labels(probabilities, np.int32))


def test_one_hot_probabilities_give_full_coverage_of_that_class() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 29, size=(9, 11))
    probabilities = np.eye(29, dtype=np.float32)[labels]
    channels = _rank(probabilities)
    assert list(channels) == cryptomatte.channel_names(LAYER, 6)
    assert all(c.dtype == np.float32 and c.shape == (9, 11) for c in channels.values())
    ids = cryptomatte.class_ids(BODY_PARTS)
    np.testing.assert_array_equal(channels["CryptoBodyPart00.R"], ids[labels])
    np.testing.assert_array_equal(channels["CryptoBodyPart00.G"], 1.0)
    coverage = sum(channels[f"CryptoBodyPart0{k}.{c}"] for k in range(3) for c in "GA")
    np.testing.assert_allclose(coverage, 1.0, atol=1e-6)
    # Every lower rank is "no object": ID 0, coverage 0.
    for name in ("CryptoBodyPart00.B", "CryptoBodyPart00.A", "CryptoBodyPart02.R"):
        np.testing.assert_array_equal(channels[name], 0.0)
    np.testing.assert_array_equal(seg_outputs(_chw(probabilities), BODY_PARTS).labels, labels)


def test_soft_probabilities_are_ranked_descending_and_renormalised() -> None:
    rng = np.random.default_rng(2)
    probabilities = _softmax(rng.normal(size=(5, 7, 29)) * 3)
    channels = _rank(probabilities, min_coverage=0.0)
    order = np.argsort(-probabilities, axis=-1)[..., :6]
    id_of = {
        cryptomatte.float_to_bits(cryptomatte.float_id(n)): i for i, n in enumerate(BODY_PARTS)
    }
    coverages = []
    for rank in range(6):
        layer, (id_c, cov_c) = rank // 2, ("R", "G") if rank % 2 == 0 else ("B", "A")
        ids = channels[f"CryptoBodyPart{layer:02d}.{id_c}"]
        got = np.vectorize(lambda v: id_of[cryptomatte.float_to_bits(v)])(ids)
        np.testing.assert_array_equal(got, order[..., rank])
        coverages.append(channels[f"CryptoBodyPart{layer:02d}.{cov_c}"])
    stacked = np.stack(coverages, axis=-1)
    assert (np.diff(stacked, axis=-1) <= 1e-7).all()
    np.testing.assert_allclose(stacked.sum(-1), 1.0, atol=1e-5)
    top6 = np.take_along_axis(probabilities, order, axis=-1)
    np.testing.assert_allclose(stacked, top6 / top6.sum(-1, keepdims=True), rtol=1e-5)


def test_ties_rank_deterministically() -> None:
    probabilities = np.full((1, 1, 29), 1 / 29, dtype=np.float32)
    channels = _rank(probabilities)
    assert channels["CryptoBodyPart00.R"][0, 0] == cryptomatte.float_id("Tongue")
    assert channels["CryptoBodyPart00.B"][0, 0] == cryptomatte.float_id("Upper_Teeth")
    np.testing.assert_allclose(channels["CryptoBodyPart00.G"], 1 / 6, rtol=1e-5)
    # the label of a tie is the lowest class, as numpy's argmax
    assert seg_outputs(_chw(probabilities), BODY_PARTS).labels[0, 0] == 0


def test_small_probabilities_become_id_zero() -> None:
    probabilities = np.zeros((1, 1, 29), dtype=np.float32)
    probabilities[0, 0, 3] = 0.99995
    probabilities[0, 0, 4] = 0.00005
    channels = _rank(probabilities)
    assert channels["CryptoBodyPart00.R"][0, 0] == cryptomatte.float_id("Face_Neck")
    assert channels["CryptoBodyPart00.B"][0, 0] == 0.0
    assert channels["CryptoBodyPart00.A"][0, 0] == 0.0


def test_probabilities_of_the_wrong_shape_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\(29, H, W\)"):
        seg_outputs(torch.zeros((3, 2, 2)), BODY_PARTS)
    with pytest.raises(ValueError, match="at least 1"):
        seg_outputs(torch.zeros((29, 2, 2)), BODY_PARTS, ranks=0)


def test_negative_zero_probabilities_rank_as_zero() -> None:
    probabilities = np.zeros((2, 3, 29), dtype=np.float32)
    probabilities[..., 7] = 1.0
    expected = _rank(probabilities)
    probabilities[..., 20:] = -0.0
    channels = _rank(probabilities)
    for name, values in expected.items():
        np.testing.assert_array_equal(channels[name], values)
