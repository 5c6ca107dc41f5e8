"""Model inputs per frame with and without the person gate, from the tile plans alone (no model
runs): the five dense passes (pointmap whole-frame, normal, albedo, matte and seg tiled) on
the stand-ins' person plate (``bench.standins.person_plate``, its figure found by
``figure_look`` as a model that saw exactly the figure would) and on a small, distant figure
of 60 px, at each size asked.

    python -m bench.gate_inputs                       # 4096x2160 and 1920x1080
    python -m bench.gate_inputs --sizes 4096x2160 --tile 1024x768 --overlap 128

The inputs are what the networks run: one look (the seg model on the frame shrunk to its
1024 px side) and pointmap's whole frame, plus a tile per tiled pass that the gate keeps.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from bench.standins import distant_plate, figure_look, person_plate
from tasks.person_gate import THRESHOLD, PersonLook
from tasks.tiling import plan_frame

TILED = ("normal", "albedo", "matte", "seg")
LOOK_SIDE = 1024  # the released models' long input side


def look_of(plate: np.ndarray) -> PersonLook:
    """The gate's look at ``plate`` with the figure stand-in, at the look's size."""
    height, width = plate.shape[:2]
    scale = min(1.0, LOOK_SIDE / max(height, width))
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    frames = torch.from_numpy(plate).permute(2, 0, 1)[None]
    probability = figure_look(frames, torch.zeros((1, *size)))
    return PersonLook((probability[0] >= THRESHOLD).numpy(), height, width)


def inputs(plate: np.ndarray, tile_hw: tuple[int, int], overlap: int) -> dict[str, int]:
    height, width = plate.shape[:2]
    look = look_of(plate)
    plan = plan_frame(height, width, "normal", tile_hw, overlap)
    kept = sum(look.touches(tile.box) for tile in plan.tiles)
    return {
        "tiles_per_pass": len(plan.tiles),
        "tiles_kept_per_pass": kept,
        "inputs_all_tiles": 1 + len(TILED) * len(plan.tiles),
        "inputs_gated": 2 + len(TILED) * kept,  # pointmap and the look, then the kept tiles
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="4096x2160,1920x1080")
    p.add_argument("--tile", default="1024x768", help="h x w of a tile (the models' input)")
    p.add_argument("--overlap", type=int, default=128)
    args = p.parse_args(argv)
    tile_hw = tuple(int(v) for v in args.tile.lower().split("x"))
    for size in args.sizes.split(","):
        width, height = (int(v) for v in size.lower().split("x"))
        for name, plate in (
            ("person plate", person_plate(height, width)),
            ("60 px figure", distant_plate(height, width)),
        ):
            figures = inputs(plate, (tile_hw[0], tile_hw[1]), args.overlap)
            print(json.dumps({"size": size, "plate": name, **figures}))


if __name__ == "__main__":
    main()
