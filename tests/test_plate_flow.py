"""Motion from the plate: DIS flow recovers a known shift, confidence falls where a pixel is
hidden in the other frame, a cut is told apart from motion, vectors scale to plate pixels."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from tasks.plate_flow import (
    FlowSettings,
    can_flow,
    finest_scale,
    flow_image,
    pair_motion,
    to_plate,
)


def _texture(h: int, w: int, seed: int, blur: float = 2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = cv2.GaussianBlur(rng.random((h, w, 3)).astype(np.float32), (0, 0), blur)
    return (image - image.min()) / (image.max() - image.min())


def test_a_known_shift_is_recovered_at_plate_scale():
    plate = _texture(360, 640, 0)
    moved = np.roll(plate, (3, 6), axis=(0, 1))  # content moves 6 px right, 3 px down
    settings = FlowSettings(max_side=320)  # half size: vectors come back in flow pixels
    motion = pair_motion(flow_image(plate, settings), flow_image(moved, settings), settings)
    assert not motion.cut
    inner = (slice(20, -20), slice(20, -20))
    assert np.median(motion.forward[inner], axis=(0, 1)) == pytest.approx([3.0, 1.5], abs=0.1)
    assert np.median(motion.backward[inner], axis=(0, 1)) == pytest.approx([-3.0, -1.5], abs=0.1)
    vectors = to_plate(motion.forward, (360, 640), "cpu").numpy()
    assert vectors.shape == (360, 640, 2)
    assert np.median(vectors[40:-40, 40:-40], axis=(0, 1)) == pytest.approx([6.0, 3.0], abs=0.2)
    assert np.median(motion.confidence_a[inner]) > 0.8


def test_a_small_plate_is_estimated_at_its_own_size_not_half_of_it():
    # a 16-pixel object moving 3 px on a still background, in a 192x108 plate: DIS's medium
    # preset alone stops at half the image (96x54), where the object is 8 pixels and its motion
    # is smeared into the background's (measured: 2.1 px of the 3); at the plate's own size it
    # comes back
    background, thing = _texture(108, 192, 0, 1.5), _texture(16, 16, 1, 1.0)

    def frame(x: int) -> np.ndarray:
        out = background.copy()
        out[46:62, x : x + 16] = thing
        return out

    inside = (slice(49, 59), slice(83, 93))  # the object's middle, where it is in frame b
    for finest_side, low, high in ((512, 2.9, 3.1), (None, 1.5, 2.5)):
        settings = FlowSettings(finest_side=finest_side)
        a, b = flow_image(frame(80), settings), flow_image(frame(83), settings)
        motion = pair_motion(a, b, settings)
        assert low < np.median(motion.forward[inside][..., 0]) < high, finest_side
    # the level: the preset's where that is still 512 pixels long, finer below
    assert finest_scale((540, 1024), 1, 512) == 1 and finest_scale((576, 1000), 1, 512) == 0
    assert finest_scale((108, 192), 2, 512) == 0 and finest_scale((2160, 4096), 1, 512) == 1
    assert finest_scale((108, 192), 1, None) == 1


def test_confidence_falls_where_a_pixel_is_hidden_in_the_other_frame():
    background = _texture(240, 320, 1)
    square = _texture(60, 60, 2, blur=1.0)
    a = background.copy()
    a[90:150, 100:160] = square
    b = background.copy()
    b[90:150, 130:190] = square  # the square moved 30 px right over a static background
    motion = pair_motion(flow_image(a), flow_image(b))
    assert not motion.cut
    # background in a at columns 160..190 is covered by the square in b: its round trip fails
    hidden = motion.confidence_a[100:140, 165:185]
    seen = motion.confidence_a[20:60, 20:300]
    assert hidden.mean() < 0.5 < seen.mean()


def test_a_cut_is_not_motion():
    a = _texture(180, 320, 3)
    other_shot = 0.2 + 0.3 * _texture(180, 320, 4, blur=12.0)
    motion = pair_motion(flow_image(a), flow_image(other_shot))
    assert motion.cut
    assert not motion.confidence_a.any() and not motion.forward.any()
    same_shot = pair_motion(flow_image(a), flow_image(np.roll(a, 2, axis=1)))
    assert not same_shot.cut


def test_images_too_small_for_flow_are_refused_not_crashed_on():
    # DIS segfaults on some sizes under 16 pixels a side (15x200 did): refused before it runs
    small = (np.random.default_rng(0).random((15, 200)) * 255).astype(np.uint8)
    with pytest.raises(ValueError, match="200x15 pixels"):
        pair_motion(small, small)
    assert not can_flow(small) and can_flow(np.zeros((16, 200), np.uint8))
