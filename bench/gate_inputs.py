"""Model inputs per frame with and without the person gate, from the tile plans alone (no model
runs): the five dense passes (pointmap whole-frame, normal, albedo, matte and seg tiled) on
the stand-ins' person plate (``bench.standins.person_plate``, its figure found by
``figure_look`` as a model that saw exactly the figure would) and on a small, distant figure
of 60 px, at each size asked.

    python -m bench.gate_inputs                       # 4096x2160 and 1920x1080
    python -m bench.gate_inputs --sizes 4096x2160 --tile 1024x768 --overlap 128
    python -m bench.gate_inputs --sizes 4096x2160 --exact    # and the pixels, gated or not

``--exact`` runs the model stage (``FrameInference``, tiny untrained models of each tiled
pass at the tile size, the figure stand-in as the look) on each plate with and without the
gate and compares every finished array on the figure and within the margin around it
(largest difference, and whether every value is the same bit for bit).

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


def exactness(plate: np.ndarray, tile_hw: tuple[int, int], overlap: int) -> dict[str, object]:
    """Gated against all tiles on the figure and its margin: the largest difference per
    finished array, and whether they are bit for bit the same."""
    import os

    import sapiens
    from sapiens.seg_classes import SEG_CLASSES
    from schemas.spec import parse_spec
    from tasks.frame_inference import FrameInference
    from tasks.person_gate import PLUGIN_VARIABLE
    from tests.frame_helpers import read_frame

    tasks = {"normal": "normal", "albedo": "albedo", "matte": "matting", "seg": "seg"}
    models = {
        name: sapiens.build_model("tiny", task, input_hw=tile_hw, seed=i)
        for i, (name, task) in enumerate(tasks.items())
    }
    predictor = sapiens.Predictor(models, batch_size=4)
    os.environ[PLUGIN_VARIABLE] = "bench.standins:figure_look"
    arrays = {}
    for tiles in ("people", "all"):
        spec = parse_spec(
            {
                "plate": "/plates/p.####.exr", "show": "b", "sequence": "q", "shot": "h",
                "colorspace": "lin_rec709", "passes": ",".join(tasks), "previews": False,
                "tiles": tiles, "tiling": {"tile_height": tile_hw[0], "tile_width": tile_hw[1],
                                           "overlap": overlap},
            }
        )  # fmt: skip
        (frame,) = FrameInference(spec, predictor, SEG_CLASSES).run([read_frame(plate)])
        arrays[tiles] = frame.arrays.wait()
    near = _near_figure(look_of(plate))
    out: dict[str, object] = {}
    for key, value in arrays["all"].items():
        if value.ndim < 2:
            continue
        hw_first = value.shape[:2] == near.shape  # (H, W, C) colour, else (..., H, W)
        gated = arrays["people"][key][near] if hw_first else arrays["people"][key][..., near]
        wanted = value[near] if hw_first else value[..., near]
        diff = np.abs(gated.astype(np.float64) - wanted.astype(np.float64)).max()
        out[key] = {"max_diff": float(diff), "bit_exact": bool(np.array_equal(gated, wanted))}
    out["pixels_compared"] = int(near.sum())
    return out


def _near_figure(look: PersonLook) -> np.ndarray:
    """(H, W) bool: the plate pixels within the margin of a look pixel of the figure."""
    up = torch.from_numpy(look.mask)[None, None].float()
    full = torch.nn.functional.interpolate(up, size=(look.height, look.width), mode="nearest")
    margin = look.margin_px()
    grown = torch.nn.functional.max_pool2d(full, 2 * margin + 1, stride=1, padding=margin)
    return grown[0, 0].numpy() > 0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="4096x2160,1920x1080")
    p.add_argument("--tile", default="1024x768", help="h x w of a tile (the models' input)")
    p.add_argument("--overlap", type=int, default=128)
    p.add_argument("--exact", action="store_true", help="compare the gated pixels too")
    args = p.parse_args(argv)
    tile_hw = tuple(int(v) for v in args.tile.lower().split("x"))
    for size in args.sizes.split(","):
        width, height = (int(v) for v in size.lower().split("x"))
        for name, plate in (
            ("person plate", person_plate(height, width)),
            ("60 px figure", distant_plate(height, width)),
        ):
            figures: dict[str, object] = dict(inputs(plate, (tile_hw[0], tile_hw[1]), args.overlap))
            if args.exact:
                figures["exact"] = exactness(plate, (tile_hw[0], tile_hw[1]), args.overlap)
            print(json.dumps({"size": size, "plate": name, **figures}))


if __name__ == "__main__":
    main()
