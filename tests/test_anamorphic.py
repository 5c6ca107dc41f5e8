"""Desqueezing anamorphic plates for the model and squeezing outputs back to the plate, in
torch on the model's device (channels first)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.anamorphic import desqueeze, desqueezed_width, resample_width, resqueeze


def _chw(array: np.ndarray) -> torch.Tensor:
    """(H, W, C) numpy -> (C, H, W) tensor."""
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(array, -1, 0)))


def _hwc(tensor: torch.Tensor) -> np.ndarray:
    return np.moveaxis(tensor.numpy(), 0, -1)


def _smooth_image(height: int, width: int) -> torch.Tensor:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack(
        [
            0.5 + 0.4 * np.sin(x / 37.0) * np.cos(y / 23.0),
            0.5 + 0.3 * np.cos(x / 51.0 + 1.0),
            0.2 + 0.6 * (x + y) / (width + height),
        ],
        axis=-1,
    ).astype(np.float32)
    return _chw(image)


def test_pixel_aspect_one_is_a_no_op_returning_the_same_tensor():
    image = _smooth_image(10, 12)
    assert desqueeze(image, 1.0) is image
    assert resqueeze(image, 12) is image


def test_desqueeze_doubles_the_width_for_a_2x_lens():
    image = _smooth_image(40, 64)
    wide = desqueeze(image, 2.0)
    assert tuple(wide.shape) == (3, 40, 128) and wide.dtype == torch.float32


def test_round_trip_for_pixel_aspect_2_on_smooth_images():
    image = _smooth_image(60, 200)
    back = resqueeze(desqueeze(image, 2.0), 200)
    assert back.shape == image.shape
    # Inside, linear-up then area-down errs by an eighth of the second difference; the edge
    # columns, where interpolation clamps, by an eighth of the first.
    np.testing.assert_allclose(back[..., 1:-1], image[..., 1:-1], atol=1e-4)
    np.testing.assert_allclose(back, image, atol=2e-3)


@pytest.mark.parametrize("pixel_aspect", [1.33, 1.5, 1.8])
def test_round_trip_for_other_lenses_on_smooth_images(pixel_aspect):
    image = _smooth_image(30, 301)
    wide = desqueeze(image, pixel_aspect)
    assert wide.shape[-1] == round(301 * pixel_aspect)
    np.testing.assert_allclose(resqueeze(wide, 301)[..., 2:-2], image[..., 2:-2], atol=1e-3)


def test_constant_images_survive_exactly_enough():
    image = torch.full((3, 5, 33), 0.25)
    back = resqueeze(desqueeze(image, 1.8), 33)
    np.testing.assert_allclose(back, 0.25, rtol=1e-6)


def test_shrinking_by_two_averages_pairs_of_pixels():
    values = np.random.default_rng(0).random((7, 20, 4), dtype=np.float32)
    shrunk = _hwc(resample_width(_chw(values), 10))
    pairs = values.reshape(7, 10, 2, 4).mean(axis=2)
    np.testing.assert_allclose(shrunk, pairs, atol=1e-6)


def test_shrinking_by_a_fractional_ratio_is_an_area_average():
    # Three input pixels into two outputs: each output is 1.5 inputs wide.
    values = torch.tensor([[1.0, 2.0, 4.0]])
    shrunk = resample_width(values, 2)
    expected = [[(1.0 + 0.5 * 2.0) / 1.5, (0.5 * 2.0 + 4.0) / 1.5]]
    np.testing.assert_allclose(shrunk, expected, rtol=1e-6)
    # An area average keeps each row's integral (mean) whatever the ratio.
    rows = torch.from_numpy(np.random.default_rng(1).random((4, 1000), dtype=np.float32))
    shrunk_rows = resample_width(rows, 751)
    np.testing.assert_allclose(shrunk_rows.mean(dim=1), rows.mean(dim=1), rtol=1e-5)


def test_resqueezed_segmentation_probabilities_still_sum_to_one():
    logits = torch.randn((29, 20, 540), generator=torch.Generator().manual_seed(2))
    probabilities = torch.softmax(logits, dim=0)
    squeezed = resqueeze(probabilities, 300)  # 1.8x lens
    assert tuple(squeezed.shape) == (29, 20, 300)
    np.testing.assert_allclose(squeezed.sum(dim=0), 1.0, atol=1e-5)
    assert squeezed.min() >= 0


def test_resqueezed_normals_are_unit_and_keep_their_direction():
    normals = torch.randn((3, 10, 64), generator=torch.Generator().manual_seed(3))
    normals /= normals.norm(dim=0, keepdim=True)
    squeezed = resqueeze(normals, 32, unit_vectors=True)
    np.testing.assert_allclose(squeezed.norm(dim=0), 1.0, atol=1e-5)
    # A flat surface's normal is a 3-D direction: squeezing the pixel grid must not tilt it.
    flat = torch.tensor([0.6, 0.0, -0.8]).view(3, 1, 1).expand(3, 4, 64).contiguous()
    squeezed_flat = resqueeze(flat, 32, unit_vectors=True)
    np.testing.assert_allclose(squeezed_flat[:, 0, 0], [0.6, 0.0, -0.8], atol=1e-6)


def test_single_channel_values_resample():
    matte = torch.rand((1, 6, 80))
    assert tuple(resqueeze(matte, 40).shape) == (1, 6, 40)


def test_desqueezed_width_rounds():
    assert desqueezed_width(2048, 2.0) == 4096
    assert desqueezed_width(1000, 1.333) == 1333
    assert desqueezed_width(1, 0.4) == 1


@pytest.mark.parametrize("pixel_aspect", [0.0, -2.0, float("nan"), float("inf")])
def test_a_bad_pixel_aspect_is_refused(pixel_aspect):
    with pytest.raises(ValueError, match="pixel aspect"):
        desqueeze(_smooth_image(4, 4), pixel_aspect)
