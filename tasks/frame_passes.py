"""A frame's blended passes, finished on the model's device into the arrays the files hold.

From the blended passes (channels first, on the desqueezed frame, float32), in torch:

| pass     | becomes                                         | crosses as                     |
|----------|-------------------------------------------------|--------------------------------|
| normal   | re-normalised, squeezed back, re-normalised     | `N` (3, H, W) float16          |
| pointmap | squeezed back                                   | `P` (3, H, W) float32          |
| albedo   | squeezed back, channels last (for OpenColorIO)  | `albedo` (H, W, 3) float32     |
| matte    | squeezed back                                   | `matte` (H, W) float16         |
| depth    | squeezed back, normalised over the person (v1)  | `relDepth` (H, W) float32      |
| seg      | squeezed back, labels, Cryptomatte ranks        | `seg.id` (H, W) int32,         |
|          |                                                 | `labels` (H, W) uint8,         |
|          |                                                 | `CryptoBodyPart` (12, H, W) f4 |

plus, per pass, a preview-sized copy (area-averaged; labels by nearest pixel) and whether
the pass holds NaN or Inf anywhere. Only these cross to the host (``tasks.host_transfer``), never
the probabilities or a full-size float copy of a half pass. Albedo is the one pass that needs
host work after the device's: its way back to scene-linear is an OpenColorIO transform, which
runs on the CPU only (``tasks.frame_writing``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from storage.exr_writer import CRYPTO_LAYER, REL_DEPTH_LAYER
from tasks.anamorphic import resqueeze
from tasks.normal_rotation import normalize_vectors
from tasks.seg_outputs import seg_outputs

DENSE_PASSES: tuple[str, ...] = ("normal", "pointmap", "depth", "albedo", "matte", "seg")
PREVIEW_PREFIX = "preview/"
NONFINITE_PREFIX = "nonfinite/"


def finish_pass(
    name: str,
    values: Tensor,
    *,
    plate_width: int,
    preview_hw: tuple[int, int] | None,
    class_names: Sequence[str],
    foreground: Tensor | None = None,
) -> dict[str, Tensor]:
    """The final arrays of one pass of one frame, on the device of ``values`` (see the
    module's table), named by EXR part (``N``, ``P``, ``matte``, ``CryptoBodyPart``,
    ``seg.id``), ``albedo``, ``labels``, ``preview/<pass>`` (unless ``preview_hw`` is None)
    and ``nonfinite/<pass>`` (a bool: the pass holds NaN or Inf somewhere).

    ``values`` is the blended pass, (C, H, W') on the desqueezed frame (normals are
    re-normalised in place); ``plate_width`` is the plate's W. ``depth`` needs the person's
    ``foreground`` (H, W') mask (`relative_depth`).
    """
    if name not in DENSE_PASSES:
        raise ValueError(f"no dense pass {name!r}; known: {', '.join(DENSE_PASSES)}")
    low, high = torch.aminmax(values)
    out = {NONFINITE_PREFIX + name: ~(torch.isfinite(low) & torch.isfinite(high))}
    if name == "depth":
        if foreground is None:
            raise ValueError("relative depth is normalised over the person: give its mask")
        depth = relative_depth(values, foreground, plate_width)
        out[REL_DEPTH_LAYER] = depth
        if preview_hw is not None:
            out[PREVIEW_PREFIX + name] = preview_sized(depth[None], preview_hw)
        return out
    if name == "normal":
        values = normalize_vectors(values)
    if preview_hw is not None and name != "seg":
        out[PREVIEW_PREFIX + name] = preview_sized(values, preview_hw)
    values = resqueeze(values, plate_width, unit_vectors=name == "normal")
    if name == "normal":
        out["N"] = values.to(torch.float16)
    elif name == "pointmap":
        out["P"] = values.contiguous()
    elif name == "albedo":
        out["albedo"] = values.permute(1, 2, 0).contiguous()
    elif name == "matte":
        out["matte"] = values[0].to(torch.float16)
    else:
        seg = seg_outputs(values, class_names)
        out[CRYPTO_LAYER] = seg.planes
        out["seg.id"] = seg.labels
        out["labels"] = seg.labels.to(torch.uint8)
        if preview_hw is not None:
            out[PREVIEW_PREFIX + "seg"] = _preview_labels(out["labels"], preview_hw)
    return out


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
