"""Top-down pose maths for the Sapiens2 308-keypoint model (and Sapiens v1's 17, 133 and
308-keypoint models: same crop, UDP codec, DARK decoding and flip test; pass `num_keypoints`).

Crops people out of a plate with the UDP affine warp, decodes heatmaps with UDP + DARK
refinement (vectorised over people and keypoints), applies the flip test and maps keypoints
back to plate pixels. Follows upstream `facebookresearch/sapiens2` (the revision
docs/design/upstream-sources.md names): `PoseGetBBoxCenterScale` / `PoseTopdownAffine` for
the crop, `UDPHeatmap.decode` with `refine_keypoints_dark_udp` for decoding, and
`vis_pose.py` for flip test and mapping back.

Coordinates: pixel (row i, column j) has its centre at (x=j, y=i), as in OpenCV.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from sapiens.keypoints import FLIP_INDICES, KEYPOINT_NAMES, flip_indices_for

INPUT_HW = (1024, 768)
HEATMAP_HW = (256, 192)
BOX_PADDING = 1.25
DARK_BLUR_KERNEL = 11
# Upstream regularises the 2x2 Hessian with float32 machine epsilon on the diagonal.
_HESSIAN_EPS = float(np.finfo(np.float32).eps)

ArrayLike = torch.Tensor | np.ndarray


# ----------------------------------------------------------------------------- decoding


def _opencv_gaussian_kernel(ksize: int) -> torch.Tensor:
    """1-D Gaussian taps as `cv2.getGaussianKernel(ksize, sigma=0)` builds them (ksize > 7).

    With sigma <= 0 OpenCV derives sigma = 0.3 * ((ksize - 1) / 2 - 1) + 0.8 (2.0 for 11).
    """
    if ksize % 2 != 1 or ksize <= 7:
        raise ValueError(f"blur kernel size must be odd and > 7, got {ksize}")
    sigma = 0.3 * ((ksize - 1) * 0.5 - 1) + 0.8
    offsets = torch.arange(ksize, dtype=torch.float64) - (ksize - 1) / 2
    taps = torch.exp(-(offsets**2) / (2 * sigma**2))
    return (taps / taps.sum()).to(torch.float32)


def _blur_zero_padded(maps: torch.Tensor, ksize: int) -> torch.Tensor:
    """Separable Gaussian blur of (M, h, w) maps with zeros outside each map.

    Equals upstream's blur of a zero-padded copy: with a border of ksize // 2 zeros the
    OpenCV border mode never reaches the cropped region. On CPU a depthwise convolution is
    fastest; elsewhere shifted sums keep exact float32 (cuDNN may run convolutions in TF32,
    whose 1e-3 error would move DARK offsets by hundredths of a pixel).
    """
    if maps.device.type == "cpu":
        return _blur_depthwise(maps, ksize)
    return _blur_shifted_sums(maps, ksize)


def _blur_depthwise(maps: torch.Tensor, ksize: int) -> torch.Tensor:
    taps = _opencv_gaussian_kernel(ksize).to(maps.device)
    radius, count = ksize // 2, maps.shape[0]
    column = taps.view(1, 1, ksize, 1).expand(count, 1, ksize, 1)
    row = taps.view(1, 1, 1, ksize).expand(count, 1, 1, ksize)
    x = F.conv2d(maps.unsqueeze(0), column, padding=(radius, 0), groups=count)
    return F.conv2d(x, row, padding=(0, radius), groups=count).squeeze(0)


def _blur_shifted_sums(maps: torch.Tensor, ksize: int) -> torch.Tensor:
    taps = _opencv_gaussian_kernel(ksize).to(maps.device)
    radius = ksize // 2
    height, width = maps.shape[-2:]
    padded = F.pad(maps, (radius, radius))
    rows = sum(taps[k] * padded[..., k : k + width] for k in range(ksize))
    padded = F.pad(rows, (0, 0, radius, radius))
    return sum(taps[k] * padded[..., k : k + height, :] for k in range(ksize))


def _newton_offset(
    dx: torch.Tensor,
    dy: torch.Tensor,
    dxx: torch.Tensor,
    dxy: torch.Tensor,
    dyy: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Newton step H^-1 grad with H = [[dxx, dxy], [dxy, dyy]] + eps I, in float64.

    Where H is singular (or anything is not finite) the step is zero: that keypoint keeps
    its integer peak instead of becoming NaN (upstream would raise LinAlgError).
    """
    dx, dy, dxy = dx.double(), dy.double(), dxy.double()
    a = dxx.double() + _HESSIAN_EPS
    d = dyy.double() + _HESSIAN_EPS
    det = a * d - dxy * dxy
    safe_det = torch.where(det == 0, torch.ones_like(det), det)
    step_x = (d * dx - dxy * dy) / safe_det
    step_y = (a * dy - dxy * dx) / safe_det
    usable = (det != 0) & torch.isfinite(step_x) & torch.isfinite(step_y)
    zero = torch.zeros_like(step_x)
    return torch.where(usable, step_x, zero), torch.where(usable, step_y, zero)


def decode_heatmaps(
    heatmaps: ArrayLike, blur_kernel_size: int = DARK_BLUR_KERNEL
) -> tuple[ArrayLike, ArrayLike]:
    """UDP heatmaps -> (keypoints [x, y] in heatmap pixels, scores), with DARK refinement.

    `heatmaps` is (B, K, h, w) or (K, h, w), a torch tensor or a numpy array; the results are
    (B, K, 2) and (B, K) float32 of the same kind (no batch axis if the input had none).
    The score is the raw heatmap maximum; keypoints whose score is <= 0 are (-1, -1) and
    are not refined (upstream refines them from garbage indices).

    DARK as upstream: blur each map (kernel 11) with zeros outside it and rescale it to its
    original maximum, clip to [1e-3, 50], take the log, then one Newton step from the
    integer peak using central differences with edge padding.
    """
    as_numpy = isinstance(heatmaps, np.ndarray)
    maps = torch.from_numpy(np.ascontiguousarray(heatmaps)) if as_numpy else heatmaps
    if maps.ndim not in (3, 4):
        raise ValueError(f"heatmaps must be (B, K, h, w) or (K, h, w), got {tuple(maps.shape)}")
    unbatched = maps.ndim == 3
    if unbatched:
        maps = maps.unsqueeze(0)
    maps = maps.detach().float()
    batch, num_kpts, height, width = maps.shape
    if height == 0 or width == 0:
        raise ValueError(f"heatmaps have no pixels: {tuple(maps.shape)}")

    flat = maps.reshape(batch, num_kpts, height * width)
    peak = flat.argmax(dim=-1)  # first maximum in raster order, as numpy's argmax
    scores = flat.gather(-1, peak.unsqueeze(-1)).squeeze(-1)
    peak_x, peak_y = peak % width, torch.div(peak, width, rounding_mode="floor")
    valid = scores > 0

    keypoints = _refine_dark_udp(maps, scores, peak_x, peak_y, valid, blur_kernel_size)
    keypoints = torch.where(valid.unsqueeze(-1), keypoints, torch.full_like(keypoints, -1.0))

    if unbatched:
        keypoints, scores = keypoints[0], scores[0]
    if as_numpy:
        return keypoints.cpu().numpy(), scores.cpu().numpy()
    return keypoints, scores


def _refine_dark_udp(
    maps: torch.Tensor,
    scores: torch.Tensor,
    peak_x: torch.Tensor,
    peak_y: torch.Tensor,
    valid: torch.Tensor,
    blur_kernel_size: int,
) -> torch.Tensor:
    batch, num_kpts, height, width = maps.shape
    blurred = _blur_zero_padded(maps.reshape(-1, height, width), blur_kernel_size)
    blurred = blurred.reshape(batch, num_kpts, height * width)
    # Rescale to the original maximum; an all-zero blur gets factor 0 (flat log map, no step).
    blurred_max = blurred.amax(dim=-1, keepdim=True)
    original_max = scores.unsqueeze(-1)
    factor = torch.where(
        blurred_max != 0, original_max / blurred_max, torch.zeros_like(blurred_max)
    )

    # The 3x3 neighbourhood of each integer peak, indices clamped = edge padding.
    steps = torch.tensor([-1, 0, 1], device=maps.device)
    rows = (peak_y.unsqueeze(-1) + steps).clamp(0, height - 1)  # (B, K, 3)
    cols = (peak_x.unsqueeze(-1) + steps).clamp(0, width - 1)
    linear = rows.unsqueeze(-1) * width + cols.unsqueeze(-2)  # (B, K, 3, 3)
    patch = blurred.gather(-1, linear.reshape(batch, num_kpts, 9)).reshape(batch, num_kpts, 3, 3)
    log_patch = torch.log((patch * factor.unsqueeze(-1)).clamp(1e-3, 50.0))

    def at(dy: int, dx: int) -> torch.Tensor:
        return log_patch[..., dy + 1, dx + 1]

    centre = at(0, 0)
    dx = 0.5 * (at(0, 1) - at(0, -1))
    dy = 0.5 * (at(1, 0) - at(-1, 0))
    dxx = at(0, 1) - 2 * centre + at(0, -1)
    dyy = at(1, 0) - 2 * centre + at(-1, 0)
    dxy = 0.5 * (at(1, 1) - at(0, 1) - at(1, 0) + 2 * centre - at(0, -1) - at(-1, 0) + at(-1, -1))
    step_x, step_y = _newton_offset(dx, dy, dxx, dxy, dyy)
    step_x = torch.where(valid, step_x, torch.zeros_like(step_x))
    step_y = torch.where(valid, step_y, torch.zeros_like(step_y))
    x = peak_x.double() - step_x
    y = peak_y.double() - step_y
    return torch.stack([x, y], dim=-1).float()


def flip_back(
    heatmaps_of_flipped_input: ArrayLike, flip_indices: Sequence[int] = FLIP_INDICES
) -> ArrayLike:
    """Heatmaps predicted on a mirrored crop -> heatmaps for the unmirrored crop.

    Flips along width and takes each channel from its left/right mirror (`flip_indices`:
    the 308-point set's by default; `keypoints.flip_indices_for(17 or 133)` for v1's others).
    No 1-pixel shift: with UDP the mirror of column j is exactly column w - 1 - j.
    Works on (..., K, h, w) torch tensors or numpy arrays.
    """
    maps = heatmaps_of_flipped_input
    count = len(flip_indices)
    if maps.ndim < 3 or maps.shape[-3] != count:
        raise ValueError(f"flip_back needs (..., {count}, h, w) heatmaps, got {tuple(maps.shape)}")
    if isinstance(maps, np.ndarray):
        return np.ascontiguousarray(maps[..., list(flip_indices), :, :][..., ::-1])
    index = torch.tensor(flip_indices, device=maps.device)
    return maps.index_select(-3, index).flip(-1)


# ----------------------------------------------------------------------------- crops


@dataclass(frozen=True)
class PersonCrop:
    """Where one person's crop sits on the plate, in plate pixels.

    `size` is the padded (x1.25) and aspect-fixed (w/h = model input aspect) box: the
    region that the UDP warp stretches onto the whole model input.
    """

    center: tuple[float, float]
    size: tuple[float, float]


def make_crop(
    box_xyxy: Sequence[float] | np.ndarray,
    input_hw: tuple[int, int] = INPUT_HW,
    padding: float = BOX_PADDING,
) -> PersonCrop:
    """A person box (x1, y1, x2, y2) -> its crop: centre, size x padding, short side enlarged."""
    x1, y1, x2, y2 = (float(v) for v in np.asarray(box_xyxy, dtype=np.float64).reshape(4))
    width, height = (x2 - x1) * padding, (y2 - y1) * padding
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)) or width <= 0 or height <= 0:
        raise ValueError(f"person box {[x1, y1, x2, y2]} is empty or not finite")
    aspect = input_hw[1] / input_hw[0]
    if width > height * aspect:
        height = width / aspect
    else:
        width = height * aspect
    return PersonCrop(center=((x1 + x2) / 2, (y1 + y2) / 2), size=(width, height))


def _crop_params(crops: Sequence[PersonCrop], device: torch.device | str) -> torch.Tensor:
    """(N, 4) float64 tensor of (cx, cy, w, h)."""
    values = [(*c.center, *c.size) for c in crops]
    return torch.tensor(values, dtype=torch.float64, device=device).reshape(-1, 4)


def image_to_input(
    points_xy: ArrayLike, crops: Sequence[PersonCrop], input_hw: tuple[int, int] = INPUT_HW
) -> ArrayLike:
    """Plate pixels (N, K, 2) -> crop-input pixels, the forward UDP warp of each crop.

    u = (x - cx + w/2) (W_in - 1) / w and v likewise, w and h being the crop size.
    """
    return _map_points(points_xy, crops, input_hw, forward=True)


def heatmap_to_image(
    keypoints_hm: ArrayLike,
    crops: Sequence[PersonCrop],
    heatmap_hw: tuple[int, int] = HEATMAP_HW,
    input_hw: tuple[int, int] = INPUT_HW,
) -> ArrayLike:
    """Heatmap pixels (N, K, 2) -> plate pixels: the exact inverse of the UDP warp.

    x_in = x_hm (W_in - 1) / (W_hm - 1) (UDP scaling), then x_img = x_in w / (W_in - 1) +
    cx - w / 2; together x_img = x_hm w / (W_hm - 1) + cx - w / 2, as upstream.
    """
    h_in, w_in = input_hw
    h_hm, w_hm = heatmap_hw
    scale = torch.tensor([(w_in - 1) / (w_hm - 1), (h_in - 1) / (h_hm - 1)], dtype=torch.float64)
    as_numpy = isinstance(keypoints_hm, np.ndarray)
    points = torch.from_numpy(keypoints_hm) if as_numpy else keypoints_hm
    in_input = points.double() * scale.to(points.device)
    out = _map_points(in_input, crops, input_hw, forward=False).to(points.dtype)
    return out.cpu().numpy() if as_numpy else out


def _map_points(
    points_xy: ArrayLike, crops: Sequence[PersonCrop], input_hw: tuple[int, int], forward: bool
) -> ArrayLike:
    as_numpy = isinstance(points_xy, np.ndarray)
    points = torch.from_numpy(points_xy) if as_numpy else points_xy
    if points.ndim != 3 or points.shape[0] != len(crops) or points.shape[-1] != 2:
        raise ValueError(
            f"points must be (N, K, 2) with N = {len(crops)} crops, got {tuple(points.shape)}"
        )
    params = _crop_params(crops, points.device)
    center, size = params[:, None, :2], params[:, None, 2:]
    h_in, w_in = input_hw
    span = torch.tensor([w_in - 1, h_in - 1], dtype=torch.float64, device=points.device)
    if forward:
        out = (points.double() - center + size / 2) * (span / size)
    else:
        out = points.double() * (size / span) + center - size / 2
    out = out.to(points.dtype if points.is_floating_point() else torch.float64)
    return out.cpu().numpy() if as_numpy else out


def crop_people(
    image: torch.Tensor, crops: Sequence[PersonCrop], input_hw: tuple[int, int] = INPUT_HW
) -> torch.Tensor:
    """Cut each crop out of a (3, H, W) image in [0, 1] -> (N, 3, H_in, W_in).

    The UDP warp of upstream's `PoseTopdownAffine`, done with `grid_sample` on the image's
    device: bilinear where the crop shrinks the plate, bicubic (a = -0.75, as OpenCV) where
    it enlarges it, black outside the plate. Where it differs from `cv2.warpAffine`:
    OpenCV snaps sample positions to 1/32 pixel and, on uint8 plates, uses fixed-point
    weights and rounds to 8 bits; we sample at exact positions in float. Bicubic overshoot is
    clamped to [0, 1], as OpenCV's uint8 saturation does. Like upstream, there is no
    antialiasing when shrinking (OpenCV's INTER_AREA acts as bilinear in warpAffine).
    """
    if image.ndim != 3 or image.shape[0] != 3 or min(image.shape[1:]) < 2:
        raise ValueError(f"image must be (3, H, W) with H, W >= 2, got {tuple(image.shape)}")
    if not image.is_floating_point():
        raise ValueError(f"image must be float in [0, 1], got {image.dtype}")
    h_in, w_in = input_hw
    dtype = image.dtype
    out = torch.zeros((len(crops), 3, h_in, w_in), dtype=dtype, device=image.device)
    if not crops:
        return out
    height, width = image.shape[1:]
    params = _crop_params(crops, image.device)
    cx, cy, crop_w, crop_h = params.unbind(-1)
    cols = torch.arange(w_in, dtype=torch.float64, device=image.device)
    rows = torch.arange(h_in, dtype=torch.float64, device=image.device)
    # Inverse warp: crop pixel (u, v) samples the plate at x = u w / (W_in - 1) + cx - w / 2.
    src_x = cols * (crop_w / (w_in - 1))[:, None] + (cx - crop_w / 2)[:, None]  # (N, W_in)
    src_y = rows * (crop_h / (h_in - 1))[:, None] + (cy - crop_h / 2)[:, None]  # (N, H_in)
    # align_corners=True: -1 and +1 are the centres of the first and last plate pixels.
    grid_x = (src_x * (2 / (width - 1)) - 1).to(torch.float32)
    grid_y = (src_y * (2 / (height - 1)) - 1).to(torch.float32)
    grid = torch.stack(
        [grid_x[:, None, :].expand(-1, h_in, -1), grid_y[:, :, None].expand(-1, -1, w_in)],
        dim=-1,
    )
    upscale = torch.minimum((w_in - 1) / crop_w, (h_in - 1) / crop_h) >= 1.0
    source = image.to(dtype).unsqueeze(0)
    for mode, chosen in (("bilinear", ~upscale), ("bicubic", upscale)):
        index = chosen.nonzero().squeeze(-1)
        if index.numel() == 0:
            continue
        sampled = F.grid_sample(
            source.expand(index.numel(), -1, -1, -1),
            grid.index_select(0, index).to(dtype),
            mode=mode,
            padding_mode="zeros",
            align_corners=True,
        )
        if mode == "bicubic":
            sampled = sampled.clamp(0.0, 1.0)
        out[index] = sampled
    return out


# ----------------------------------------------------------------------------- pipeline


@dataclass
class PoseResult:
    """Per person: keypoints (N, K, 2) [x, y] plate pixels, scores (N, K), boxes (N, 4);
    K = 308 (17 or 133 for those v1 models).

    Keypoints whose score is <= 0 carry no position (their heatmap had no positive value).
    """

    keypoints: np.ndarray
    scores: np.ndarray
    boxes: np.ndarray


ModelFn = Callable[[torch.Tensor], torch.Tensor]


def estimate_pose(
    model_fn: ModelFn,
    image: torch.Tensor,
    boxes_xyxy: Sequence[Sequence[float]] | np.ndarray | torch.Tensor,
    flip_test: bool = True,
    batch_size: int = 8,
    input_hw: tuple[int, int] = INPUT_HW,
    num_keypoints: int = len(KEYPOINT_NAMES),
) -> PoseResult:
    """Top-down pose of every boxed person in a (3, H, W) [0, 1] RGB plate.

    `model_fn(crops)` takes (n, 3, H_in, W_in) crops in [0, 1] RGB pixel space (it applies
    normalization and the network) and returns (n, K, h, w) heatmaps, K = `num_keypoints`
    (308; v1 also 17 or 133). Each call gets at most `batch_size` crops; with `flip_test` a
    call holds people and their mirrored crops, and the two heatmaps are averaged after
    `flip_back`, as upstream. No boxes, no people: empty arrays come back (upstream would fall
    back to the whole frame).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    boxes = torch.as_tensor(boxes_xyxy, dtype=torch.float64).cpu().numpy().reshape(-1, 4)
    num_kpts = num_keypoints
    flip_indices = flip_indices_for(num_kpts)
    keypoints = np.zeros((len(boxes), num_kpts, 2), dtype=np.float32)
    scores = np.zeros((len(boxes), num_kpts), dtype=np.float32)
    crops = [make_crop(box, input_hw) for box in boxes]
    people_per_call = max(1, batch_size // 2) if flip_test else batch_size

    with torch.inference_mode():
        for start in range(0, len(crops), people_per_call):
            chunk = crops[start : start + people_per_call]
            pixels = crop_people(image, chunk, input_hw)
            batch = torch.cat([pixels, pixels.flip(-1)]) if flip_test else pixels
            heatmaps = _checked_heatmaps(model_fn(batch), len(batch), num_kpts)
            if flip_test:
                heatmaps = 0.5 * (
                    heatmaps[: len(chunk)] + flip_back(heatmaps[len(chunk) :], flip_indices)
                )
            kpts_hm, kpt_scores = decode_heatmaps(heatmaps)
            in_plate = heatmap_to_image(kpts_hm, chunk, tuple(heatmaps.shape[-2:]), input_hw)
            stop = start + len(chunk)
            keypoints[start:stop] = in_plate.float().cpu().numpy()
            scores[start:stop] = kpt_scores.cpu().numpy()
    return PoseResult(keypoints=keypoints, scores=scores, boxes=boxes.astype(np.float32))


def _checked_heatmaps(heatmaps: torch.Tensor, batch: int, num_kpts: int) -> torch.Tensor:
    if not isinstance(heatmaps, torch.Tensor) or heatmaps.ndim != 4:
        got = tuple(heatmaps.shape) if isinstance(heatmaps, torch.Tensor) else type(heatmaps)
        raise ValueError(f"pose model must return (N, {num_kpts}, h, w) heatmaps, got {got}")
    if heatmaps.shape[0] != batch or heatmaps.shape[1] != num_kpts:
        raise ValueError(
            f"pose model returned heatmaps {tuple(heatmaps.shape)} for {batch} crops;"
            f" expected ({batch}, {num_kpts}, h, w)"
        )
    return heatmaps.float()
