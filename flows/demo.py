"""The demo shot: an astronaut's portrait (NASA's, public domain; `demo_astronaut.png` beside
this module holds the same pixels as scikit-image's ``data.astronaut()``, so the demo needs
no scikit-image) drifting and zooming over a few dozen frames, written as a scene-linear
(linear Rec.709) half float EXR sequence with a timecode and frame rate, the way a plate
arrives from the scan."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import OpenEXR
from PIL import Image

DEMO_COLORSPACE = "lin_rec709"
PERSON = Path(__file__).with_name("demo_astronaut.png")
DEMO_FIRST_FRAME = 1001


def srgb_to_linear(values: np.ndarray) -> np.ndarray:
    """The inverse sRGB transfer function (IEC 61966-2-1)."""
    return np.where(values <= 0.04045, values / 12.92, ((values + 0.055) / 1.055) ** 2.4)


def demo_frame(index: int, frames: int, width: int, height: int) -> np.ndarray:
    """Frame `index` of the animation as scene-linear float32 RGB (H, W, 3)."""
    person = Image.open(PERSON).convert("RGB")
    t = index / max(1, frames - 1)
    scale = height / person.height * (0.9 + 0.15 * t)
    size = max(1, round(person.width * scale)), max(1, round(person.height * scale))
    person = person.resize(size, Image.Resampling.LANCZOS)
    canvas = Image.new("RGB", (width, height), (40, 46, 58))
    x = round((width - size[0]) * (0.15 + 0.7 * t))
    y = round((height - size[1]) / 2)
    canvas.paste(person, (x, y))
    display = np.asarray(canvas, dtype=np.float32) / 255.0
    return srgb_to_linear(display).astype(np.float32)


def write_demo_plate(
    directory: str | Path, frames: int = 24, width: int = 640, height: int = 360
) -> str:
    """Write the sequence; returns its pattern (``.../astronaut.####.exr``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for index in range(frames):
        number = DEMO_FIRST_FRAME + index
        rgb = demo_frame(index, frames, width, height).astype(np.float16)
        header = {
            "compression": OpenEXR.ZIP_COMPRESSION,
            "type": OpenEXR.scanlineimage,
            "framesPerSecond": Fraction(24, 1),
            "owner": "svfx demo (NASA astronaut portrait, public domain)",
        }
        path = out / f"astronaut.{number:04d}.exr"
        tmp = path.with_suffix(".exr.tmp")
        OpenEXR.File(header, {"RGB": rgb}).write(str(tmp))
        if path.exists() and path.read_bytes() == tmp.read_bytes():
            tmp.unlink()  # unchanged: its mtime (the frame's fingerprint) stays, so a second
            continue  # demo finds every frame done instead of redoing the shot
        tmp.replace(path)
    return str(out / "astronaut.####.exr")
