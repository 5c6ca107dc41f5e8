"""EXR parts from passes made up in a test (channels last, float32, at the plate's size),
through the device code that makes them in the worker (`tasks.frame_passes` on the CPU) and
the writer's assembly (`tasks.frame_writing`); albedo is taken as already scene-linear."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from schemas.passes import BY_NAME
from tasks.frame_passes import finish_pass
from tasks.frame_writing import exr_parts_and_zarr_blocks


def finished_arrays(
    passes: Mapping[str, np.ndarray], class_names: Sequence[str]
) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for name, values in passes.items():
        planes = values[None] if values.ndim == 2 else np.moveaxis(values, -1, 0)
        tensor = torch.from_numpy(np.ascontiguousarray(planes, dtype=np.float32))
        width = tensor.shape[-1]
        finished = finish_pass(
            BY_NAME[name], tensor, plate_width=width, preview_hw=None, class_names=class_names
        )
        arrays.update({key: value.numpy() for key, value in finished.items()})
    return arrays


def exr_parts(
    passes: Mapping[str, np.ndarray], class_names: Sequence[str] = ()
) -> dict[str, dict[str, np.ndarray]]:
    """The parts of `passes` (normal, pointmap, albedo, matte, seg as probabilities)."""
    arrays = finished_arrays(passes, class_names)
    colour = {n: v.astype(np.float16) for n, v in passes.items() if BY_NAME[n].scene_linear}
    parts, _ = exr_parts_and_zarr_blocks([BY_NAME[n] for n in passes], arrays, colour)
    return parts
