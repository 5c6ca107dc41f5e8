"""One multi-part OpenEXR per frame holding the Sapiens2 passes, laid out the way Nuke reads them.

The writer is told its parts as ``storage.layers.ExrLayer`` values (the pass table,
``schemas.passes``, declares them); parts, channels, pixel types and compression follow
ARCHITECTURE.md ("Outputs"):

| part             | channels                           | type  | from pass  |
|------------------|------------------------------------|-------|------------|
| `N`              | `N.x N.y N.z`                      | half  | `normal`   |
| `P`              | `P.x P.y P.z depth.Z`              | float | `pointmap` |
| `relDepth`       | `relDepth.Z`                       | float | `depth`    |
| `albedo`         | `albedo.R albedo.G albedo.B`       | half  | `albedo`   |
| `matte`          | `matte.A`                          | half  | `matte`    |
| `CryptoBodyPart` | `CryptoBodyPart00..02.R/G/B/A`     | float | `seg`      |
| `seg`            | `seg.id` (argmax class index)      | uint  | `seg`      |

Every part is a ZIP-compressed scanline image (never DWA: DWA is lossy on `R/G/B/Y` suffixes
and would corrupt data and Cryptomatte IDs), carries the plate's data window, display window,
pixel aspect ratio and the safe standard attributes (timecode, frame rate, capture date, ...),
its `colorInteropID`, and the caller's provenance strings. Every channel carries its layer
prefix, because Nuke and OpenImageIO derive layers from channel names, not part names.

Layout `single` puts every layer in one part instead, for readers that take only a file's
first part (cryptomatte-api, many outside Nuke): one header, channels of each layer's own
pixel type side by side (OpenEXR types channels, not parts). What a part's header says of
its layer is said per layer there, the layer's name ending the key:
`sapiens2/content/<layer>`, `sapiens2/colorInteropID/<layer>`, `sapiens2/classNames/<layer>`;
the file's own `colorInteropID` is written only when every layer has the same one (`data`
unless albedo is among them). Reading one layer decodes every channel of its scanlines, so
the default stays `multipart`.

The Cryptomatte metadata (`cryptomatte/<key>/...`) is written into the header of *every*
part when the `CryptoBodyPart` part is written, not only into that part: Nuke users report
Cryptomatte layers missing from the metadata of multi-part files whose Cryptomatte sits in a
later part (Psyop/Cryptomatte#145; Fusion: #137), while per-part readers look in the part that
holds the channels. The manifest is ~1 KB. Not yet checked in Nuke itself.

Compression: ZIP at OpenEXR's default deflate level, for every part: every EXR reader has it,
and no other level or codec that most DCCs read is both faster and smaller
(docs/design/exr-compression.md). The writer only checks and encodes: every plane arrives in
its final type from the model's device (`tasks.frame_passes`). The encoder runs in OpenEXR's
global thread pool, which the chunk worker sizes to its cores (it is 0, the calling thread
only, by default), writing straight into the atomic temporary file rather than through an
in-memory copy of the encoded frame.
Channel planes must be C-contiguous: the binding ignores numpy strides for planes (a strided
view is written wrong); an (H, W, 3) R/G/B layer is read through its strides.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import OpenEXR

from storage import cryptomatte
from storage.atomic import WriteResult, atomic_open
from storage.errors import FrameError
from storage.frame import Box, Frame
from storage.layers import ExrLayer, ExrLayout
from storage.location import Where, as_location

log = logging.getLogger(__name__)

_NTSC_RATES = tuple(Fraction(base * 1000, 1001) for base in (24, 30, 48, 60, 120))
DEFAULT_CAMERA_AXES = "opencv: +x right, +y down, +z forward"
CAMERA_AXES_KEY = "sapiens2/cameraAxes"
CLASS_NAMES_KEY = "sapiens2/classNames"  # JSON list on a class-index part: id -> name
CONTENT_KEY = "sapiens2/content"  # what a part's layer holds (single-part: CONTENT_KEY/<layer>)
# Attributes the writer owns; provenance may not override them.
_RESERVED = frozenset(
    {
        "name",
        "type",
        "channels",
        "compression",
        "dataWindow",
        "displayWindow",
        "lineOrder",
        "pixelAspectRatio",
        "screenWindowCenter",
        "screenWindowWidth",
        "chunkCount",
        "version",
        "view",
        "tiles",
        "colorInteropID",
        CONTENT_KEY,
        CLASS_NAMES_KEY,
    }
)
# Keys a single-part file gives each layer (`_per_layer`) and the Cryptomatte's own.
_OWNED_PREFIXES = (
    "cryptomatte/",
    f"{CONTENT_KEY}/",
    f"{CLASS_NAMES_KEY}/",
    "sapiens2/colorInteropID/",
)
# Standard plate attributes we copy, with the other spellings readers use (OpenImageIO names).
_PLATE_ATTRIBUTE_ALIASES: dict[str, tuple[str, ...]] = {
    "timeCode": ("timeCode", "timecode", "smpte:TimeCode"),
    "framesPerSecond": ("framesPerSecond", "FramesPerSecond", "fps"),
    "capDate": ("capDate", "DateTime"),
    "utcOffset": ("utcOffset",),
    "owner": ("owner", "Copyright"),
    "comments": ("comments", "ImageDescription"),
    "keyCode": ("keyCode",),
    "worldToCamera": ("worldToCamera",),
    "worldToNDC": ("worldToNDC",),
}


def write_passes_exr(
    where: Where,
    plate: Frame,
    layers: Sequence[ExrLayer],
    parts: Mapping[str, Mapping[str, np.ndarray]],
    provenance: Mapping[str, Any],
    *,
    class_names: Sequence[str] | None = None,
    scene_linear_id: str = "lin_ap1_scene",
    layout: ExrLayout = "multipart",
) -> WriteResult:
    """Write one frame's parts as a multi-part EXR at `where`, atomically (local or S3), or,
    with `layout` "single", every part's channels in the one part of a single-part EXR.

    `layers` are the parts the file may hold, in the order they are written; `parts` maps
    the names of those given to their channels, already in the layer's pixel type and
    covering the plate's data window: a plane (H, W) per channel name (`N.x`, ...), or,
    where the channels are a layer's R, G, B, one (H, W, 3) array under the layer's name
    (`albedo`), which OpenEXR writes from its strides as it is. Making those arrays is
    per-pixel work done on the model's device (`tasks.frame_passes`); this module only
    checks and encodes them. `plate` supplies the windows, pixel aspect and header
    attributes (its pixels are not used). `class_names[c]` names class `c` (needed for
    Cryptomatte and class-index parts). A scene-linear layer is tagged `scene_linear_id`
    (its `colorInteropID`), every other `data`. `provenance` becomes string attributes on
    every part; `sapiens2/cameraAxes` defaults to DEFAULT_CAMERA_AXES. Raises FrameError
    naming the file and frame on bad input.
    """
    where = as_location(where)
    uri = where.uri
    exr = _build_file(
        plate,
        layers,
        parts,
        provenance,
        class_names=class_names,
        scene_linear_id=scene_linear_id,
        uri=uri,
        layout=layout,
    )
    # Straight into the atomic temporary file: no in-memory copy of the encoded frame.
    writer = atomic_open(where)
    with writer as handle:
        _encode(exr, handle, uri, plate.frame)
    assert writer.result is not None
    return writer.result


def _encode(exr: OpenEXR.File, target: Any, uri: str, frame: int | None) -> None:
    try:
        exr.write(target)
    except Exception as exc:
        raise FrameError(uri, frame, f"OpenEXR could not encode the file: {exc}") from exc


def _build_file(
    plate: Frame,
    layers: Sequence[ExrLayer],
    parts: Mapping[str, Mapping[str, np.ndarray]],
    provenance: Mapping[str, Any],
    *,
    class_names: Sequence[str] | None,
    scene_linear_id: str,
    uri: str,
    layout: ExrLayout = "multipart",
) -> OpenEXR.File:
    """The parts of the file, checked, ready to encode."""

    def fail(reason: str) -> FrameError:
        return FrameError(uri, plate.frame, reason)

    known = [layer.part for layer in layers]
    unknown = [part for part in parts if part not in known]
    if unknown:
        raise fail(f"unknown EXR parts {unknown}; known parts are {known}")
    chosen = [layer for layer in layers if layer.part in parts]
    if not chosen:
        raise fail(f"no part to write; give any of {known}")
    size = _window_size(plate.data_window)
    base = _base_header(plate, provenance, fail)
    labelled = [layer.part for layer in chosen if layer.cryptomatte or layer.class_names]
    if labelled and not class_names:
        raise fail(f"class_names are required to write the {' and '.join(labelled)} parts")
    for layer in (layer for layer in chosen if layer.cryptomatte):
        assert class_names is not None
        try:
            base.update(cryptomatte.metadata(layer.part, class_names))
        except ValueError as exc:
            raise fail(str(exc)) from exc

    checked: dict[str, dict[str, np.ndarray]] = {}
    for layer in chosen:
        try:
            checked[layer.part] = _checked_channels(layer, parts[layer.part], size)
        except ValueError as exc:
            raise fail(f"part {layer.part!r}: {exc}") from exc
    described = {
        layer.part: _layer_attributes(layer, scene_linear_id, class_names) for layer in chosen
    }
    if layout == "single":
        header = dict(base)
        for part, attributes in described.items():
            header.update({_per_layer(key, part): value for key, value in attributes.items()})
        interop = {attributes["colorInteropID"] for attributes in described.values()}
        if len(interop) == 1:
            header["colorInteropID"] = interop.pop()
        merged = {name: plane for channels in checked.values() for name, plane in channels.items()}
        return OpenEXR.File(header, merged)
    return OpenEXR.File(
        [
            OpenEXR.Part({**base, **described[part]}, channels, part)
            for part, channels in checked.items()
        ]
    )


def _per_layer(key: str, layer: str) -> str:
    """A part's attribute key as a single-part file's, for one of its layers."""
    return f"{key if key.startswith('sapiens2/') else 'sapiens2/' + key}/{layer}"


def _layer_attributes(
    layer: ExrLayer, scene_linear_id: str, class_names: Sequence[str] | None
) -> dict[str, str]:
    """What a part's header says of its layer (keyed per layer in a single-part file)."""
    attributes = {
        "colorInteropID": scene_linear_id if layer.scene_linear else "data",
        CONTENT_KEY: layer.content,
    }
    if layer.class_names:
        attributes[CLASS_NAMES_KEY] = json.dumps(list(class_names or ()))
    return attributes


def part_channels(layer: ExrLayer, crypto_ranks: int = cryptomatte.DEFAULT_RANKS) -> list[str]:
    """The channel names of a part, in the order the device makes its planes."""
    if layer.cryptomatte:
        return cryptomatte.channel_names(layer.part, crypto_ranks)
    return list(layer.channels)


def _checked_channels(
    layer: ExrLayer, given: Mapping[str, np.ndarray], size: tuple[int, int]
) -> dict[str, np.ndarray]:
    """The part's channels as OpenEXR takes them: every expected channel present once, in
    the part's pixel type, of the data window's size, C-contiguous (the binding ignores
    numpy strides for planes: a strided view is written wrong)."""
    dtype = np.dtype(layer.dtype)
    names: list[str] = []
    channels: dict[str, np.ndarray] = {}
    for key, array in given.items():
        values = np.asarray(array)
        if values.ndim == 3 and values.shape[-1] == 3:
            names.extend(f"{key}.{c}" for c in "RGB")
            want: tuple[int, ...] = (*size, 3)
        else:
            names.append(key)
            want = size
        if values.shape != want:
            raise ValueError(
                f"{key} has shape {values.shape}, expected {want} (the plate's data window)"
            )
        if values.dtype != dtype:
            raise ValueError(f"{key} is {values.dtype}, the part's pixel type is {dtype}")
        channels[key] = np.ascontiguousarray(values)
    expected = (
        part_channels(layer, 2 * (len(names) // 4))
        if layer.cryptomatte and names and len(names) % 4 == 0
        else part_channels(layer)
    )
    if sorted(names) != sorted(expected):
        raise ValueError(f"channels {sorted(names)} given, expected {expected}")
    return channels


def _window_size(window: Box) -> tuple[int, int]:
    xmin, ymin, xmax, ymax = window
    return ymax - ymin + 1, xmax - xmin + 1


def _box(window: Box) -> tuple[np.ndarray, np.ndarray]:
    xmin, ymin, xmax, ymax = window
    return np.array([xmin, ymin], dtype=np.int32), np.array([xmax, ymax], dtype=np.int32)


def _base_header(plate: Frame, provenance: Mapping[str, Any], fail: Any) -> dict[str, Any]:
    header: dict[str, Any] = {
        "type": OpenEXR.scanlineimage,
        "compression": OpenEXR.ZIP_COMPRESSION,
        "lineOrder": OpenEXR.INCREASING_Y,
        "dataWindow": _box(plate.data_window),
        "displayWindow": _box(plate.display_window),
        "pixelAspectRatio": float(plate.pixel_aspect),
    }
    header.update(_plate_attributes(plate.attributes))
    strings = {CAMERA_AXES_KEY: DEFAULT_CAMERA_AXES}
    for key, value in provenance.items():
        if not isinstance(key, str) or not key:
            raise fail(f"provenance keys must be non-empty strings, got {key!r}")
        if key in _RESERVED or key in _PLATE_ATTRIBUTE_ALIASES or key.startswith(_OWNED_PREFIXES):
            raise fail(f"provenance key {key!r} would override an attribute the writer owns")
        if value is None:
            raise fail(f"provenance value for {key!r} is missing (None)")
        strings[key] = str(value)
    header.update(strings)
    return header


def _plate_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The plate's standard attributes in the types OpenEXR expects; unknown forms are logged."""
    copied: dict[str, Any] = {}
    for name, aliases in _PLATE_ATTRIBUTE_ALIASES.items():
        key = next((alias for alias in aliases if alias in attributes), None)
        if key is None:
            continue
        try:
            value = _convert_attribute(name, attributes[key])
        except (TypeError, ValueError) as exc:
            log.warning("plate attribute %r=%r not copied: %s", key, attributes[key], exc)
            continue
        if value is not None:
            copied[name] = value
    return copied


def _convert_attribute(name: str, value: Any) -> Any:
    if name == "timeCode":
        return to_exr_timecode(value)
    if name == "framesPerSecond":
        return to_rational(value)
    if name in ("capDate", "owner", "comments"):
        return str(value)
    if name == "utcOffset":
        return float(value)
    if name == "keyCode":
        if isinstance(value, OpenEXR.KeyCode):
            return value
        raise TypeError("only OpenEXR.KeyCode values are copied")
    matrix = np.asarray(value, dtype=np.float32)
    if matrix.shape != (4, 4):
        raise ValueError(f"expected a 4x4 matrix, got shape {matrix.shape}")
    return matrix


def to_rational(value: Any) -> Fraction:
    """A frame rate as a Fraction (OpenEXR's Python binding writes Fractions as `rational`)."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, tuple | list | np.ndarray) and len(value) == 2:
        return Fraction(int(value[0]), int(value[1]))
    if isinstance(value, str) and "/" in value:
        return Fraction(value)
    rate = float(value)
    if not rate > 0:
        raise ValueError(f"frame rate must be positive, got {value!r}")
    for ntsc in _NTSC_RATES:  # 23.976 means 24000/1001, not 2997/125
        if abs(rate - float(ntsc)) < 1e-3:
            return ntsc
    return Fraction(rate).limit_denominator(1001)


def to_exr_timecode(value: Any) -> OpenEXR.TimeCode:
    """An OpenEXR.TimeCode from the forms readers give.

    Accepted: an OpenEXR.TimeCode; the 10-tuple OpenEXR reads back (hours, minutes, seconds,
    frame, dropFrame, colorFrame, fieldPhase, bgf0, bgf1, bgf2); OpenImageIO's
    `smpte:TimeCode` pair (SMPTE 12M packed time-and-flags, user data); "HH:MM:SS:FF"
    (";" before the frames marks drop frame).
    """
    timecode = OpenEXR.TimeCode()
    if isinstance(value, OpenEXR.TimeCode):
        fields = _timecode_fields(value)
        user_data = value.userData
    elif isinstance(value, str):
        fields, user_data = _parse_timecode_string(value), 0
    else:
        items = [int(item) for item in value]
        if len(items) == 2:
            fields, user_data = _unpack_smpte(items[0]), items[1]
        elif len(items) in (4, 10):
            fields, user_data = tuple(items) + (0,) * (10 - len(items)), 0
        else:
            raise ValueError(f"cannot read a timecode from {value!r}")
    names = (
        "hours",
        "minutes",
        "seconds",
        "frame",
        "dropFrame",
        "colorFrame",
        "fieldPhase",
        "bgf0",
        "bgf1",
        "bgf2",
    )
    for index, (field_name, field_value) in enumerate(zip(names, fields, strict=True)):
        setattr(timecode, field_name, int(field_value) if index < 4 else bool(field_value))
    timecode.userData = user_data
    return timecode


def _timecode_fields(value: OpenEXR.TimeCode) -> tuple[int, ...]:
    return (
        value.hours,
        value.minutes,
        value.seconds,
        value.frame,
        int(value.dropFrame),
        int(value.colorFrame),
        int(value.fieldPhase),
        int(value.bgf0),
        int(value.bgf1),
        int(value.bgf2),
    )


def _parse_timecode_string(text: str) -> tuple[int, ...]:
    drop = ";" in text
    parts = text.replace(";", ":").split(":")
    if len(parts) != 4:
        raise ValueError(f"timecode {text!r} is not HH:MM:SS:FF")
    hours, minutes, seconds, frame = (int(part) for part in parts)
    return (hours, minutes, seconds, frame, int(drop), 0, 0, 0, 0, 0)


def _unpack_smpte(packed: int) -> tuple[int, ...]:
    """Decode SMPTE 12M BCD time-and-flags (the 60-field packing OpenEXR stores)."""

    def bcd(shift: int, tens_bits: int) -> int:
        units = (packed >> shift) & 0xF
        tens = (packed >> (shift + 4)) & ((1 << tens_bits) - 1)
        return tens * 10 + units

    return (
        bcd(24, 2),
        bcd(16, 3),
        bcd(8, 3),
        bcd(0, 2),
        (packed >> 6) & 1,
        (packed >> 7) & 1,
        (packed >> 15) & 1,
        (packed >> 23) & 1,
        (packed >> 30) & 1,
        (packed >> 31) & 1,
    )
