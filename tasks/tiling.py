"""Per-pass tile planning for one frame, and cutting a frame into its tiles.

Pass geometry differs, so each pass gets its own plan (ARCHITECTURE.md, "Tiles, by pass"):

- ``normal``, ``albedo``, ``matte``, ``seg``: overlapping tiles at the model's native input size
  (1024 high x 768 wide by default) covering the whole frame. Along an axis where the frame is
  larger than a tile, tiles step by ``tile - overlap`` and the last one is shifted inward so it
  ends on the frame edge: nothing is padded. Along an axis where the frame is smaller than a
  tile, the tile is cut to the frame (one tile of the frame's size, no letterboxing). All tiles
  of a plan have one shape, so they batch together, and across frames of the same size too.
- ``pointmap``: one whole-frame "tile"; the predictor letterboxes it to 1024x768 itself (the
  upstream scale branch only runs at that size) and upsamples back.
- ``pose``: no tiles; pose crops come from person boxes elsewhere.
- ``backbone4k``: the whole frame padded at the bottom and right to a multiple of
  ``pad_multiple`` (64 px: the 4K tokenizer's 4x4-patch windows). Padding is zero by default
  (black in the model's [0,1] input encoding, the same value upstream letterboxes with, so the
  model has seen it in training); ``pad_mode="edge"`` repeats the border pixels instead.

Boxes are half-open ``(y0, x0, y1, x1)`` in frame pixels (rows first, like numpy), unlike the
inclusive EXR ``Box`` of ``storage.frame``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from schemas.passes import PASSES

TILED_PASSES = tuple(p.name for p in PASSES if p.inference == "tiled")
WHOLE_FRAME_PASSES = tuple(p.name for p in PASSES if p.inference == "whole_frame")
PADDED_FRAME_PASSES: tuple[str, ...] = ("backbone4k",)  # a bare 4K backbone's features
UNTILED_PASSES = tuple(p.name for p in PASSES if p.inference == "per_person")
PASS_NAMES: tuple[str, ...] = (
    TILED_PASSES + WHOLE_FRAME_PASSES + PADDED_FRAME_PASSES + UNTILED_PASSES
)

NATIVE_TILE_HW: tuple[int, int] = (1024, 768)  # the model's input, height x width

Layout = Literal["tiles", "whole_frame", "padded_frame", "none"]
PadMode = Literal["zero", "edge"]


class Region(NamedTuple):
    """A half-open pixel rectangle: rows ``y0:y1``, columns ``x0:x1``."""

    y0: int
    x0: int
    y1: int
    x1: int

    @property
    def height(self) -> int:
        return self.y1 - self.y0

    @property
    def width(self) -> int:
        return self.x1 - self.x0

    @property
    def slices(self) -> tuple[slice, slice]:
        return slice(self.y0, self.y1), slice(self.x0, self.x1)


class Feather(NamedTuple):
    """Lengths in pixels of the blending ramps on each side of a tile.

    Each length is the tile's overlap with its neighbour on that side; 0 on a frame edge (no
    neighbour, full weight up to the edge). The weights themselves are built in
    ``tasks.blending.feather_weights``.
    """

    top: int
    bottom: int
    left: int
    right: int


class Padding(NamedTuple):
    """Pixels added around the frame on each side to make a padded tile."""

    top: int
    bottom: int
    left: int
    right: int


@dataclass(frozen=True)
class Tile:
    """One tile of a frame.

    ``box`` is where the tile sits in the frame (clipped to it); ``shape`` is the (h, w) of the
    array the model gets, which is larger than the box only for padded tiles; ``valid`` is the
    part of that array that holds frame pixels (tile-local coordinates), i.e. what to keep of
    the model's output.
    """

    index: int
    row: int
    col: int
    box: Region
    valid: Region
    shape: tuple[int, int]
    feather: Feather


@dataclass(frozen=True)
class FramePlan:
    """How one pass of one frame is cut into tiles. Frozen, so equal plans compare equal."""

    pass_name: str
    height: int
    width: int
    layout: Layout
    tile_shape: tuple[int, int]  # (h, w) of every tile array; (0, 0) when there are no tiles
    overlap: int
    rows: int
    cols: int
    tiles: tuple[Tile, ...]
    padding: Padding
    pad_mode: PadMode
    note: str

    @property
    def batch_key(self) -> tuple[str, tuple[int, int]]:
        """Tiles of plans with equal keys have one shape and can share a model batch."""
        return self.layout, self.tile_shape


def _tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Start offsets along one axis: step ``tile - overlap``, last tile ending on the edge."""
    if length <= tile:
        return [0]
    stride = tile - overlap
    starts = [0]
    while starts[-1] + tile < length:
        starts.append(min(starts[-1] + stride, length - tile))
    return starts


def _ramps(starts: Sequence[int], tile: int) -> list[tuple[int, int]]:
    """(before, after) ramp lengths per tile along one axis: its overlap with each neighbour."""
    ramps = []
    for i, start in enumerate(starts):
        before = starts[i - 1] + tile - start if i > 0 else 0
        after = start + tile - starts[i + 1] if i + 1 < len(starts) else 0
        ramps.append((before, after))
    return ramps


def _check_arguments(
    height: int, width: int, pass_name: str, tile_hw: tuple[int, int], overlap: int, pad: int
) -> None:
    if pass_name not in PASS_NAMES:
        raise ValueError(f"unknown pass {pass_name!r}; expected one of {', '.join(PASS_NAMES)}")
    if height < 1 or width < 1:
        raise ValueError(f"cannot plan tiles for an empty frame of {height}x{width} (h x w)")
    tile_h, tile_w = tile_hw
    if tile_h < 1 or tile_w < 1:
        raise ValueError(f"tile size must be positive, got {tile_h}x{tile_w} (h x w)")
    if not 0 <= overlap < min(tile_h, tile_w):
        raise ValueError(
            f"overlap must be at least 0 and smaller than the tile ({tile_h}x{tile_w}), "
            f"got {overlap}"
        )
    if pad < 1:
        raise ValueError(f"pad_multiple must be positive, got {pad}")


def plan_frame(
    height: int,
    width: int,
    pass_name: str,
    tile_hw: tuple[int, int] = NATIVE_TILE_HW,
    overlap: int = 128,
    pad_multiple: int = 64,
    pad_mode: PadMode = "zero",
) -> FramePlan:
    """Plan the tiles of one ``height`` x ``width`` frame for ``pass_name`` (see module doc)."""
    _check_arguments(height, width, pass_name, tile_hw, overlap, pad_multiple)
    if pad_mode not in ("zero", "edge"):
        raise ValueError(f"pad_mode must be 'zero' or 'edge', got {pad_mode!r}")
    if pass_name in UNTILED_PASSES:
        note = "pose: no tiles; crops come from person boxes (segmentation or matte)"
        return _whole_frame_plan(pass_name, height, width, "none", None, pad_mode, note)
    if pass_name in WHOLE_FRAME_PASSES:
        note = "one whole-frame tile; the predictor letterboxes it to 1024x768 and back"
        return _whole_frame_plan(pass_name, height, width, "whole_frame", 1, pad_mode, note)
    if pass_name in PADDED_FRAME_PASSES:
        note = (
            f"whole frame, {pad_mode}-padded at bottom/right to a multiple of "
            f"{pad_multiple} px; keep only the tile's `valid` region of the output"
        )
        return _whole_frame_plan(
            pass_name, height, width, "padded_frame", pad_multiple, pad_mode, note
        )

    tile_h, tile_w = min(tile_hw[0], height), min(tile_hw[1], width)
    row_starts = _tile_starts(height, tile_h, overlap)
    col_starts = _tile_starts(width, tile_w, overlap)
    row_ramps = _ramps(row_starts, tile_h)
    col_ramps = _ramps(col_starts, tile_w)
    local = Region(0, 0, tile_h, tile_w)
    tiles = []
    for row, (y0, (top, bottom)) in enumerate(zip(row_starts, row_ramps, strict=True)):
        for col, (x0, (left, right)) in enumerate(zip(col_starts, col_ramps, strict=True)):
            box = Region(y0, x0, y0 + tile_h, x0 + tile_w)
            feather = Feather(top, bottom, left, right)
            tiles.append(Tile(len(tiles), row, col, box, local, (tile_h, tile_w), feather))
    return FramePlan(
        pass_name=pass_name,
        height=height,
        width=width,
        layout="tiles",
        tile_shape=(tile_h, tile_w),
        overlap=overlap,
        rows=len(row_starts),
        cols=len(col_starts),
        tiles=tuple(tiles),
        padding=Padding(0, 0, 0, 0),
        pad_mode=pad_mode,
        note=f"{len(tiles)} overlapping {tile_h}x{tile_w} tiles (h x w), last row/column "
        "shifted inward to end on the frame edge",
    )


def _whole_frame_plan(
    pass_name: str,
    height: int,
    width: int,
    layout: Layout,
    pad_multiple: int | None,
    pad_mode: PadMode,
    note: str,
) -> FramePlan:
    """A plan of no tile (``pad_multiple`` None) or of one tile covering the whole frame,
    padded at bottom/right up to ``pad_multiple`` (1: not padded)."""
    if pad_multiple is None:
        padded_h = padded_w = 0
        tiles: tuple[Tile, ...] = ()
    else:
        padded_h = -(-height // pad_multiple) * pad_multiple
        padded_w = -(-width // pad_multiple) * pad_multiple
        whole = Region(0, 0, height, width)
        tiles = (Tile(0, 0, 0, whole, whole, (padded_h, padded_w), Feather(0, 0, 0, 0)),)
    padding = Padding(0, max(padded_h - height, 0), 0, max(padded_w - width, 0))
    return FramePlan(
        pass_name=pass_name,
        height=height,
        width=width,
        layout=layout,
        tile_shape=(padded_h, padded_w),
        overlap=0,
        rows=len(tiles),
        cols=len(tiles),
        tiles=tiles,
        padding=padding,
        pad_mode=pad_mode,
        note=note,
    )


def extract_tiles(image: Tensor, plan: FramePlan, indices: Sequence[int] | None = None) -> Tensor:
    """Cut ``image`` (C, H, W), on any device, into the plan's tiles: (N, C, h, w) there.

    ``indices`` picks some tiles (in that order), so a caller can cut a frame a batch at a time
    instead of holding every tile at once. The result is a fresh contiguous tensor in the
    image's dtype; padded tiles are filled per ``plan.pad_mode``. A plan without tiles (pose)
    gives an empty (0, C, 0, 0) tensor.
    """
    if tuple(image.shape[1:]) != (plan.height, plan.width):
        raise ValueError(
            f"image is {image.shape[1]}x{image.shape[2]} (h x w) but the {plan.pass_name} "
            f"plan is for {plan.height}x{plan.width}"
        )
    chosen = plan.tiles if indices is None else tuple(plan.tiles[i] for i in indices)
    channels = image.shape[0]
    if not chosen:
        return image.new_empty((0, channels, 0, 0))
    out = image.new_zeros((len(chosen), channels, *plan.tile_shape))
    for slot, tile in zip(out, chosen, strict=True):
        valid, box = tile.valid, tile.box
        slot[:, valid.y0 : valid.y1, valid.x0 : valid.x1] = image[
            :, box.y0 : box.y1, box.x0 : box.x1
        ]
        if plan.pad_mode == "edge" and valid != Region(0, 0, *tile.shape):
            _fill_edge(slot, valid)
    return out


def _fill_edge(slot: Tensor, valid: Region) -> None:
    """Fill ``slot`` (C, h, w) outside ``valid`` by repeating the nearest valid pixel."""
    height, width = slot.shape[1:]
    rows = torch.arange(height, device=slot.device).clamp(valid.y0, valid.y1 - 1)
    cols = torch.arange(width, device=slot.device).clamp(valid.x0, valid.x1 - 1)
    slot[...] = slot[:, rows][:, :, cols]
