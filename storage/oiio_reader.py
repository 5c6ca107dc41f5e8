"""Decode one DPX, TIFF, PNG or JPEG frame (any format OpenImageIO reads) into a Frame.

Integer code values are scaled to [0, 1] as code / (2**bits - 1), with `bits` taken from
`oiio:BitsPerSample` (10-bit DPX: code / 1023). OpenImageIO's own float conversion goes
through a 16-bit container for 10- and 12-bit files and lands up to 1.5e-5 off code / 1023
(measured with OpenImageIO 3.2); we snap back to the code grid so the values are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import OpenImageIO as oiio

from storage.errors import FrameError
from storage.frame import Frame

# Unsigned integer containers: OpenImageIO maps their codes to [0, 1] (signed ones to [-1, 1],
# which we leave as OpenImageIO gives them).
_INTEGER_BITS = {oiio.UINT8: 8, oiio.UINT16: 16, oiio.UINT32: 32}
_FLOAT_TYPES = {oiio.HALF: ("half", 16), oiio.FLOAT: ("float", 32), oiio.DOUBLE: ("double", 64)}
_DEFAULT_LAYERS = (None, "", "rgba", "RGBA")


def read_oiio_image(
    path: str, uri: str, frame: int | None = None, layer: str | None = None
) -> Frame:
    """Read the first subimage of a local file through OpenImageIO into a float32 Frame."""
    image = oiio.ImageInput.open(path)
    if image is None:
        raise FrameError(uri, frame, f"not a readable image: {oiio.geterror() or 'unknown format'}")
    try:
        spec = image.spec()
        indices = _channel_indices(spec, uri, frame, layer)
        data = image.read_image(0, 0, 0, spec.nchannels, "float")
        if data is None:
            raise FrameError(
                uri, frame, f"cannot read pixels (truncated or corrupt?): {image.geterror()}"
            )
    finally:
        image.close()
    pixels = np.ascontiguousarray(
        np.asarray(data, dtype=np.float32).reshape(spec.height, spec.width, spec.nchannels)[
            ..., indices
        ]
    )
    source_type, bits = _source_type(spec)
    if spec.format.basetype in _INTEGER_BITS and bits <= 16:  # float32 holds 16-bit codes
        max_code = float(2**bits - 1)
        np.multiply(pixels, max_code, out=pixels)
        np.rint(pixels, out=pixels)
        np.divide(pixels, max_code, out=pixels)
    return Frame(
        pixels=pixels,
        uri=uri,
        frame=frame,
        data_window=(spec.x, spec.y, spec.x + spec.width - 1, spec.y + spec.height - 1),
        display_window=(
            spec.full_x,
            spec.full_y,
            spec.full_x + spec.full_width - 1,
            spec.full_y + spec.full_height - 1,
        ),
        pixel_aspect=float(spec.get_float_attribute("PixelAspectRatio", 1.0)),
        channels=tuple(spec.channelnames[i] for i in indices),
        source_type=source_type,
        bit_depth=bits,
        attributes=_writable_attributes(spec),
    )


def _channel_indices(spec: Any, uri: str, frame: int | None, layer: str | None) -> list[int]:
    names = list(spec.channelnames)
    prefix = "" if layer in _DEFAULT_LAYERS else f"{layer}."
    wanted = [f"{prefix}{c}" for c in ("R", "G", "B")]
    if not all(name in names for name in wanted):
        what = "R,G,B" if not prefix else f"layer {layer!r} ({prefix}R,G,B)"
        raise FrameError(
            uri, frame, f"missing channels: no {what}; the file has {', '.join(names) or 'none'}"
        )
    if f"{prefix}A" in names:
        wanted.append(f"{prefix}A")
    return [names.index(name) for name in wanted]


def _source_type(spec: Any) -> tuple[str, int]:
    basetype = spec.format.basetype
    if basetype in _FLOAT_TYPES:
        return _FLOAT_TYPES[basetype]
    if basetype not in _INTEGER_BITS:
        return str(spec.format), int(spec.format.basesize()) * 8
    container = _INTEGER_BITS[basetype]
    bits = min(spec.get_int_attribute("oiio:BitsPerSample", 0) or container, container)
    return f"uint{bits}", bits


def _writable_attributes(spec: Any) -> dict[str, Any]:
    """Scalar and string metadata (timecode, DPX transfer, colour space...) as plain values."""
    kept: dict[str, Any] = {}
    for attribute in spec.extra_attribs:
        value = attribute.value
        if isinstance(value, bool | int | float | str):
            kept[attribute.name] = value
        elif isinstance(value, tuple | list) and all(
            isinstance(item, int | float | str) for item in value
        ):
            kept[attribute.name] = tuple(value)
    return kept
