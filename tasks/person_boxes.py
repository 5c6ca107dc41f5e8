"""Person boxes for top-down pose, from a foreground mask instead of a detector.

The mask is the segmentation's non-background probability or the matte's alpha. Each
8-connected foreground region becomes one person box. Known limits: people who touch or
overlap share one region (one box), and a person cut in two by an occluder gives two boxes.
"""

from __future__ import annotations

import numpy as np

DEFAULT_MAX_PEOPLE = 20
_EIGHT_CONNECTED = np.ones((3, 3), dtype=bool)


def boxes_from_mask(
    mask: np.ndarray,
    min_area_fraction: float = 0.002,
    max_people: int = DEFAULT_MAX_PEOPLE,
    threshold: float = 0.5,
) -> np.ndarray:
    """Foreground mask (H, W) -> person boxes (N, 4) float32 [x1, y1, x2, y2], largest first.

    A boolean mask is used as is; a numeric one (probability or alpha) is foreground where
    it is >= `threshold` (NaN is background). Regions with fewer pixels than
    `min_area_fraction` of the frame are dropped as specks; at most `max_people` boxes are
    kept, ordered by region pixel count, descending.

    Boxes follow the pixel-centre convention of `sapiens.pose` (pixel column j has its
    centre at x = j), so they run along pixel edges: a region over columns a..b gives
    x1 = a - 0.5 and x2 = b + 0.5.
    """
    values = np.asarray(mask)
    if values.ndim != 2:
        raise ValueError(f"foreground mask must be 2-D (H, W), got shape {values.shape}")
    if not 0 <= min_area_fraction < 1:
        raise ValueError(f"min_area_fraction must be in [0, 1), got {min_area_fraction}")
    if max_people < 0:
        raise ValueError(f"max_people must be >= 0, got {max_people}")
    foreground = values if values.dtype == bool else values >= threshold

    # scipy on the first pose frame only: a worker without pose (and the GPU kit) never
    # imports it
    from scipy import ndimage

    labels, count = ndimage.label(foreground, structure=_EIGHT_CONNECTED)
    if count == 0 or max_people == 0:
        return np.zeros((0, 4), dtype=np.float32)
    areas = np.bincount(labels.ravel(), minlength=count + 1)[1:]
    min_area = max(1.0, min_area_fraction * values.shape[0] * values.shape[1])
    kept = [label for label in np.argsort(-areas, kind="stable") if areas[label] >= min_area]
    slices = ndimage.find_objects(labels)
    boxes = [
        (cols.start - 0.5, rows.start - 0.5, cols.stop - 0.5, rows.stop - 0.5)
        for rows, cols in (slices[label] for label in kept[:max_people])
    ]
    return np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
