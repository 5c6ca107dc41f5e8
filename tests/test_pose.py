"""Top-down pose maths: UDP/DARK decoding, crops, mapping back, flip test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sapiens.keypoints import FLIP_INDICES, KEYPOINT_INDEX
from sapiens.pose import (
    PersonCrop,
    _blur_depthwise,
    _blur_shifted_sums,
    _newton_offset,
    crop_people,
    decode_heatmaps,
    estimate_pose,
    flip_back,
    heatmap_to_image,
    image_to_input,
    make_crop,
)

HM_H, HM_W = 256, 192
IN_H, IN_W = 1024, 768
LEFT_WRIST = KEYPOINT_INDEX["left_wrist"]
RIGHT_WRIST = KEYPOINT_INDEX["right_wrist"]


def udp_gaussians(centers: torch.Tensor, sigma: float = 6.0) -> torch.Tensor:
    """(..., 2) [x, y] centres -> (..., 256, 192) Gaussians, peak 1, sampled on the pixel grid."""
    xs = torch.arange(HM_W, dtype=torch.float64)
    ys = torch.arange(HM_H, dtype=torch.float64)
    gx = torch.exp(-((xs - centers[..., 0:1]) ** 2) / (2 * sigma**2))
    gy = torch.exp(-((ys - centers[..., 1:2]) ** 2) / (2 * sigma**2))
    return (gy.unsqueeze(-1) * gx.unsqueeze(-2)).float()


# ----------------------------------------------------------------------------- decoding


def test_decode_recovers_subpixel_gaussians_on_a_full_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    low = torch.tensor([6.2, 6.2], dtype=torch.float64)
    high = torch.tensor([HM_W - 7.2, HM_H - 7.2], dtype=torch.float64)
    centers = low + (high - low) * torch.rand(2, 308, 2, generator=generator, dtype=torch.float64)
    # Near (6-7 px from) every border, and off-grid in both axes.
    centers[0, :6] = torch.tensor(
        [[6.4, 100.3], [184.6, 37.8], [95.7, 6.3], [41.2, 248.6], [6.35, 6.45], [184.7, 248.55]],
        dtype=torch.float64,
    )
    heatmaps = udp_gaussians(centers)
    keypoints, scores = decode_heatmaps(heatmaps)

    assert keypoints.shape == (2, 308, 2) and scores.shape == (2, 308)
    assert keypoints.dtype == torch.float32
    error = (keypoints.double() - centers).abs()
    assert error.max().item() < 0.05
    assert torch.equal(scores, heatmaps.amax(dim=(-2, -1)))


def test_decode_without_positive_response_gives_minus_one() -> None:
    heatmaps = udp_gaussians(torch.tensor([[50.3, 60.7]] * 3, dtype=torch.float64))
    heatmaps[1] = 0.0
    heatmaps[2] = -heatmaps[2] - 0.1
    keypoints, scores = decode_heatmaps(heatmaps)  # (K, h, w): no batch axis
    assert keypoints.shape == (3, 2) and scores.shape == (3,)
    assert abs(keypoints[0, 0].item() - 50.3) < 0.05 and abs(keypoints[0, 1].item() - 60.7) < 0.05
    assert scores[1].item() == 0.0 and scores[2].item() < 0
    assert torch.equal(keypoints[1:], torch.full((2, 2), -1.0))


def test_decode_accepts_numpy_and_returns_numpy() -> None:
    heatmaps = udp_gaussians(
        torch.tensor([[[20.25, 30.5], [150.75, 200.125]]], dtype=torch.float64)
    )
    expected_kpts, expected_scores = decode_heatmaps(heatmaps)
    keypoints, scores = decode_heatmaps(heatmaps.numpy())
    assert isinstance(keypoints, np.ndarray) and isinstance(scores, np.ndarray)
    assert keypoints.dtype == np.float32 and keypoints.shape == (1, 2, 2)
    np.testing.assert_allclose(keypoints, expected_kpts.numpy(), atol=1e-6)
    np.testing.assert_array_equal(scores, expected_scores.numpy())


def _reference_dark_udp(heatmap: np.ndarray) -> tuple[float, float]:
    """Slow per-map UDP/DARK written from the reference description, for comparison."""
    height, width = heatmap.shape
    y, x = np.unravel_index(np.argmax(heatmap), heatmap.shape)
    offsets = np.arange(11) - 5.0
    taps = np.exp(-(offsets**2) / (2 * 2.0**2))  # OpenCV: sigma 2.0 for ksize 11
    taps /= taps.sum()
    blurred = np.apply_along_axis(np.convolve, 1, heatmap.astype(np.float64), taps, "same")
    blurred = np.apply_along_axis(np.convolve, 0, blurred, taps, "same")
    blurred *= heatmap.max() / blurred.max()
    log_map = np.log(np.clip(blurred, 1e-3, 50.0))

    def at(dy: int, dx: int) -> float:
        return log_map[min(max(y + dy, 0), height - 1), min(max(x + dx, 0), width - 1)]

    grad = np.array([at(0, 1) - at(0, -1), at(1, 0) - at(-1, 0)]) / 2
    dxy = (at(1, 1) - at(0, 1) - at(1, 0) + 2 * at(0, 0) - at(0, -1) - at(-1, 0) + at(-1, -1)) / 2
    hessian = np.array(
        [[at(0, 1) - 2 * at(0, 0) + at(0, -1), dxy], [dxy, at(1, 0) - 2 * at(0, 0) + at(-1, 0)]]
    )
    step = np.linalg.solve(hessian + np.finfo(np.float32).eps * np.eye(2), grad)
    return float(x - step[0]), float(y - step[1])


def test_decode_matches_slow_reference_on_skewed_noisy_blobs() -> None:
    rng = np.random.default_rng(3)
    ys, xs = np.mgrid[0:HM_H, 0:HM_W].astype(np.float64)
    maps = []
    for cx, cy in [(30.4, 40.2), (150.7, 210.9), (2.3, 120.6), (96.1, 253.4)]:
        angle, sx, sy = rng.uniform(0, np.pi), rng.uniform(3, 9), rng.uniform(3, 9)
        u = (xs - cx) * np.cos(angle) + (ys - cy) * np.sin(angle)
        v = -(xs - cx) * np.sin(angle) + (ys - cy) * np.cos(angle)
        blob = 0.8 * np.exp(-(u**2) / (2 * sx**2) - v**2 / (2 * sy**2))
        maps.append(blob + rng.normal(0, 0.01, blob.shape))
    # A faint response whose log map hits the 1e-3 floor right beside its peak.
    maps.append(0.00102 * np.exp(-((xs - 60.3) ** 2 + (ys - 70.8) ** 2) / (2 * 2.0**2)))
    heatmaps = np.stack(maps).astype(np.float32)
    keypoints, _ = decode_heatmaps(heatmaps)
    for k, heatmap in enumerate(heatmaps):
        np.testing.assert_allclose(keypoints[k], _reference_dark_udp(heatmap), atol=1e-3)


def test_flat_or_singular_maps_do_not_give_nan() -> None:
    plateau = np.full((2, HM_H, HM_W), 0.5, dtype=np.float32)
    plateau[1, :, 100:] = 0.7  # a ridge: flat along y
    keypoints, _ = decode_heatmaps(plateau)
    assert np.isfinite(keypoints).all()
    for k in range(2):  # zero padding in the blur still pulls a flat map's peak inwards
        np.testing.assert_allclose(keypoints[k], _reference_dark_udp(plateau[k]), atol=1e-3)

    eps = float(np.finfo(np.float32).eps)
    zero = torch.zeros(1, dtype=torch.float64)
    # H + eps I = [[eps, eps], [eps, eps]] is exactly singular: the step is skipped.
    step_x, step_y = _newton_offset(zero + 1, zero + 1, zero, zero + eps, zero)
    assert step_x.item() == 0.0 and step_y.item() == 0.0


def test_blur_paths_agree() -> None:
    maps = torch.rand(5, 40, 30, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_blur_shifted_sums(maps, 11), _blur_depthwise(maps, 11))


# ----------------------------------------------------------------------------- flip


def test_flip_back_mirrors_width_and_swaps_left_right_channels() -> None:
    heatmaps = torch.zeros(1, 308, HM_H, HM_W)
    heatmaps[0, LEFT_WRIST] = udp_gaussians(torch.tensor([40.3, 70.6], dtype=torch.float64))
    restored = flip_back(heatmaps)
    keypoints, scores = decode_heatmaps(restored)
    assert scores[0, LEFT_WRIST].item() == 0.0
    assert abs(keypoints[0, RIGHT_WRIST, 0].item() - (HM_W - 1 - 40.3)) < 0.01
    assert abs(keypoints[0, RIGHT_WRIST, 1].item() - 70.6) < 0.01
    assert torch.equal(flip_back(restored), heatmaps)
    np.testing.assert_array_equal(flip_back(heatmaps.numpy()), restored.numpy())


def test_flip_back_rejects_wrong_channel_count() -> None:
    with pytest.raises(ValueError, match="308"):
        flip_back(torch.zeros(1, 17, 8, 6))


# ----------------------------------------------------------------------------- crops


def test_make_crop_pads_and_fixes_aspect() -> None:
    wide = make_crop([100.0, 200.0, 300.0, 400.0])  # 250 x 250 after padding
    assert wide.center == (200.0, 300.0)
    assert wide.size == pytest.approx((250.0, 250.0 / 0.75))
    tall = make_crop([0.0, 0.0, 100.0, 400.0])  # 125 x 500 after padding
    assert tall.size == pytest.approx((375.0, 500.0))
    with pytest.raises(ValueError, match="empty"):
        make_crop([10.0, 10.0, 10.0, 50.0])


def test_plate_to_crop_and_back_round_trips() -> None:
    crops = [make_crop([812.4, 133.9, 1420.2, 1901.7]), make_crop([3.0, 5.0, 64.5, 90.25])]
    rng = np.random.default_rng(7)
    points = rng.uniform(-50, 2000, size=(2, 11, 2)).astype(np.float64)
    in_crop = image_to_input(points, crops)
    back = heatmap_to_image(in_crop, crops, heatmap_hw=(IN_H, IN_W), input_hw=(IN_H, IN_W))
    np.testing.assert_allclose(back, points, atol=1e-3)
    back_torch = heatmap_to_image(torch.from_numpy(in_crop), crops, (IN_H, IN_W), (IN_H, IN_W))
    np.testing.assert_allclose(back_torch.numpy(), points, atol=1e-3)


def test_heatmap_corners_map_to_crop_corners() -> None:
    crop = PersonCrop(center=(500.0, 400.0), size=(300.0, 400.0))
    corners = torch.tensor([[[0.0, 0.0], [HM_W - 1.0, HM_H - 1.0]]])
    in_plate = heatmap_to_image(corners, [crop])
    torch.testing.assert_close(in_plate, torch.tensor([[[350.0, 200.0], [650.0, 600.0]]]))


def _bright_dot(height: int, width: int, x: float, y: float, sigma: float) -> torch.Tensor:
    ys = torch.arange(height, dtype=torch.float64)[:, None]
    xs = torch.arange(width, dtype=torch.float64)[None, :]
    dot = torch.exp(-((xs - x) ** 2 + (ys - y) ** 2) / (2 * sigma**2))
    return dot.float().expand(3, -1, -1).clone()


def _centroid(channel: torch.Tensor, threshold: float = 0.0) -> tuple[float, float]:
    weights = (channel.double() - threshold).clamp(min=0)
    ys, xs = torch.meshgrid(
        torch.arange(channel.shape[0], dtype=torch.float64),
        torch.arange(channel.shape[1], dtype=torch.float64),
        indexing="ij",
    )
    total = weights.sum()
    return float((weights * xs).sum() / total), float((weights * ys).sum() / total)


@pytest.mark.parametrize(
    ("plate_hw", "dot", "sigma", "box"),
    [
        ((480, 640), (301.3, 207.6), 2.0, (250.0, 150.0, 350.0, 300.0)),  # enlarged: bicubic
        ((1400, 1000), (480.7, 700.2), 6.0, (100.0, 20.0, 900.0, 1380.0)),  # shrunk: bilinear
    ],
)
def test_crop_puts_a_bright_dot_where_the_transform_says(
    plate_hw: tuple[int, int], dot: tuple[float, float], sigma: float, box: tuple[float, ...]
) -> None:
    image = _bright_dot(*plate_hw, *dot, sigma)
    crop = make_crop(box)
    pixels = crop_people(image, [crop])
    assert pixels.shape == (1, 3, IN_H, IN_W)
    expected = image_to_input(np.array([[dot]]), [crop])[0, 0]
    found = _centroid(pixels[0, 0], threshold=0.05)
    np.testing.assert_allclose(found, expected, atol=0.05)


def test_crop_interpolation_follows_the_scale() -> None:
    """Enlarging crops use bicubic (a = -0.75), shrinking ones bilinear, as upstream."""
    image = torch.zeros(3, 400, 400)
    image[:, 200, 200] = 1.0
    # x4 enlargement with crop pixel (400, 400) on plate (200, 200): u = 401 is x = 200.25.
    enlarged = crop_people(image, [PersonCrop(center=(195.875, 227.875), size=(191.75, 255.75))])
    cubic_at_quarter = 1.25 * 0.25**3 - 2.25 * 0.25**2 + 1
    assert enlarged[0, 0, 400, 400].item() == pytest.approx(1.0, abs=1e-5)
    assert enlarged[0, 0, 400, 401].item() == pytest.approx(cubic_at_quarter, abs=1e-4)
    # x0.5 shrink with crop pixel (100, 100) on plate (199.5, 200): halfway, bilinear 0.5.
    shrunk = crop_people(image, [PersonCrop(center=(766.5, 1023.0), size=(1534.0, 2046.0))])
    assert shrunk[0, 0, 100, 100].item() == pytest.approx(0.5, abs=1e-4)


def test_crop_outside_the_plate_is_black() -> None:
    image = torch.ones(3, 300, 400)
    crop = make_crop([-200.0, 50.0, 200.0, 250.0])  # left part hangs off the plate
    pixels = crop_people(image, [crop, crop])
    assert pixels.shape == (2, 3, IN_H, IN_W)
    plate_x = heatmap_to_image(
        torch.tensor([[[float(u), 0.0] for u in range(IN_W)]]), [crop], (IN_H, IN_W), (IN_H, IN_W)
    )[0, :, 0]
    row = pixels[0, :, IN_H // 2]  # a row inside the plate vertically
    assert (row[:, plate_x < -1.0] == 0).all()
    # Bicubic taps reach 2 plate pixels: beyond that the white plate comes through whole.
    torch.testing.assert_close(row[:, plate_x > 2.0], torch.ones_like(row[:, plate_x > 2.0]))
    assert (row[:, plate_x > 0.0] > 0.4).all()
    assert crop_people(image, []).shape == (0, 3, IN_H, IN_W)


# ----------------------------------------------------------------------------- pipeline


class MirrorAwareModel:
    """A stand-in pose network that is exactly mirror-equivariant, as a trained one should be.

    It finds the two bright dots in each crop and calls the one further right (in the crop)
    the left wrist, as for a person facing the camera; the other is the right wrist.
    """

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def __call__(self, crops: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(crops.shape[0])
        heatmaps = torch.zeros(crops.shape[0], 308, HM_H, HM_W)
        scale = torch.tensor([(HM_W - 1) / (IN_W - 1), (HM_H - 1) / (IN_H - 1)])
        for i, crop in enumerate(crops):
            bright = crop[0] > 0.3
            cols = bright.nonzero()[:, 1].double()
            split = int((cols.min() + cols.max()) / 2)
            for channel, side in ((RIGHT_WRIST, slice(0, split)), (LEFT_WRIST, slice(split, None))):
                half = torch.zeros_like(crop[0])
                half[:, side] = crop[0, :, side]
                x, y = _centroid(half, threshold=0.3)
                centre = (torch.tensor([x, y]) * scale).double()
                heatmaps[i, channel] = udp_gaussians(centre)
        return heatmaps


def _two_dot_plate() -> tuple[torch.Tensor, tuple[float, float], tuple[float, float]]:
    on_image_left, on_image_right = (250.4, 310.7), (381.6, 262.3)
    image = _bright_dot(600, 800, *on_image_left, 3.0) + _bright_dot(600, 800, *on_image_right, 3.0)
    return image.clamp(0, 1), on_image_left, on_image_right


@pytest.mark.parametrize("flip_test", [True, False])
def test_estimate_pose_maps_wrists_back_to_the_plate(flip_test: bool) -> None:
    image, on_image_left, on_image_right = _two_dot_plate()
    model = MirrorAwareModel()
    boxes = np.array([[200.0, 150.0, 430.0, 450.0]])
    result = estimate_pose(model, image, boxes, flip_test=flip_test)

    assert result.keypoints.shape == (1, 308, 2) and result.scores.shape == (1, 308)
    np.testing.assert_array_equal(result.boxes, boxes.astype(np.float32))
    np.testing.assert_allclose(result.keypoints[0, LEFT_WRIST], on_image_right, atol=0.1)
    np.testing.assert_allclose(result.keypoints[0, RIGHT_WRIST], on_image_left, atol=0.1)
    assert result.scores[0, LEFT_WRIST] > 0.9 and result.scores[0, RIGHT_WRIST] > 0.9
    assert model.batch_sizes == ([2] if flip_test else [1])


def test_estimate_pose_batches_people_and_handles_no_boxes() -> None:
    image, *_ = _two_dot_plate()
    model = MirrorAwareModel()
    boxes = [[200.0, 150.0, 430.0, 450.0], [190.0, 140.0, 440.0, 460.0], [210, 160, 420, 440]]
    result = estimate_pose(model, image, boxes, flip_test=True, batch_size=4)
    assert model.batch_sizes == [4, 2]  # two people and their mirrors, then one and its mirror
    assert result.keypoints.shape == (3, 308, 2)
    spread = np.ptp(result.keypoints[:, LEFT_WRIST], axis=0)
    assert (spread < 0.2).all()  # every crop of the same person agrees

    empty_model = MirrorAwareModel()
    empty = estimate_pose(empty_model, image, np.zeros((0, 4)))
    assert empty.keypoints.shape == (0, 308, 2) and empty.scores.shape == (0, 308)
    assert empty.boxes.shape == (0, 4)
    assert empty_model.batch_sizes == []


def test_estimate_pose_rejects_wrong_heatmaps() -> None:
    image, *_ = _two_dot_plate()
    with pytest.raises(ValueError, match="308"):
        estimate_pose(lambda c: torch.zeros(c.shape[0], 17, 64, 48), image, [[200, 150, 430, 450]])


def test_flip_indices_drive_flip_back() -> None:
    heatmaps = torch.arange(308.0).view(1, 308, 1, 1).expand(1, 308, 2, 2)
    restored = flip_back(heatmaps)
    assert restored[0, :, 0, 0].tolist() == [float(i) for i in FLIP_INDICES]
