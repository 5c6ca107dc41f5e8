"""Temporal QC (tasks/temporal_qc.py) on a synthetic shot, the figure docs/performance quotes: a
person-shaped region moves 1.5 px a frame over a smooth background and its passes follow it;
one frame shakes 8 px and back (plate and passes, as a camera bump does); each dense pass is
perturbed on one frame as a flickering network would (normals tilted 27 degrees, depth pumped
15%, albedo darkened 30%, matte at 60%, two body parts swapped). Prints every frame's score
per pass and which frames the threshold flags. tests/test_temporal_qc.py asserts the same.

    python -m bench.temporal_qc
    python -m bench.temporal_qc --threshold 2.5
    python -m bench.temporal_qc --speed 4 --tilt 10   # fast action, a smaller normal flicker
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np
import OpenEXR

from schemas.passes import zarr_arrays
from storage.location import Location
from storage.zarr_store import create_shot_store
from storage.zarr_writer import write_frame
from tasks.temporal_qc import QcJob, flagged_frames, shot_flicker

W, H = 160, 96
FRAMES = list(range(1001, 1013))
SHAKEN = 1009  # plate and passes 8 px off for one frame, as a camera bump
PERTURBED = {"normal": 1003, "pointmap": 1005, "albedo": 1007, "matte": 1011, "seg": 1004}
SYNTHESISED = tuple(PERTURBED)  # the passes the synthetic shot has (one of each QC metric)
THRESHOLD = 3.0


SPEED = 1.5  # pixels a frame
TILT = 27.0  # degrees: the normal flicker tilts a normal facing the camera this far up


def centre(frame: int, speed: float = SPEED) -> tuple[float, float]:
    x = 60.0 + speed * (frame - FRAMES[0])  # steady motion
    if frame == SHAKEN:
        x += 8.0
    return x, 48.0 + 2.0 * np.sin(frame / 3.0)


def frame_passes(frame: int, speed: float = SPEED) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The plate (scene-linear RGB) and the passes of one frame."""
    cx, cy = centre(frame, speed)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    u, v = (xx - cx) / 22.0, (yy - cy) / 34.0
    r2 = u**2 + v**2
    matte = np.clip((1.0 - np.sqrt(r2)) * 6.0, 0.0, 1.0)  # a soft-edged ellipse
    inside = r2 < 1.0
    z = np.sqrt(np.clip(1.0 - r2, 0.0, 1.0))
    normal = np.stack([u, -v, z], axis=-1) * inside[..., None]
    normal[~inside] = (0.0, 0.0, 1.0)
    normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
    depth = np.where(inside, 3.0 - 0.3 * z, 6.0)
    pointmap = np.stack([(xx - W / 2) * depth / 200.0, (yy - H / 2) * depth / 200.0, depth], -1)
    seg = np.where(inside, np.where(yy < cy, 1, 2), 0).astype(np.uint8)
    albedo = np.where(inside[..., None], (0.6, 0.45, 0.35), (0.3, 0.3, 0.3)).astype(np.float32)
    background = 0.18 + 0.05 * np.sin(xx / 25.0) * np.cos(yy / 31.0)
    skin = 0.35 + 0.08 * np.sin((xx - cx) / 9.0) * np.cos((yy - cy) / 11.0)  # moves with it
    luma = background * (1 - matte) + skin * matte
    plate = np.stack([luma * 1.1, luma, luma * 0.9], axis=-1).astype(np.float32)
    passes = {"normal": normal, "pointmap": pointmap, "albedo": albedo, "matte": matte, "seg": seg}
    return plate, passes


def perturb(name: str, value: np.ndarray, tilt: float = TILT) -> np.ndarray:
    """What a flickering network does to one frame of a pass (``tilt``: the normals', degrees)."""
    if name == "normal":  # tilted up
        up = math.tan(math.radians(tilt))
        tilted = value + np.array([0.0, up, 0.0], dtype=np.float32)
        return tilted / np.linalg.norm(tilted, axis=-1, keepdims=True)
    if name == "pointmap":
        return value * 1.15  # depth pumps by 15%
    if name == "albedo":
        return value * 0.7
    if name == "matte":
        return value * 0.6
    return np.where(value == 1, 2, np.where(value == 2, 1, value)).astype(np.uint8)  # seg


def write_synthetic_shot(root: Path, speed: float = SPEED, tilt: float = TILT) -> QcJob:
    """The shot's plates (EXR) and Zarr store under ``root``; the QC job that scores it. ``speed``:
    how far the person moves a frame (pixels); ``tilt``: the normal flicker's, in degrees."""
    zarr = str(root / "shot.zarr")
    create_shot_store(zarr, FRAMES, H, W, zarr_arrays(SYNTHESISED), 1, {}, frames_per_shard=4)
    uris = []
    for index, frame in enumerate(FRAMES):
        plate, passes = frame_passes(frame, speed)
        for name, bad in PERTURBED.items():
            if frame == bad:
                passes[name] = perturb(name, passes[name], tilt)
        uri = root / f"plate.{frame:04d}.exr"
        _write_plate(uri, plate)
        uris.append(str(uri))
        write_frame(zarr, index, passes)
    return QcJob(
        zarr=Location(zarr),
        frames=tuple(FRAMES),
        plate_uris=tuple(uris),
        plate_colorspace="lin_rec709",
        passes=(*SYNTHESISED, "pose"),
        plate=Location(str(root / "plate.####.exr")),
    )


def _write_plate(path: Path, rgb: np.ndarray) -> None:
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    channels = {c: np.ascontiguousarray(rgb[..., i]) for i, c in enumerate("RGB")}
    with OpenEXR.File(header, channels) as exr:
        exr.write(str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--speed", type=float, default=SPEED, help="pixels a frame")
    parser.add_argument("--tilt", type=float, default=TILT, help="the normal flicker, degrees")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        flicker = shot_flicker(write_synthetic_shot(Path(root), args.speed, args.tilt))
    flagged = flagged_frames(flicker, args.threshold)
    print(
        f"frames {FRAMES[0]}-{FRAMES[-1]}, moving {args.speed:g} px a frame, shaken {SHAKEN}, "
        f"normals tilted {args.tilt:g} degrees; threshold {args.threshold:g}"
    )
    for name, scores in flicker.items():
        others = [s for f, s in scores.items() if f != PERTURBED[name]]
        print(
            f"{name:9s} perturbed {PERTURBED[name]}: {scores[PERTURBED[name]]:7.2f}   "
            f"others {min(others):.2f}-{max(others):.2f}   shaken {scores[SHAKEN]:.2f}   "
            f"flagged {flagged.get(name, [])}"
        )


if __name__ == "__main__":
    main()
