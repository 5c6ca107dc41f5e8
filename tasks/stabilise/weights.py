"""The weight both temporal smoothers give a sample: exp(-d^2 / 2 s^2) of its distance d, at a
scale s. It is the temporal kernel over the frame distance (a near frame counts more) and the
robustness term over a sample's distance to the current estimate (a frame that disagrees with
the others loses its weight), in the keypoint smoother and in the fusion of dense passes.

The fusion weighs its float32 planes with the same form computed in place
(``tasks.stabilise.rules.gaussian_``): a 4K plane is too large for the copies this makes.
"""

from __future__ import annotations

import math
from typing import TypeVar, overload

import numpy as np

_Array = TypeVar("_Array", bound=np.ndarray)


@overload
def gaussian(distance: float, scale: float) -> float: ...
@overload
def gaussian(distance: _Array, scale: float) -> _Array: ...
def gaussian(distance: float | np.ndarray, scale: float) -> float | np.ndarray:
    """exp(-d^2 / 2 scale^2) of a distance or of an array of them (float64)."""
    exponent = -0.5 * (distance / scale) ** 2
    if isinstance(exponent, float):
        return math.exp(exponent)
    return np.exp(exponent)
