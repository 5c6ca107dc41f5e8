"""Small synthetic plates for tests: EXRs (OpenEXR) and DPX/TIFF/PNG/JPEG (OpenImageIO)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import OpenEXR
import OpenImageIO as oiio

AP1_CHROMATICITIES = (0.713, 0.293, 0.165, 0.830, 0.128, 0.044, 0.32168, 0.33767)
REC709_CHROMATICITIES = (0.64, 0.33, 0.30, 0.60, 0.15, 0.06, 0.3127, 0.3290)


def ramp(height: int = 6, width: int = 8, channels: int = 3, seed: int = 0) -> np.ndarray:
    """Distinct float32 values in [0, 1.5) so any channel or pixel mix-up shows."""
    rng = np.random.default_rng(seed)
    return (rng.random((height, width, channels)) * 1.5).astype(np.float32)


def window(xmin: int, ymin: int, xmax: int, ymax: int) -> tuple[np.ndarray, np.ndarray]:
    return np.array([xmin, ymin], dtype=np.int32), np.array([xmax, ymax], dtype=np.int32)


def exr_header(**attributes: Any) -> dict[str, Any]:
    header: dict[str, Any] = {
        "compression": OpenEXR.ZIP_COMPRESSION,
        "type": OpenEXR.scanlineimage,
    }
    header.update(attributes)
    return header


def rgb_channels(pixels: np.ndarray, prefix: str = "") -> dict[str, np.ndarray]:
    """Separate R,G,B[,A] channels (optionally `prefix.R` ...) of an (H, W, C) array."""
    names = "RGBA"[: pixels.shape[-1]]
    return {f"{prefix}{name}": np.ascontiguousarray(pixels[..., i]) for i, name in enumerate(names)}


def exr_bytes(
    pixels: np.ndarray | None = None,
    channels: dict[str, np.ndarray] | None = None,
    **header: Any,
) -> bytes:
    """A single-part EXR in memory; pixel types follow the arrays' dtypes."""
    chans = dict(channels) if channels is not None else rgb_channels(_default(pixels))
    buffer = io.BytesIO()
    OpenEXR.File(exr_header(**header), chans).write(buffer)
    return buffer.getvalue()


def write_exr(
    path: str | Path,
    pixels: np.ndarray | None = None,
    channels: dict[str, np.ndarray] | None = None,
    **header: Any,
) -> Path:
    path = Path(path)
    path.write_bytes(exr_bytes(pixels, channels, **header))
    return path


def write_multipart_exr(path: str | Path, parts: dict[str, dict[str, np.ndarray]]) -> Path:
    """One part per entry: part name -> channels."""
    exr_parts = [OpenEXR.Part(exr_header(), dict(chans), name) for name, chans in parts.items()]
    OpenEXR.File(exr_parts).write(str(path))
    return Path(path)


def write_image(
    path: str | Path,
    codes: np.ndarray,
    bits: int,
    attributes: dict[str, Any] | None = None,
) -> Path:
    """Write integer code values (H, W, C) at `bits` per sample with OpenImageIO.

    OpenImageIO scales float input to the file's code range, so code / (2**bits - 1)
    lands exactly on `codes`.
    """
    codes = np.asarray(codes)
    height, width, nchannels = codes.shape
    container = "uint8" if bits <= 8 else "uint16"
    spec = oiio.ImageSpec(width, height, nchannels, container)
    spec.attribute("oiio:BitsPerSample", bits)
    for key, value in (attributes or {}).items():
        spec.attribute(key, value)
    output = oiio.ImageOutput.create(str(path))
    assert output is not None, oiio.geterror()
    assert output.open(str(path), spec), output.geterror()
    normalised = (codes.astype(np.float64) / (2**bits - 1)).astype(np.float32)
    assert output.write_image(normalised), output.geterror()
    output.close()
    return Path(path)


def code_ramp(height: int, width: int, bits: int, channels: int = 3) -> np.ndarray:
    """Integer codes spanning 0..2**bits-1, different per channel."""
    max_code = 2**bits - 1
    count = height * width * channels
    values = np.linspace(0, max_code, count).round().astype(np.int64)
    return values.reshape(height, width, channels)


def write_sequence(
    directory: str | Path,
    frames: Iterable[int],
    name: str = "plate",
    padding: int = 4,
    size: tuple[int, int] = (6, 8),
) -> list[Path]:
    """Half-float RGB EXRs whose red channel holds the frame number / 10000."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for frame in frames:
        pixels = frame_pixels(frame, size)
        path = directory / f"{name}.{str(frame).zfill(padding)}.exr"
        write_exr(path, pixels.astype(np.float16))
        paths.append(path)
    return paths


def frame_pixels(frame: int, size: tuple[int, int] = (6, 8)) -> np.ndarray:
    pixels = np.zeros((*size, 3), dtype=np.float32)
    pixels[..., 0] = frame / 10000.0
    pixels[..., 1] = 0.25
    pixels[..., 2] = 0.5
    return pixels


def _default(pixels: np.ndarray | None) -> np.ndarray:
    return ramp() if pixels is None else pixels


def write_moving_plate(
    directory: str | Path,
    frames: Iterable[int],
    size: tuple[int, int],
    shift: tuple[int, int],
    *,
    cut_at: int | None = None,
    pixel_aspect: float = 1.0,
    name: str = "shift",
) -> str:
    """Grey half-float EXRs of a smooth random texture that moves ``shift`` (x right, y down,
    whole pixels) per frame: frame k+1 holds at (x + dx, y + dy) what frame k holds at (x, y).
    From ``cut_at`` on, another texture (another shot: a cut) moves the same way. Returns the
    sequence's pattern (``<name>.####.exr``)."""
    import cv2

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    frames = sorted(frames)
    width, height = size
    dx, dy = shift
    margin = 4 + max(abs(dx), abs(dy)) * (frames[-1] - frames[0] + 1)

    def texture(seed: int, blur: float, gain: float) -> np.ndarray:
        rng = np.random.default_rng(seed)
        noise = rng.random((height + 2 * margin, width + 2 * margin)).astype(np.float32)
        big = cv2.GaussianBlur(noise, (0, 0), blur)
        return (big - big.min()) / (big.max() - big.min()) * gain + 0.05

    first, other = texture(0, 3.0, 0.8), texture(1, 14.0, 0.3)
    for frame in frames:
        big = other if cut_at is not None and frame >= cut_at else first
        k = frame - frames[0]  # a frame missing from ``frames`` is a hole: its step is skipped
        y0, x0 = margin - dy * k, margin - dx * k
        grey = big[y0 : y0 + height, x0 : x0 + width]
        pixels = np.repeat(grey[..., None], 3, axis=-1).astype(np.float16)
        header = exr_header(pixelAspectRatio=float(pixel_aspect))
        OpenEXR.File(header, {"RGB": pixels}).write(str(directory / f"{name}.{frame:04d}.exr"))
    return str(directory / f"{name}.####.exr")
