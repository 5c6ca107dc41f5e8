"""What the motion pass costs per plate frame, in core-seconds (``time.process_time``: every
thread of this process, OpenCV's and torch's included), stage by stage as the chunk worker
runs it, on a synthetic plate whose texture moves a few pixels a frame:

- flow image: the model-encoded RGB's luma reduced to at most 1024 px (reader thread);
- pair flow: `pair_motion` (DIS forward and backward, round-trip confidences, the cut test),
  one pair per frame (each pair gives one frame its forward and the next its backward);
- device: both sides scaled to plate pixels (`to_plate`) and finished (`finish_motion`:
  half planes, v up, the preview's vectors); on this machine's CPU with torch here;
- EXR part: the four half planes, ZIP, as the writer encodes them (the motion part alone);
- Zarr region: the (H, W, 4) half block of one frame (channels last, Blosc);
- preview: the colour wheel and its JPEG;
- neighbour read: a plate frame outside the chunk, read and decoded for its flow image only
  (two per chunk at most: divide by the chunk's length).

    python -m bench.motion                       # 1920x1080 and 4096x2160, 4 frames each
    python -m bench.motion --sizes 4096x2160 --frames 6
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cv2
import numpy as np
import OpenEXR
import torch

from schemas import passes as pass_table
from storage.exr_writer import write_passes_exr
from storage.frame import Frame
from storage.plate_reader import decode_frame
from storage.previews import MAX_SIDE, pass_preview, thumbnail_size, write_image
from storage.zarr_store import create_shot_store
from storage.zarr_writer import write_frame
from tasks.frame_passes import MOTION, PREVIEW_PREFIX, finish_motion
from tasks.plate_flow import DEFAULT_FLOW, flow_image, pair_motion, to_plate

SHIFT = (5, -3)  # px per frame at 1920 wide; scaled with the width


def plate(width: int, height: int, frame: int) -> np.ndarray:
    """(H, W, 3) float32 in 0..1: a smooth texture moving SHIFT (scaled) per frame."""
    scale = width / 1920
    dx, dy = (round(v * scale) for v in SHIFT)
    margin = 8 + 64 * max(abs(dx), abs(dy))
    rng = np.random.default_rng(0)
    noise = rng.random(((height + 2 * margin) // 4, (width + 2 * margin) // 4), np.float32)
    big = cv2.resize(cv2.GaussianBlur(noise, (0, 0), 2.0), None, fx=4, fy=4)
    big = (big - big.min()) / (big.max() - big.min())
    y0, x0 = margin - dy * frame, margin - dx * frame
    grey = big[y0 : y0 + height, x0 : x0 + width]
    return np.ascontiguousarray(np.repeat(grey[..., None], 3, axis=-1))


def measure(width: int, height: int, frames: int, root: Path) -> dict[str, float]:
    """Mean core-seconds per frame of each stage, over ``frames`` frames (after one frame
    through every stage to warm up)."""
    costs: dict[str, list[float]] = {}

    @contextmanager
    def stage(name: str) -> Iterator[None]:
        start = time.process_time()
        yield
        costs.setdefault(name, []).append(time.process_time() - start)

    spec = pass_table.BY_NAME[MOTION]
    assert spec.zarr is not None
    zarr = str(root / f"motion_{width}x{height}.zarr")
    create_shot_store(zarr, list(range(frames + 1)), height, width, [spec.zarr], 1, {}, 1)
    window = (0, 0, width - 1, height - 1)
    pw, ph = thumbnail_size(width, height, MAX_SIDE)
    raw = root / "plate.exr"
    rgb = plate(width, height, 0)
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    OpenEXR.File(header, {"RGB": rgb.astype(np.float16)}).write(str(raw))
    previous = flow_image(rgb)
    forward_u = 0.0
    for frame in range(frames + 1):  # frame 0 warms up and is dropped
        rgb = plate(width, height, frame + 1)
        with stage("flow image"):
            image = flow_image(rgb)
        with stage("pair flow"):
            pair = pair_motion(previous, image)
        assert not pair.cut
        previous = image
        with stage("device (CPU torch)"):
            forward = to_plate(pair.forward, (height, width), "cpu")
            backward = to_plate(pair.backward, (height, width), "cpu")
            out = finish_motion(forward, backward, preview_hw=(ph, pw))
        arrays = {name: value.numpy() for name, value in out.items()}
        planes = arrays[MOTION]
        info = Frame(np.zeros((1, 1, 3), np.float32), "plate.exr", frame, window, window)
        parts = {spec.exr[0].part: dict(zip(spec.exr[0].channels, planes, strict=True))}
        with stage("EXR part (ZIP)"):
            write_passes_exr(str(root / "motion.exr"), info, spec.exr, parts, {})
        with stage("Zarr region"):
            write_frame(zarr, frame, {MOTION: np.ascontiguousarray(np.moveaxis(planes, 0, -1))})
        with stage("preview"):
            preview = pass_preview("motion", arrays[PREVIEW_PREFIX + MOTION])
            write_image(str(root / "motion.jpg"), preview)
        middle = planes[0][height // 4 : -height // 4, width // 4 : -width // 4]
        forward_u = float(np.median(middle.astype(np.float32)))
    for _ in range(3):
        with stage("neighbour read"):
            decoded = decode_frame(raw.read_bytes(), str(raw), frame=0)
            flow_image(np.ascontiguousarray(decoded.pixels[..., :3], dtype=np.float32))
    means = {name: float(np.mean(values[1:])) for name, values in costs.items()}
    means["_forward_u"] = forward_u
    return means


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1920x1080,4096x2160")
    parser.add_argument("--frames", type=int, default=4)
    args = parser.parse_args(argv)
    print(
        f"torch threads {torch.get_num_threads()}, OpenCV threads {cv2.getNumThreads()}, "
        f"flow {DEFAULT_FLOW.preset} at most {DEFAULT_FLOW.max_side} px"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            width, height = (int(v) for v in size.split("x"))
            costs = measure(width, height, args.frames, Path(tmp))
            expected = round(SHIFT[0] * width / 1920)
            forward_u = costs.pop("_forward_u")
            edge = costs.pop("neighbour read")
            total = sum(costs.values())
            print(f"\n{width}x{height}, {args.frames} frames: core-s per frame")
            for stage, seconds in costs.items():
                print(f"  {stage:<22} {seconds:7.3f}")
            print(f"  {'total':<22} {total:7.3f}")
            print(f"  neighbour read (decode + flow image), per chunk edge: {edge:.3f}")
            print(f"  (forward u at the middle {forward_u:.2f} px, true {expected})")


if __name__ == "__main__":
    main()
