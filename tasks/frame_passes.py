"""A frame's blended passes, finished on the model's device into the arrays the files hold.

From the blended passes (channels first, on the desqueezed frame, float32), in torch, by
the pass's ``values`` in the pass table (``schemas.passes``); the arrays are named by pass:

| values         | becomes                                            | crosses as            |
|----------------|----------------------------------------------------|-----------------------|
| unit_vectors   | re-normalised, squeezed back, re-normalised         | (C, H, W) float16     |
| points         | squeezed back                                      | (C, H, W) float32     |
| colour         | squeezed back, channels last (for OpenColorIO)     | (H, W, C) float32     |
| alpha          | squeezed back                                      | (H, W) float16        |
| class_groups   | groups of class probabilities summed, squeezed back | (G, H, W) float16     |
| relative_depth | squeezed back, normalised over the person (v1)     | (H, W) float32        |
| labels         | squeezed back, labels, Cryptomatte ranks           | (H, W) uint8 labels,  |
|                |                                                    | `<pass>/id` int32,    |
|                |                                                    | `<pass>/ranks` f4     |
| motion         | (`finish_motion`, not from a model) forward and    | (4, H, W) float16     |
|                | backward plate-pixel vectors, v negated (Nuke: up) |                       |

plus, per pass, a preview-sized copy (area-averaged; labels by nearest pixel) and whether
the pass holds NaN or Inf anywhere. Only these cross to the host (``tasks.host_transfer``),
never the probabilities or a full-size float copy of a half pass. A colour pass is the one
that needs host work after the device's: its way back to scene-linear is an OpenColorIO
transform, which runs on the CPU only (``tasks.frame_writing``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from schemas.passes import PASS_NAMES, Pass, first_of_kind
from tasks.anamorphic import resqueeze
from tasks.normal_rotation import normalize_vectors
from tasks.seg_outputs import seg_outputs

PREVIEW_PREFIX = "preview/"
NONFINITE_PREFIX = "nonfinite/"
ID_SUFFIX = "/id"  # a labels pass's class index as the EXR stores it (int32, read as uint32)
RANKS_SUFFIX = "/ranks"  # a labels pass's Cryptomatte rank planes
MOTION = first_of_kind(PASS_NAMES, "motion")  # the pass of motion vectors


def finish_pass(
    spec: Pass,
    values: Tensor,
    *,
    plate_width: int,
    preview_hw: tuple[int, int] | None,
    class_names: Sequence[str],
    foreground: Tensor | None = None,
) -> dict[str, Tensor]:
    """The final arrays of one pass of one frame, on the device of ``values`` (see the
    module's table), named ``<pass>`` (and ``<pass>/id``, ``<pass>/ranks`` for labels),
    ``preview/<pass>`` (unless ``preview_hw`` is None) and ``nonfinite/<pass>`` (a bool:
    the pass holds NaN or Inf somewhere).

    ``values`` is the blended pass, (C, H, W') on the desqueezed frame (unit vectors are
    re-normalised in place); ``plate_width`` is the plate's W. Relative depth needs the
    person's ``foreground`` (H, W') mask (`relative_depth`).
    """
    name, kind = spec.name, spec.values
    if kind in ("keypoints",):
        raise ValueError(f"{name} is not a dense pass")
    if kind == "motion":
        raise ValueError(f"{name} is not a model's output: finish it with finish_motion")
    low, high = torch.aminmax(values)
    out = {NONFINITE_PREFIX + name: ~(torch.isfinite(low) & torch.isfinite(high))}
    if kind == "relative_depth":
        if foreground is None:
            raise ValueError("relative depth is normalised over the person: give its mask")
        depth = relative_depth(values, foreground, plate_width)
        out[name] = depth
        if preview_hw is not None:
            out[PREVIEW_PREFIX + name] = preview_sized(depth[None], preview_hw)
        return out
    if kind == "class_groups":  # from class probabilities: one soft matte per group
        values = class_groups(values, spec.class_groups, class_names)
    unit = kind == "unit_vectors"
    if unit:
        values = normalize_vectors(values)
    if preview_hw is not None and kind != "labels":
        out[PREVIEW_PREFIX + name] = preview_sized(values, preview_hw)
    values = resqueeze(values, plate_width, unit_vectors=unit)
    if unit:
        out[name] = values.to(torch.float16)
    elif kind == "points":
        out[name] = values.contiguous()
    elif kind == "colour":
        out[name] = values.permute(1, 2, 0).contiguous()
    elif kind in ("alpha", "class_groups"):
        out[name] = (values[0] if values.shape[0] == 1 else values).to(torch.float16)
    elif kind == "labels":
        seg = seg_outputs(values, class_names)
        out[name + RANKS_SUFFIX] = seg.planes
        out[name + ID_SUFFIX] = seg.labels
        out[name] = seg.labels.to(torch.uint8)
        if preview_hw is not None:
            out[PREVIEW_PREFIX + name] = _preview_labels(out[name], preview_hw)
    else:
        raise ValueError(f"{name}: no way to finish values of kind {kind!r}")
    return out


def finish_motion(
    forward: Tensor,
    backward: Tensor,
    *,
    preview_hw: tuple[int, int] | None = None,
    name: str | None = MOTION,
) -> dict[str, Tensor]:
    """The final arrays of a frame's motion vectors, on their device: ``forward`` (to the
    next frame) and ``backward`` (to the previous one), each (H, W, 2) float32 in plate
    pixels per frame, x right and y DOWN (image rows, as `tasks.plate_flow` makes them; zero
    where there is no neighbour). Independent of the chunk worker: anything that has the
    vectors of a frame (the stabiliser, for a stabilised version) writes them through this.

    Returns ``<name>``: (4, H, W) float16 planes forward u, forward v, backward u, backward
    v with v negated (Nuke's y axis points up), what the EXR part and the Zarr array hold;
    ``nonfinite/<name>``; and, unless ``preview_hw`` is None, ``preview/<name>``: the
    forward vectors area-averaged to the preview, (h, w, 2) float32 in the preview's own
    square pixels, y down (``storage.previews.motion_rgb`` draws them). An anamorphic
    plate's u stays in its stored pixels; the preview's width, in square pixels, converts
    it."""
    if name is None:
        raise ValueError("the pass table has no motion pass")
    if forward.shape != backward.shape or forward.ndim != 3 or forward.shape[-1] != 2:
        raise ValueError(
            f"motion vectors are (H, W, 2) each; got {tuple(forward.shape)} forward and "
            f"{tuple(backward.shape)} backward"
        )
    height, width = forward.shape[:2]
    planes = torch.empty((4, height, width), dtype=torch.float16, device=forward.device)
    sides = (forward[..., 0], forward[..., 1], backward[..., 0], backward[..., 1])
    for plane, values in zip(planes, sides, strict=True):
        plane.copy_(values)  # straight into half from the strided view: no float copy
    for v in (planes[1], planes[3]):
        v.neg_().add_(0.0)  # v up; + 0.0 turns a still pixel's -0 back into 0
    low, high = torch.aminmax(planes)
    out = {NONFINITE_PREFIX + name: ~(torch.isfinite(low) & torch.isfinite(high)), name: planes}
    if preview_hw is not None:
        small = preview_sized(forward.permute(2, 0, 1), preview_hw)  # (h, w, 2)
        ratio = [preview_hw[1] / width, preview_hw[0] / height]  # to the preview's pixels
        out[PREVIEW_PREFIX + name] = small * torch.tensor(ratio, device=small.device)
    return out


def class_groups(
    probabilities: Tensor, groups: Mapping[str, Sequence[str]], class_names: Sequence[str]
) -> Tensor:
    """(G, H, W) soft mattes from (C, H, W) class probabilities: each group's classes summed
    (by name: a class the model lacks counts as 0), clamped to [0, 1]."""
    index = {name: i for i, name in enumerate(class_names)}
    mattes = torch.zeros(
        (len(groups), *probabilities.shape[1:]), dtype=torch.float32, device=probabilities.device
    )
    for g, classes in enumerate(groups.values()):
        for name in classes:
            if name in index:
                mattes[g] += probabilities[index[name]]
    return mattes.clamp_(0.0, 1.0)


def relative_depth(raw: Tensor, foreground: Tensor, plate_width: int) -> Tensor:
    """Sapiens v1's raw depth (1, H, W') as the plate's (H, W) float32 relative depth, as
    upstream trained it: min-max normalised over the person (0 nearest, 1 farthest) and -1
    elsewhere; a frame with no person is -1 everywhere. The raw map and the mask are squeezed
    back to the plate first, so the normalisation sees the plate's pixels."""
    depth = resqueeze(raw.float(), plate_width)[0]
    person = resqueeze(foreground[None].float(), plate_width)[0] >= 0.5
    nearest = torch.where(person, depth, torch.inf).amin()
    farthest = torch.where(person, depth, -torch.inf).amax()
    span = (farthest - nearest).clamp_min(torch.finfo(torch.float32).tiny)
    return torch.where(person, (depth - nearest) / span, -1.0)


def preview_sized(values: Tensor, preview_hw: tuple[int, int]) -> Tensor:
    """(C, H, W) area-averaged to ``preview_hw``, float32; one channel comes back (h, w) and
    three channels last (h, w, 3), as ``storage.previews`` takes them."""
    small = values.float()
    if tuple(small.shape[-2:]) != tuple(preview_hw):
        small = F.interpolate(small[None], size=preview_hw, mode="area")[0]
    return small[0] if small.shape[0] == 1 else small.permute(1, 2, 0).contiguous()


def _preview_labels(labels: Tensor, preview_hw: tuple[int, int]) -> Tensor:
    if tuple(labels.shape) == tuple(preview_hw):
        return labels
    picked = F.interpolate(labels[None, None].float(), size=preview_hw, mode="nearest-exact")
    return picked[0, 0].to(torch.uint8)
