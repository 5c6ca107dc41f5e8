"""Plate colour -> the model's input encoding, and albedo back to scene-linear (OpenColorIO).

Only OpenColorIO's built-in configs are used (nothing to download). The default is the
ACES studio config pinned by its resolved name (`ocio://studio-config-v5.0.0_aces-v2.1_ocio-v2.6`
with OCIO 2.6), because unlike the CG config it holds the camera log spaces (ARRI LogC3/4,
RED, Sony...) that plates arrive in.

Model encoding: Sapiens2 was trained on 8-bit sRGB-encoded photos, so the model wants
display-referred sRGB values in [0, 1]. By default (`mode="colorimetric"`) the plate goes
through the colorimetric colour-space conversion to "sRGB Encoded Rec.709 (sRGB)" (the
config's "sRGB - Texture"), then values are clamped to [0, 1]. Why not the ACES display view:
the colorimetric path keeps mid-grey where photos keep it (ACEScg 0.18 -> 0.461, about 118
of 255) and keeps hue and saturation, which is what the network saw in training; the ACES 2.0
SDR view tone-maps (0.18 -> 0.349) and desaturates. Its cost: highlights above display white
clip. Shows with hot plates can pick `mode="view"`: display "sRGB - Display", view
"ACES 2.0 - SDR 100 nits (Rec.709)", which compresses highlights into [0, 1], but costs far
more on the CPU (docs/design/colour.md). Either way
the transform used is returned for the provenance record.

Albedo out: albedo is a reflectance, not an exposure, so the model's output is treated as an
sRGB-encoded texture and converted colorimetrically ("sRGB Encoded Rec.709 (sRGB)" -> the
plate's scene-linear working space), never through the inverse of a tone-mapping view.
"""

from __future__ import annotations

import difflib
import functools
import re
import threading
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import PyOpenColorIO as ocio

from storage.frame import Frame

DEFAULT_CONFIG_URI = "ocio://studio-config-latest"
MODEL_ENCODING = "sRGB Encoded Rec.709 (sRGB)"
VIEW_DISPLAY = "sRGB - Display"
VIEW_NAME = "ACES 2.0 - SDR 100 nits (Rec.709)"

ConversionMode = Literal["colorimetric", "view"]
CHUNK_PIXELS = 65536

# Friendly names that are not already names or aliases in the built-in configs.
# "rec709" is Rec.709-encoded camera video (the BT.709 camera OETF), as Nuke's "rec709".
FRIENDLY_ALIASES = {
    "srgb": "sRGB Encoded Rec.709 (sRGB)",
    "srgb_encoded": "sRGB Encoded Rec.709 (sRGB)",
    "linear": "Linear Rec.709 (sRGB)",
    "lin_srgb": "Linear Rec.709 (sRGB)",
    "rec709": "Camera Rec.709",
    "logc": "ARRI LogC3 (EI800)",
    "logc3": "ARRI LogC3 (EI800)",
    "logc3_ei800": "ARRI LogC3 (EI800)",
    "alexa_logc": "ARRI LogC3 (EI800)",
    "logc4": "ARRI LogC4",
    "slog3": "S-Log3 S-Gamut3",
    "slog3_cine": "S-Log3 S-Gamut3.Cine",
    "log3g10": "Log3G10 REDWideGamutRGB",
    "redlog3g10": "Log3G10 REDWideGamutRGB",
    "vlog": "V-Log V-Gamut",
    "data": "Raw",
    "raw": "Raw",
}


@dataclass(frozen=True)
class ColourTransformInfo:
    """What was applied, for the provenance record (EXR headers, Zarr attrs, catalog)."""

    config_name: str
    config_uri: str
    ocio_version: str
    source: str
    target: str
    description: str
    display: str | None = None
    view: str | None = None

    def as_dict(self) -> dict[str, str]:
        return {key: value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class ColourGuess:
    """A default colour space read from file metadata, with the reason to log."""

    colourspace: str
    reason: str
    certain: bool


@dataclass(frozen=True)
class _LoadedConfig:
    config: Any
    name: str
    uri: str
    lookup: dict[str, str]  # folded name -> colour space name


class ColourConversion:
    """Converts one plate's colour space to the model encoding and albedo back.

    `working_space` (the scene-linear space albedo is returned in) defaults to
    `working_space_for(plate_space)`.
    """

    def __init__(
        self,
        plate_space: str,
        *,
        working_space: str | None = None,
        mode: ConversionMode = "colorimetric",
        config_uri: str = DEFAULT_CONFIG_URI,
    ) -> None:
        if mode not in ("colorimetric", "view"):
            raise ValueError(f"mode must be 'colorimetric' or 'view', not {mode!r}")
        self.config_uri = config_uri
        self.mode: ConversionMode = mode
        self.plate_space = resolve_colourspace(plate_space, config_uri)
        self.working_space = (
            resolve_colourspace(working_space, config_uri)
            if working_space is not None
            else working_space_for(self.plate_space, config_uri)
        )
        loaded = _load_config(config_uri)
        common = {
            "config_name": loaded.name,
            "config_uri": loaded.uri,
            "ocio_version": ocio.__version__,
        }
        if mode == "view":
            self.to_model_info = ColourTransformInfo(
                **common,
                source=self.plate_space,
                target=f"{VIEW_DISPLAY} / {VIEW_NAME}",
                description=(
                    f"DisplayViewTransform {self.plate_space!r} -> display {VIEW_DISPLAY!r}, "
                    f"view {VIEW_NAME!r} (tone-mapped), clamped to [0, 1]"
                ),
                display=VIEW_DISPLAY,
                view=VIEW_NAME,
            )
        else:
            self.to_model_info = ColourTransformInfo(
                **common,
                source=self.plate_space,
                target=MODEL_ENCODING,
                description=(
                    f"ColorSpaceTransform {self.plate_space!r} -> {MODEL_ENCODING!r} "
                    "(colorimetric, no tone mapping), clamped to [0, 1]"
                ),
            )
        self.albedo_info = ColourTransformInfo(
            **common,
            source=MODEL_ENCODING,
            target=self.working_space,
            description=(
                f"ColorSpaceTransform {MODEL_ENCODING!r} -> {self.working_space!r} "
                "(albedo treated as an sRGB-encoded texture, input clamped to [0, 1])"
            ),
        )

    @property
    def albedo_interop_id(self) -> str:
        """The EXR ``colorInteropID`` of the space albedo is returned in (``lin_rec709_scene``
        for an sRGB or Rec.709 plate, ``lin_ap1_scene`` for ACEScg); "unknown" when the
        config gives none."""
        space = _load_config(self.config_uri).config.getColorSpace(self.working_space)
        return (_interop_id(space) if space is not None else "") or "unknown"

    def to_model_encoding(self, pixels: np.ndarray, *, inplace: bool = False) -> np.ndarray:
        """Plate pixels (H, W, 3|4) -> sRGB-encoded values in [0, 1]; alpha passes through."""
        processor = _processor(self.config_uri, self.plate_space, MODEL_ENCODING, self.mode)
        out = _apply(processor, pixels, inplace)
        np.clip(out, 0.0, 1.0, out=out)
        return out

    def albedo_to_scene_linear(
        self, albedo_rgb: np.ndarray, *, inplace: bool = False
    ) -> np.ndarray:
        """Model albedo (sRGB-encoded, [0, 1]) -> scene-linear in `working_space`."""
        out = _writable_float32(albedo_rgb, inplace)
        np.clip(out, 0.0, 1.0, out=out)
        processor = _processor(self.config_uri, MODEL_ENCODING, self.working_space, "colorimetric")
        return _apply(processor, out, inplace=True)


def to_model_encoding(
    pixels: np.ndarray,
    plate_space: str,
    *,
    mode: ConversionMode = "colorimetric",
    config_uri: str = DEFAULT_CONFIG_URI,
    inplace: bool = False,
) -> tuple[np.ndarray, ColourTransformInfo]:
    """Convert plate pixels to the model's encoding; returns (pixels, transform record)."""
    conversion = ColourConversion(plate_space, mode=mode, config_uri=config_uri)
    return conversion.to_model_encoding(pixels, inplace=inplace), conversion.to_model_info


def albedo_to_scene_linear(
    albedo_rgb: np.ndarray,
    working_space: str = "ACEScg",
    *,
    config_uri: str = DEFAULT_CONFIG_URI,
    inplace: bool = False,
) -> tuple[np.ndarray, ColourTransformInfo]:
    """Model albedo -> scene-linear `working_space`; returns (pixels, transform record)."""
    conversion = ColourConversion(
        MODEL_ENCODING, working_space=working_space, config_uri=config_uri
    )
    out = conversion.albedo_to_scene_linear(albedo_rgb, inplace=inplace)
    return out, conversion.albedo_info


def resolve_colourspace(name: str, config_uri: str = DEFAULT_CONFIG_URI) -> str:
    """The config's colour space for a name, alias, role or friendly alias (any case).

    Raises ValueError listing close matches when nothing fits.
    """
    loaded = _load_config(config_uri)
    key = _fold(name)
    if key in loaded.lookup:
        return loaded.lookup[key]
    loose = _squash(name)
    loose_hits = {space for folded, space in loaded.lookup.items() if _squash(folded) == loose}
    if len(loose_hits) == 1:
        return loose_hits.pop()
    close = difflib.get_close_matches(key, list(loaded.lookup), n=6, cutoff=0.6)
    suggestions = sorted({loaded.lookup[match] for match in close})
    if suggestions:
        hint = f"; close matches: {', '.join(suggestions)}"
    else:
        hint = f"; try one of {', '.join(sorted(FRIENDLY_ALIASES))}, acescg, aces, lin_rec709"
    raise ValueError(f"unknown colour space {name!r} in OCIO config {loaded.name}{hint}")


def working_space_for(plate_space: str, config_uri: str = DEFAULT_CONFIG_URI) -> str:
    """Scene-linear space to return colour passes in for a plate colour space.

    A scene-linear plate keeps its own space; a Rec.709-primaries encoded plate (sRGB,
    Rec.709 video) goes to "Linear Rec.709 (sRGB)"; everything else (camera logs, ACEScct)
    to the config's `scene_linear` role (ACEScg).
    """
    loaded = _load_config(config_uri)
    space = loaded.config.getColorSpace(resolve_colourspace(plate_space, config_uri))
    if space.getEncoding() == "scene-linear":
        return str(space.getName())
    interop = _interop_id(space)
    if interop.endswith("_rec709_scene"):
        return resolve_colourspace("lin_rec709", config_uri)
    return str(loaded.config.getColorSpace(ocio.ROLE_SCENE_LINEAR).getName())


def guess_colourspace(frame: Frame, config_uri: str = DEFAULT_CONFIG_URI) -> ColourGuess:
    """A sensible default colour space from a frame's metadata and bit depth, with why.

    Order: the EXR `colorInteropID` tag, EXR chromaticities, a DPX transfer field we can
    interpret, OpenImageIO's `oiio:ColorSpace` (which may be the format's default), then
    conventions: float/half -> ACEScg; DPX -> camera log; other integer files -> sRGB.
    `certain` is False when the answer is a convention rather than something the file
    states: log the reason and ask for the plate's declared colour space.
    """
    attributes = frame.attributes
    interop = attributes.get("colorInteropID")
    if isinstance(interop, str) and (space := _try_resolve(interop, config_uri)):
        return ColourGuess(space, f"the EXR colorInteropID is {interop!r}: {space}", certain=True)
    chromaticities = attributes.get("chromaticities")
    if chromaticities is not None:
        return _guess_from_chromaticities(tuple(chromaticities), config_uri)
    transfer = attributes.get("dpx:Transfer")
    is_dpx = transfer is not None or frame.uri.lower().endswith(".dpx")
    if is_dpx and str(transfer or "").strip().lower() in _DPX_TRANSFERS:
        return _guess_from_dpx(frame, str(transfer), config_uri)
    tag = attributes.get("oiio:ColorSpace")
    if isinstance(tag, str) and (space := _try_resolve(tag, config_uri)):
        return ColourGuess(
            space,
            f"OpenImageIO reports oiio:ColorSpace {tag!r} (from the file's tags or the "
            f"format's default): {space}",
            certain=False,
        )
    if frame.source_type in ("half", "float", "double", "float+half"):
        return ColourGuess(
            resolve_colourspace("ACEScg", config_uri),
            f"{frame.source_type} pixels and no colour metadata: float plates are "
            "scene-linear by convention; assuming ACEScg",
            certain=False,
        )
    if is_dpx:
        return _guess_from_dpx(frame, str(transfer or ""), config_uri)
    return ColourGuess(
        resolve_colourspace("srgb", config_uri),
        f"{frame.bit_depth}-bit integer image without colour metadata: assuming sRGB encoded",
        certain=False,
    )


def _try_resolve(name: str, config_uri: str) -> str | None:
    try:
        return resolve_colourspace(name, config_uri) if name else None
    except ValueError:
        return None


def _guess_from_chromaticities(chromaticities: tuple[float, ...], config_uri: str) -> ColourGuess:
    import OpenEXR  # the binding knows the standard primaries

    interop = OpenEXR.chromaticitiesToColorInteropID(chromaticities)
    if interop:
        space = resolve_colourspace(interop, config_uri)
        return ColourGuess(
            space, f"the EXR chromaticities match {interop} primaries: {space}", certain=True
        )
    return ColourGuess(
        resolve_colourspace("ACEScg", config_uri),
        f"the EXR chromaticities {chromaticities} match no known primaries; assuming ACEScg",
        certain=False,
    )


_DPX_TRANSFERS = {
    "itu-r 709-4": ("rec709", True),
    "smpte 274m": ("rec709", True),
    "linear": ("lin_rec709", False),
    "logarithmic": ("logc3", False),
    "printing density": ("logc3", False),
}


def _guess_from_dpx(frame: Frame, transfer: str, config_uri: str) -> ColourGuess:
    known = _DPX_TRANSFERS.get(transfer.strip().lower())
    if known is not None:
        alias, certain = known
        space = resolve_colourspace(alias, config_uri)
        note = "" if certain else " (the header does not say which curve; declare it to be sure)"
        return ColourGuess(
            space, f"{frame.bit_depth}-bit DPX with transfer {transfer!r}: {space}{note}", certain
        )
    described = f"transfer {transfer!r} tells nothing usable" if transfer else "no transfer field"
    space = resolve_colourspace("logc3", config_uri)
    return ColourGuess(
        space,
        f"{frame.bit_depth}-bit DPX, {described}: assuming camera log {space}, the most common "
        "DPX plate encoding; declare the plate's colour space",
        certain=False,
    )


def _interop_id(space: Any) -> str:
    getter = getattr(space, "getInteropID", None)
    return str(getter() or "") if getter is not None else ""


def _fold(name: str) -> str:
    return name.strip().casefold()


def _squash(name: str) -> str:
    """Loose key: case, spaces, dashes, dots, underscores and brackets ignored."""
    return re.sub(r"[^0-9a-z]", "", name.casefold())


@functools.lru_cache(maxsize=8)
def _load_config(config_uri: str) -> _LoadedConfig:
    resolved = ocio.ResolveConfigPath(config_uri)
    config = ocio.Config.CreateFromFile(resolved)
    lookup: dict[str, str] = {}
    for space in config.getColorSpaces():
        name = str(space.getName())
        lookup.setdefault(_fold(name), name)
        for alias in space.getAliases():
            lookup.setdefault(_fold(alias), name)
    for role, space_name in config.getRoles():
        space = config.getColorSpace(space_name)
        if space is not None:
            lookup.setdefault(_fold(role), str(space.getName()))
    for alias, target in FRIENDLY_ALIASES.items():
        space = config.getColorSpace(target)
        if space is not None:
            lookup.setdefault(_fold(alias), str(space.getName()))
    return _LoadedConfig(config=config, name=str(config.getName()), uri=resolved, lookup=lookup)


_PROCESSOR_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _processor(config_uri: str, source: str, target: str, mode: str) -> Any:
    """A cached CPU processor (building one means finalising an op chain)."""
    with _PROCESSOR_LOCK:
        config = _load_config(config_uri).config
        if mode == "view":
            transform = ocio.DisplayViewTransform(src=source, display=VIEW_DISPLAY, view=VIEW_NAME)
            processor = config.getProcessor(transform)
        else:
            processor = config.getProcessor(source, target)
        return processor.getDefaultCPUProcessor()


def _writable_float32(pixels: np.ndarray, inplace: bool) -> np.ndarray:
    if pixels.ndim != 3 or pixels.shape[-1] not in (3, 4):
        raise ValueError(f"expected pixels shaped (H, W, 3) or (H, W, 4), got {pixels.shape}")
    if inplace:
        if pixels.dtype != np.float32 or not pixels.flags.c_contiguous:
            raise ValueError("inplace conversion needs a C-contiguous float32 array")
        return pixels
    return np.array(pixels, dtype=np.float32, order="C", copy=True)


def _apply(processor: Any, pixels: np.ndarray, inplace: bool) -> np.ndarray:
    """Run the processor in place over runs of `CHUNK_PIXELS` pixels.

    Chunks, not the whole frame in one call: OCIO's packed-RGB path is faster on runs of
    this size than on a whole frame (docs/design/colour.md).
    """
    out = _writable_float32(pixels, inplace)
    flat = out.reshape(-1, out.shape[-1])  # a view: the array is C-contiguous
    apply = processor.applyRGBA if out.shape[-1] == 4 else processor.applyRGB
    for start in range(0, flat.shape[0], CHUNK_PIXELS):
        apply(flat[start : start + CHUNK_PIXELS])
    return out
