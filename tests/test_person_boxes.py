"""Person boxes from a foreground mask."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.person_boxes import boxes_from_mask


def _two_people_and_a_speck() -> np.ndarray:
    alpha = np.zeros((400, 600), dtype=np.float32)
    alpha[50:350, 60:160] = 0.9  # person A: rows 50..349, cols 60..159 (30000 px)
    alpha[100:300, 400:520] = 0.8  # person B: rows 100..299, cols 400..519 (24000 px)
    alpha[10:13, 300:303] = 1.0  # speck: 9 px, below 0.2 % of 240000 px
    return alpha


def test_two_separated_people_are_found_and_the_speck_ignored() -> None:
    boxes = boxes_from_mask(_two_people_and_a_speck())
    assert boxes.dtype == np.float32 and boxes.shape == (2, 4)
    # Largest first; edges lie on pixel borders (pixel centres are integers).
    np.testing.assert_array_equal(boxes[0], [59.5, 49.5, 159.5, 349.5])
    np.testing.assert_array_equal(boxes[1], [399.5, 99.5, 519.5, 299.5])


def test_soft_mask_is_thresholded_at_one_half() -> None:
    alpha = _two_people_and_a_speck()
    alpha[100:300, 400:520] = 0.49  # person B now below threshold
    boxes = boxes_from_mask(alpha)
    assert boxes.shape == (1, 4)
    np.testing.assert_array_equal(boxes[0], [59.5, 49.5, 159.5, 349.5])
    assert boxes_from_mask(alpha > 0.3).shape == (2, 4)  # boolean masks are used as given


def test_diagonal_contact_joins_and_limits_apply() -> None:
    mask = np.zeros((100, 100), dtype=bool)
    mask[10:30, 10:30] = True
    mask[30:50, 30:50] = True  # touches the first block only at a corner
    mask[60:80, 60:80] = True  # 400 px, smaller than the joined pair (800 px)
    boxes = boxes_from_mask(mask, min_area_fraction=0.0)
    np.testing.assert_array_equal(boxes[0], [9.5, 9.5, 49.5, 49.5])
    assert boxes.shape == (2, 4)
    assert boxes_from_mask(mask, max_people=1).shape == (1, 4)
    assert boxes_from_mask(np.zeros((20, 30))).shape == (0, 4)
    assert boxes_from_mask(np.full((20, 30), np.nan)).shape == (0, 4)


def test_bad_mask_shape_is_reported() -> None:
    with pytest.raises(ValueError, match="2-D"):
        boxes_from_mask(np.zeros((3, 20, 30)))
