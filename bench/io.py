"""The pipeline's own cost per frame, with a stand-in model instead of the network:
read EXR -> colour to model encoding -> plan and cut tiles -> (identity stand-in) -> blend
-> write the multi-part EXR and the frame's Zarr region.

Reports frames/s (wall) and core-seconds per frame for each stage (`time.process_time`, which
counts every thread of this process). Target (issue 3): all passes of a 4096x2160 frame in
under 0.3 core-seconds.

    python -m bench.io                              # 1920x1080 and 4096x2160, 3 frames each
    python -m bench.io --sizes 1920x1080 --frames 5 --passes normal,seg
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import OpenEXR

from bench.standins import IdentityModel
from sapiens.seg_classes import SEG_CLASSES
from storage.exr_writer import write_passes_exr
from storage.plate_reader import read_plate_frame
from storage.zarr_store import ShotStoreWriter, create_shot_store
from tasks.blending import FrameBlender
from tasks.colour import ColourConversion
from tasks.tiling import extract_tiles, plan_frame

CHANNELS = {"normal": 3, "albedo": 3, "pointmap": 3, "seg": len(SEG_CLASSES), "matte": None}


def make_plate(path: Path, height: int, width: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([x / width, y / height, 0.5 + 0.25 * np.sin(x / 50.0)], -1) * 0.8
    rgb += rng.normal(0, 0.01, rgb.shape).astype(np.float32)
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    OpenEXR.File(header, {"RGB": rgb.astype(np.float16)}).write(str(path))


class Stages:
    """Core-seconds per stage (`time.process_time`), and the kernel's share of them."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.sys: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str):
        start, sys_start = time.process_time(), os.times().system
        try:
            yield
        finally:
            self.cpu[name] += time.process_time() - start
            self.sys[name] += os.times().system - sys_start


def run(
    height: int,
    width: int,
    frames: int,
    passes: list[str],
    root: Path,
    frames_per_shard: int | None = None,
) -> dict:
    plates = root / f"plates_{width}x{height}"
    plates.mkdir()
    for i in range(frames):
        make_plate(plates / f"plate.{1001 + i:04d}.exr", height, width, i)
    out = root / f"out_{width}x{height}"
    out.mkdir()
    store = str(out / "shot.zarr")
    frame_numbers = list(range(1001, 1001 + frames))
    create_shot_store(
        store,
        frame_numbers,
        height,
        width,
        passes,
        1,
        {"bench": "io"},
        frames_per_shard=max(1, frames_per_shard or frames),
    )
    writer = ShotStoreWriter(store)
    model = IdentityModel()
    colour = ColourConversion("ACEScg")
    stages = Stages()
    wall = time.perf_counter()
    for index, number in enumerate(frame_numbers):
        with stages.stage("read"):
            frame = read_plate_frame(str(plates / f"plate.{number:04d}.exr"), number)
        with stages.stage("colour"):
            rgb = colour.to_model_encoding(frame.pixels[..., :3])
        results: dict[str, np.ndarray] = {}
        for name in passes:
            with stages.stage("tile"):
                plan = plan_frame(height, width, name)
                tiles = extract_tiles(rgb, plan)
            predicted = model.predict(tiles, [name])[name]  # stand-in: not the pipeline's cost
            with stages.stage("blend"):
                blender = FrameBlender.for_plan(plan, CHANNELS[name])
                for tile, values in zip(plan.tiles, predicted, strict=True):
                    blender.add(tile, values)
                results[name] = blender.result()
        with stages.stage("write exr"):
            write_passes_exr(
                str(out / f"passes.{number:04d}.exr"),
                frame,
                results,
                {"sapiens2/weights": "stand-in (identity)"},
                class_names=SEG_CLASSES,
            )
        with stages.stage("write zarr"):
            writer.write_frame(index, results)
    wall = time.perf_counter() - wall
    per_frame = {k: v / frames for k, v in stages.cpu.items()}
    return {
        "size": f"{width}x{height}",
        "frames_per_s": frames / wall,
        "core_s_per_frame": sum(per_frame.values()),
        "stages": per_frame,
        "sys_stages": {k: v / frames for k, v in stages.sys.items()},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="1920x1080,4096x2160", help="comma-separated WxH")
    p.add_argument("--frames", type=int, default=3)
    p.add_argument("--passes", default="normal,pointmap,albedo,matte,seg")
    p.add_argument(
        "--frames-per-shard",
        type=int,
        default=None,
        help="Zarr shard length (default: all frames in one shard). Each frame written into\n"
        "a shard rewrites the shard so far, so later frames of a long shard cost more.",
    )
    args = p.parse_args(argv)
    passes = [s.strip() for s in args.passes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.lower().split("x"))
            r = run(h, w, args.frames, passes, Path(tmp), args.frames_per_shard)
            stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
            print(
                f"{r['size']:>10}: {r['frames_per_s']:.2f} frames/s, "
                f"{r['core_s_per_frame']:.2f} core-s/frame ({stages}); passes: {args.passes}",
                flush=True,
            )
            kernel = ", ".join(f"{k} {v:.2f}" for k, v in r["sys_stages"].items())
            print(f"{'':>12}of which in the kernel (page faults, file I/O): {kernel}", flush=True)


if __name__ == "__main__":
    main()
