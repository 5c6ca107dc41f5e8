"""Decode one OpenEXR frame with the OpenEXR 3.5 pythonic API into a Frame.

Single- and multi-part files; half, float and uint channels; the default `rgba` layer
(channels R,G,B[,A]) or a named one (`layer="plate"`: channels `plate.R`... or a part
named `plate`); data and display windows, pixel aspect ratio and header attributes kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, BinaryIO

import numpy as np
import OpenEXR

from storage.errors import FrameError
from storage.frame import Box, Frame
from storage.location import Location, as_location
from storage.native_output import captured_native_output

EXR_MAGIC = b"\x76\x2f\x31\x01"

# Header entries that describe the file layout; the writer sets its own, so never copy them.
_STRUCTURAL = frozenset(
    {
        "channels",
        "chunkCount",
        "compression",
        "dataWindow",
        "displayWindow",
        "lineOrder",
        "maxSamplesPerPixel",
        "name",
        "pixelAspectRatio",
        "tiles",
        "type",
        "version",
    }
)
# OpenEXR 3.5 returns rationals (framesPerSecond) as fractions.Fraction.
_WRITABLE_SCALARS = (
    bool,
    int,
    float,
    str,
    Fraction,
    OpenEXR.TimeCode,
    OpenEXR.KeyCode,
    OpenEXR.Rational,
)
_TYPE_NAMES = {OpenEXR.HALF: "half", OpenEXR.FLOAT: "float", OpenEXR.UINT: "uint32"}
_TYPE_BITS = {"half": 16, "float": 32, "uint32": 32}
_DEFAULT_LAYERS = (None, "", "rgba", "RGBA")


def read_exr(
    source: str | BinaryIO, uri: str, frame: int | None = None, layer: str | None = None
) -> Frame:
    """Read one EXR (a local path or a seekable binary stream) into a float32 Frame.

    UINT channels are kept as their integer values (exact below 2**24): EXR has no
    maximum code value to scale them by. Raises FrameError naming `uri` and `frame`.
    """
    exr = _open(source, uri, frame)
    part, names = _select_channels(exr, uri, frame, layer)
    header = part.header
    data_window = _box(header["dataWindow"])
    height = data_window[3] - data_window[1] + 1
    width = data_window[2] - data_window[0] + 1
    pixels = np.empty((height, width, len(names)), dtype=np.float32)
    types: list[str] = []
    for index, name in enumerate(names):
        channel = part.channels[name]
        if channel.xSampling != 1 or channel.ySampling != 1:
            raise FrameError(
                uri,
                frame,
                f"channel {name} is subsampled ({channel.xSampling}x{channel.ySampling}); "
                "only full-resolution channels are supported",
            )
        if channel.pixels.shape != (height, width):
            raise FrameError(
                uri,
                frame,
                f"channel {name} has shape {channel.pixels.shape}, "
                f"but the data window is {width}x{height}",
            )
        pixels[..., index] = channel.pixels
        types.append(_TYPE_NAMES.get(channel.type(), str(channel.type())))
    source_type = "+".join(sorted(set(types)))
    return Frame(
        pixels=pixels,
        uri=uri,
        frame=frame,
        data_window=data_window,
        display_window=_box(header["displayWindow"]),
        pixel_aspect=float(header.get("pixelAspectRatio", 1.0)),
        channels=tuple(names),
        source_type=source_type,
        bit_depth=max(_TYPE_BITS.get(kind, 32) for kind in types),
        attributes=_writable_attributes(header),
    )


def _is_openexr_line(line: str) -> bool:
    return "EXR_ERR_" in line or line.startswith("Warning: Exception raised")


def _open(source: str | BinaryIO, uri: str, frame: int | None) -> OpenEXR.File:
    failure: Exception | None = None
    with captured_native_output(_is_openexr_line) as said:
        try:
            exr = OpenEXR.File(source, separate_channels=True)
            if not exr.parts:
                raise ValueError("the file has no parts")
        except (RuntimeError, ValueError, TypeError) as exc:
            failure = exc
    if failure is None:
        return exr
    raise FrameError(uri, frame, _diagnose(source, failure, said)) from failure


def _diagnose(source: str | BinaryIO, exc: Exception, said: list[str]) -> str:
    """Tell 'not an EXR' from 'EXR whose pixel data is cut short or damaged'; ``said`` is
    what the library printed while failing (its first line joins the reason)."""
    with captured_native_output(_is_openexr_line):
        try:
            if not isinstance(source, str):
                source.seek(0)
            header = OpenEXR.File(source, header_only=True)
            header_ok = bool(header.parts)
        except (RuntimeError, ValueError, TypeError):
            header_ok = False
    size = _size_text(source)
    detail = f"OpenEXR: {exc}"
    if said:
        detail += "; " + said[0].removeprefix("Warning: ").split(": ", 1)[-1].strip()
    if header_ok:
        return (
            f"truncated or corrupt OpenEXR: the header is readable but the pixel data is not "
            f"({size}; {detail})"
        )
    return f"corrupt OpenEXR: the header cannot be parsed ({size}; {detail})"


def _size_text(source: str | BinaryIO) -> str:
    try:
        if isinstance(source, str):
            return f"{os.path.getsize(source)} bytes"
        return f"{source.seek(0, os.SEEK_END)} bytes"
    except (OSError, ValueError):
        return "size unknown"


def _select_channels(
    exr: OpenEXR.File, uri: str, frame: int | None, layer: str | None
) -> tuple[Any, list[str]]:
    """The part and channel names (R,G,B[,A] order) of the requested layer."""
    parts = list(exr.parts)
    for part in parts:
        if part.type() not in (OpenEXR.scanlineimage, OpenEXR.tiledimage):
            continue  # deep parts carry no flat image to read
        if layer in _DEFAULT_LAYERS:
            names = _rgb_names(part.channels, "")
        else:
            names = _rgb_names(part.channels, f"{layer}.")
            if names is None and part.name() == layer:
                names = _rgb_names(part.channels, "")
        if names is not None:
            return part, names
    wanted = "R,G,B" if layer in _DEFAULT_LAYERS else f"layer {layer!r} ({layer}.R,G,B)"
    raise FrameError(uri, frame, f"missing channels: no {wanted}; the file has {_inventory(parts)}")


def _rgb_names(channels: dict[str, Any], prefix: str) -> list[str] | None:
    rgb = [f"{prefix}{c}" for c in ("R", "G", "B")]
    if not all(name in channels for name in rgb):
        return None
    alpha = f"{prefix}A"
    return [*rgb, alpha] if alpha in channels else rgb


def _inventory(parts: list[Any]) -> str:
    """A readable list of parts and their channels, for error messages."""
    described = []
    for part in parts:
        channels = ", ".join(sorted(part.channels))
        label = f"part {part.name()!r}" if part.name() else f"part {part.part_index}"
        described.append(f"{label}: {channels or 'no channels'}")
    return "; ".join(described)


def _box(value: Any) -> Box:
    low, high = value
    return int(low[0]), int(low[1]), int(high[0]), int(high[1])


def _writable_attributes(header: dict[str, Any]) -> dict[str, Any]:
    """Header attributes an EXR writer can put back as they are (timecode, strings, ...)."""
    kept: dict[str, Any] = {}
    for key, value in header.items():
        if key in _STRUCTURAL:
            continue
        if isinstance(value, np.ndarray):
            if value.size <= 16 and value.dtype.kind in "iuf":  # V2/V3 vectors, M33/M44
                kept[key] = value.copy()
        elif isinstance(value, _WRITABLE_SCALARS):
            kept[key] = value
        elif isinstance(value, tuple | list) and all(
            isinstance(item, int | float | str) for item in value
        ):
            kept[key] = type(value)(value)
    return kept


def read_exr_channels(where: Location | str, frame: int | None = None) -> ExrChannels:
    """Every channel of every part of an EXR (ours: each layer's channels are named
    ``<layer>.<channel>`` in either layout), as arrays in their stored type, and each part's
    header. FrameError naming the file and frame when it cannot be read."""
    location = as_location(where)
    fs, path = location.fs_and_path()
    try:
        with fs.open(path, "rb") as handle:
            exr = _open(handle, location.uri, frame)
            channels = {
                name: np.asarray(channel.pixels)
                for part in exr.parts
                for name, channel in part.channels.items()
            }
            headers = [dict(part.header) for part in exr.parts]
    except OSError as exc:
        raise FrameError(location.uri, frame, f"cannot read it: {exc}") from exc
    return ExrChannels(channels, headers)


@dataclass(frozen=True)
class ExrChannels:
    channels: dict[str, np.ndarray]
    headers: list[dict[str, Any]]

    def attribute(self, key: str) -> Any:
        """The first part's header entry ``key`` found in any part (None if none has it)."""
        return next((h[key] for h in self.headers if key in h), None)
