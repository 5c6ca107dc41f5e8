"""The fusion's reduced size and the way back to the plate's: each pass's area means at the
reduced size (``reduce_pass``); the reduced pixels that cannot stand for their plate pixels
(``edge_blocks``: a silhouette, a depth step, a label boundary) and the plate pixels whose lift
reads them (``plate_pixels``), which are fused at the plate's size instead; and the lift
(``lift_frame``): each pass is the centre's own pixels plus the fusion's correction, upsampled
bilinearly. What the fusion removes from a per-frame network's output is smooth at the reduced
size, and the frame's own detail is kept. Why and what it costs: docs/design/stabilisation.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from tasks.pixel_blocks import row_blocks
from tasks.stabilise.rules import DISTANCE, TINY, pixel_norm
from tasks.stabilise.settings import FusionSettings

# A class whose probability the reduced fusion moves by less than this in the rows at hand keeps
# the centre's values there (``lift_frame``): about half an 8-bit code value (1/255), which no
# one sees in a Cryptomatte matte, and too little to flip a label but where two classes tie.
# Most classes are absent from most rows of a frame, and skipping them is most of the cost of
# lifting seg.
LABEL_TOLERANCE = 2e-3


def reduce_pass(values: Tensor, size: tuple[int, int], kind: str) -> Tensor:
    """A pass at the fusion's size: each pixel the mean of the plate pixels it covers (area;
    NaN where one of them is: such blocks are fused at the plate's size, ``edge_blocks``).
    Unit vectors are re-normalised; probabilities still sum to 1."""
    height, width = values.shape[1:]
    if height % size[0] == 0 and width % size[1] == 0:  # the same means, a third faster
        low = F.avg_pool2d(values[None], (height // size[0], width // size[1]))[0]
    else:
        low = F.interpolate(values[None], size=size, mode="area")[0]
    if kind == "unit_vectors":
        norm = pixel_norm(low)
        low = torch.where(norm > TINY, low / norm.clamp_min(TINY), low)
    return low


def edge_blocks(
    reduced: Mapping[str, Tensor], kinds: Mapping[str, str], settings: FusionSettings
) -> Tensor:
    """(h, w) bool at the fusion's size: the pixels whose plate pixels the reduced fusion
    cannot stand for. A pixel is an edge where a pass changes to the next pixel by more than
    ``settings.edge`` times its kind's robustness scale (a silhouette, a depth step, a label
    boundary: a mean over such a block blends two surfaces; both pixels of the step are
    marked, as the step may lie in either) or where it is not finite."""
    first = next(iter(reduced.values()))
    mask = torch.zeros(first.shape[1:], dtype=torch.bool, device=first.device)
    for name, kind in kinds.items():
        low = reduced[name]
        distance = DISTANCE[kind]
        limit = settings.edge * settings.scale(kind)
        across = ~(distance(low[:, :, 1:], low[:, :, :-1]) <= limit)  # NaN: an edge too
        down = ~(distance(low[:, 1:], low[:, :-1]) <= limit)
        mask[:, 1:] |= across
        mask[:, :-1] |= across
        mask[1:] |= down
        mask[:-1] |= down
    return mask


def plate_pixels(edges: Tensor, plate_hw: tuple[int, int]) -> Tensor:
    """The flat indices, in order, of the plate pixels whose lift (``_RowUpsampler``'s
    bilinear upsampling) reads an edge pixel (``edge_blocks``): the edge pixels' own plate
    pixels and, around them, the half of each neighbour's nearer to them, where a correction
    made across the edge would bleed in.

    Made from runs of plate rows (and columns) that read the same two fused rows (columns),
    never from a plate-size mask, which at 4K costs more to gather and search."""
    height, width = plate_hw
    rows = _tap_runs(height, edges.shape[0], edges.device)
    cols = _tap_runs(width, edges.shape[1], edges.device)
    by_row = edges.index_select(0, rows.first) | edges.index_select(0, rows.second)
    cells = by_row.index_select(1, cols.first) | by_row.index_select(1, cols.second)
    run, col = cells.nonzero(as_tuple=True)  # in order: by runs of rows, then columns
    cell, xs = _ranges(cols.start[col], cols.length[col])
    run_of_x = run[cell]  # the marked plate columns of each run of rows, in order
    per_run = torch.bincount(run_of_x, minlength=cells.shape[0])
    run_of_row = torch.repeat_interleave(
        torch.arange(cells.shape[0], device=edges.device), rows.length
    )
    row, at = _ranges(_starts(per_run)[run_of_row], per_run[run_of_row])
    return row * width + xs[at]


class _Runs(NamedTuple):
    """Runs of consecutive positions that read the same two source positions."""

    first: Tensor  # each run's two source positions
    second: Tensor
    start: Tensor  # its first position
    length: Tensor


def _tap_runs(size: int, low: int, device: torch.device) -> _Runs:
    """The runs of the ``size`` positions that read the same two of ``low`` positions
    (``_bilinear_taps``)."""
    first, second, _ = _bilinear_taps(size, low, device)
    _, counts = torch.unique_consecutive(first * low + second, return_counts=True)
    starts = _starts(counts)
    return _Runs(first[starts], second[starts], starts, counts)


def _ranges(starts: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """The ranges start .. start + count - 1, concatenated, and each element's range."""
    item = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    within = torch.arange(item.numel(), device=counts.device) - _starts(counts)[item]
    return item, starts[item] + within


def _starts(counts: Tensor) -> Tensor:
    """Where each of consecutive blocks of ``counts`` elements starts."""
    return counts.cumsum(0) - counts


def _bilinear_taps(size: int, low: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """For each of ``size`` positions, the two of ``low`` source positions a bilinear
    upsampling (``F.interpolate``'s, align_corners=False) blends, and the second's share."""
    source = (torch.arange(size, device=device, dtype=torch.float32) + 0.5) * (low / size)
    source = source.sub_(0.5).clamp_(min=0.0)
    first = source.floor().long().clamp_(max=low - 1)
    second = (first + 1).clamp_(max=low - 1)
    return first, second, (source - first).clamp_(0.0, 1.0)


def lift_frame(
    centre: Mapping[str, Tensor],
    reduced: Mapping[str, Tensor],
    fused: Mapping[str, Tensor],
    kinds: Mapping[str, str],
) -> None:
    """The reduced fusion's result at the plate's size, written into ``centre``'s own
    tensors: each pass is its own pixels plus the fusion's correction (fused - centre, at the
    fusion's size) upsampled bilinearly, put back in its kind's range (unit vectors
    re-normalised, mattes in 0..1). Probabilities: only the classes the correction moves by
    more than ``LABEL_TOLERANCE`` (in the rows at hand) change, the others (absent from the
    frame, or nearly) keep their values; the changed ones are kept non-negative and rescaled to
    the mass they had, so every pixel still sums to what it did. In place, because a new 4K
    frame of 29 class planes is 1 GB of fresh memory a frame. Right for the pixels away from
    ``edge_blocks``; the stabiliser writes those fused at the plate's size over these."""
    for name, values in centre.items():
        correction = torch.nan_to_num(fused[name] - reduced[name], 0.0, 0.0, 0.0)
        if kinds[name] == "labels":
            _lift_labels(values, correction)
        else:
            _lift_values(kinds[name], values, correction)


def _lift_values(kind: str, values: Tensor, correction: Tensor) -> None:
    upsampler = _RowUpsampler(correction, (values.shape[1], values.shape[2]))
    bytes_per_row = values.shape[0] * values.shape[2] * 16
    for rows in row_blocks(values.device, values.shape[1], bytes_per_row):
        band = values[:, rows]
        step = upsampler.rows(rows)
        band.add_(step)
        if kind == "unit_vectors":
            norm = pixel_norm(band)
            flat = norm <= TINY  # no direction left: the pixel's own stands
            band.div_(norm.clamp_min(TINY))
            if bool(flat.any()):
                band.copy_(torch.where(flat, band * norm.clamp_min(TINY) - step, band))
        elif kind == "alpha":
            band.clamp_(0.0, 1.0)


def _lift_labels(values: Tensor, correction: Tensor) -> None:
    """Per band of rows, only the classes the correction moves there (in the fused rows the
    band's upsampling reads) are lifted; a band where none moves stays as it is."""
    moved_in_row = correction.abs().amax(dim=2) > LABEL_TOLERANCE  # (classes, fused rows)
    moved = moved_in_row.any(dim=1).nonzero().squeeze(1)
    if not moved.numel():
        return
    upsampler = _RowUpsampler(correction.index_select(0, moved), (values.shape[1],
                                                                 values.shape[2]))  # fmt: skip
    moved_in_row = moved_in_row.index_select(0, moved)
    # a band's work arrays (four of 4 bytes a value) hold only the classes moving in it,
    # most often a fraction of them, so bands are sized for half the frame's moving classes
    bytes_per_row = moved.numel() * values.shape[2] * 8
    for rows in row_blocks(values.device, values.shape[1], bytes_per_row):
        read = slice(int(upsampler.top[rows][0]), int(upsampler.bottom[rows][-1]) + 1)
        active = moved_in_row[:, read].any(dim=1).nonzero().squeeze(1)
        if not active.numel():
            continue
        classes = moved[active]
        band = values[:, rows]
        before = band.index_select(0, classes)
        after = upsampler.rows(rows, active).add_(before).clamp_(min=0.0)
        mass, now = before.sum(dim=0), after.sum(dim=0)
        after.mul_(mass.div_(now.clamp_min(TINY)))
        emptied = now <= TINY  # no mass left to rescale: the pixel keeps its own values
        if bool(emptied.any()):
            after = torch.where(emptied, before, after)
        band.index_copy_(0, classes, after)


class _RowUpsampler:
    """Bilinear upsampling (``F.interpolate``'s, align_corners=False) of a (C, h, w) field to
    (C, H, W), a band of rows at a time: the columns are widened once for the whole field
    (C, h, W: a quarter of the plate's size at a 4x reduction), and each band of rows is the
    blend of two gathered rows of that, so a band's work stays in cache on the CPU."""

    def __init__(self, field: Tensor, size: tuple[int, int]) -> None:
        height, width = size
        channels, h, w = field.shape
        # linear along the rows of a (1, C * h, w) view: the values of bilinear interpolation
        # to (h, width), bit for bit, and faster on the CPU
        self.wide = F.interpolate(
            field.reshape(1, channels * h, w), size=width, mode="linear", align_corners=False
        ).view(channels, h, width)
        self.top, self.bottom, share = _bilinear_taps(height, h, field.device)
        self.share = share[:, None]

    def rows(self, rows: slice, channels: Tensor | None = None) -> Tensor:
        """The upsampled field's rows ``rows`` (of ``channels`` only, when given)."""
        top, bottom = self.top[rows], self.bottom[rows]
        if channels is None:
            upper = self.wide.index_select(1, top)
            lower = self.wide.index_select(1, bottom)
        else:  # one gather of whole rows from the (C * h, W) view: advanced indexing
            # ([channels, rows]) took a third of lifting seg's time on the CPU
            count, h, width = channels.numel(), self.wide.shape[1], self.wide.shape[2]
            flat = self.wide.view(-1, width)
            first = (channels * h)[:, None]
            upper = flat.index_select(0, (first + top[None, :]).view(-1))
            lower = flat.index_select(0, (first + bottom[None, :]).view(-1))
            upper, lower = upper.view(count, -1, width), lower.view(count, -1, width)
        return upper.lerp_(lower, self.share[rows])
