"""Preview thumbnails of the passes (PNG/JPEG) and a contact sheet per shot, for people to look at.

Each `*_rgb` function turns one frame of a pass into display-ready uint8 RGB at full size;
`thumbnail` scales it to fit `max_side` (square pixels: anamorphic frames are de-squeezed by
their pixel aspect ratio); `write_image` encodes and writes atomically. Previews are for eyes
only: colours are approximate and nothing downstream should read values back from them.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from storage.atomic import WriteResult, atomic_write_bytes
from storage.layers import PreviewKind
from storage.location import Location, Where, as_location

MAX_SIDE = 512
RGB = tuple[int, int, int]

# A turbo-like ramp (dark blue -> cyan -> green -> yellow -> red), hand-placed anchors.
_RAMP_POSITIONS = np.array([0.0, 0.1, 0.22, 0.35, 0.5, 0.65, 0.8, 0.9, 1.0])
_RAMP_COLOURS = np.array(
    [
        [48, 18, 59],
        [68, 100, 225],
        [40, 165, 245],
        [26, 228, 182],
        [164, 252, 60],
        [240, 205, 55],
        [250, 125, 35],
        [215, 55, 10],
        [122, 4, 3],
    ],
    dtype=np.float32,
)


def normal_rgb(normal: np.ndarray) -> np.ndarray:
    """Unit normals (H, W, 3) as colour: (n + 1) / 2; NaN shows black."""
    return _to_uint8((np.asarray(normal, dtype=np.float32) + 1.0) * 0.5)


# Tints of the mattes of a several-matte preview, in channel order (then repeating).
MATTE_TINTS = np.array(
    [(0.35, 0.55, 1.0), (1.0, 0.35, 0.35), (0.65, 0.4, 0.15), (1.0, 0.8, 0.6), (0.5, 1.0, 0.5)],
    dtype=np.float32,
)


def matte_rgb(matte: np.ndarray) -> np.ndarray:
    """Alpha (H, W) as grey; several mattes (H, W, G) each in its tint, the strongest per
    pixel shown."""
    alpha = np.asarray(matte, dtype=np.float32)
    if alpha.ndim == 3:
        tints = MATTE_TINTS[np.arange(alpha.shape[-1]) % len(MATTE_TINTS)]
        return _to_uint8(np.max(alpha[..., None] * tints, axis=2))
    grey = _to_uint8(alpha)
    return np.repeat(grey[..., None], 3, axis=2)


def albedo_rgb(albedo: np.ndarray) -> np.ndarray:
    """Scene-linear albedo (H, W, 3) through the sRGB transfer curve (primaries unchanged)."""
    return _to_uint8(srgb_encode(np.asarray(albedo, dtype=np.float32)))


def seg_rgb(seg: np.ndarray, palette: Sequence[Sequence[int]]) -> np.ndarray:
    """Class labels (H, W) coloured by `palette[class]`."""
    labels = np.asarray(seg)
    if labels.ndim != 2:
        raise ValueError(f"seg previews take class labels (H, W), got shape {labels.shape}")
    colours = np.asarray(palette, dtype=np.uint8).reshape(-1, 3)
    if labels.size and int(labels.max()) >= len(colours):
        raise ValueError(f"class {int(labels.max())} has no palette colour ({len(colours)} given)")
    return colours[labels.astype(np.intp)]


def depth_rgb(
    pointmap_or_depth: np.ndarray, inverse_depth_range: tuple[float, float] | None = None
) -> np.ndarray:
    """Depth as a turbo-like ramp of inverse depth (near = red, far = blue).

    Takes a pointmap (H, W, 3; depth = Z) or a depth map (H, W). The ramp spans
    `inverse_depth_range` (use one range for a whole shot so a clip does not flicker), or
    the frame's 1st-99th percentile of 1/Z. Pixels without a positive finite depth are black.
    """
    values = np.asarray(pointmap_or_depth, dtype=np.float32)
    depth = values[..., 2] if values.ndim == 3 else values
    valid = np.isfinite(depth) & (depth > 0)
    inverse = np.zeros_like(depth)
    inverse[valid] = 1.0 / depth[valid]
    if inverse_depth_range is None:
        if valid.any():
            low, high = np.percentile(inverse[valid], [1.0, 99.0])
        else:
            low, high = 0.0, 1.0
    else:
        low, high = inverse_depth_range
    span = max(float(high) - float(low), 1e-12)
    return _ramp_rgb(np.clip((inverse - float(low)) / span, 0.0, 1.0), valid)


def relative_depth_rgb(depth: np.ndarray) -> np.ndarray:
    """Relative depth (H, W): 0 nearest to 1 farthest over the person, negative or NaN
    elsewhere, as the same ramp as `depth_rgb` (near = red, far = blue); elsewhere black."""
    values = np.asarray(depth, dtype=np.float32)
    valid = np.isfinite(values) & (values >= 0)
    return _ramp_rgb(np.clip(1.0 - np.where(valid, values, 1.0), 0.0, 1.0), valid)


def _ramp_rgb(t: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Positions `t` in [0, 1] (0 = blue, 1 = red) as the depth ramp, uint8 RGB; black where
    not `valid`."""
    rgb = np.stack(
        [np.interp(t, _RAMP_POSITIONS, _RAMP_COLOURS[:, c]) for c in range(3)], axis=-1
    ).astype(np.uint8)
    rgb[~valid] = 0
    return rgb


# Motion previews: the vector length (in preview pixels per frame) drawn at full colour; one
# value for every frame and shot, so a clip of them does not pulse with each frame's maximum.
MOTION_FULL = 8.0


def motion_rgb(vectors: np.ndarray, full: float = MOTION_FULL) -> np.ndarray:
    """Motion vectors (H, W, 2), x right and y DOWN in the preview's own pixels, as a colour
    wheel: the hue is the direction (right red, down yellow-green, left cyan, up violet),
    the brightness the length, full at ``full`` pixels per frame; still pixels are black."""
    uv = np.nan_to_num(np.asarray(vectors, dtype=np.float32))
    u, v = uv[..., 0], uv[..., 1]
    hue = (np.arctan2(v, u) / (2 * np.pi)) % 1.0
    value = np.clip(np.hypot(u, v) / full, 0.0, 1.0)
    # HSV with full saturation: each channel a triangle wave of the hue, scaled by value
    phases = np.array([0.0, 1.0 / 3.0, 2.0 / 3.0], dtype=np.float32)  # red, green, blue
    distance = np.abs(((hue[..., None] - phases + 0.5) % 1.0) - 0.5)  # 0 at that primary
    rgb = np.clip(2.0 - 6.0 * distance, 0.0, 1.0) * value[..., None]
    return _to_uint8(rgb)


def plate_rgb(pixels: np.ndarray) -> np.ndarray:
    """Display-encoded plate pixels (float in [0, 1] or uint8; RGB or RGBA) as uint8 RGB."""
    values = np.asarray(pixels)
    if values.ndim == 2:
        values = np.repeat(values[..., None], 3, axis=2)
    values = values[..., :3]
    return values if values.dtype == np.uint8 else _to_uint8(values.astype(np.float32))


def thumbnail_size(
    width: int, height: int, max_side: int = MAX_SIDE, pixel_aspect: float = 1.0
) -> tuple[int, int]:
    """(width, height) that fits `max_side` with square pixels; never enlarges."""
    shown_width = width * float(pixel_aspect)
    scale = min(1.0, max_side / max(shown_width, height))
    return max(1, round(shown_width * scale)), max(1, round(height * scale))


def thumbnail(
    rgb: np.ndarray,
    max_side: int = MAX_SIDE,
    pixel_aspect: float = 1.0,
    nearest: bool = False,
) -> np.ndarray:
    """Scale uint8 RGB to fit `max_side` (nearest for label images, Lanczos otherwise)."""
    height, width = rgb.shape[:2]
    size = thumbnail_size(width, height, max_side, pixel_aspect)
    if size == (width, height):
        return np.ascontiguousarray(rgb)
    resample = Image.Resampling.NEAREST if nearest else Image.Resampling.LANCZOS
    return np.asarray(Image.fromarray(rgb).resize(size, resample, reducing_gap=3.0))


def pass_preview(
    kind: PreviewKind,
    data: np.ndarray,
    *,
    palette: Sequence[Sequence[int]] | None = None,
    inverse_depth_range: tuple[float, float] | None = None,
    max_side: int = MAX_SIDE,
    pixel_aspect: float = 1.0,
) -> np.ndarray:
    """The thumbnail of one pass's values, drawn as ``kind`` says (``storage.layers``):
    unit vectors, points by inverse depth, relative depth, scene-linear colour, alpha, class
    labels (with a palette, by nearest pixel), or motion vectors (a colour wheel)."""
    if kind == "vectors":
        rgb = normal_rgb(data)
    elif kind == "inverse_depth":
        rgb = depth_rgb(data, inverse_depth_range)
    elif kind == "relative_depth":
        rgb = relative_depth_rgb(data)
    elif kind == "colour":
        rgb = albedo_rgb(data)
    elif kind == "alpha":
        rgb = matte_rgb(data)
    elif kind == "motion":
        rgb = motion_rgb(data)
    elif kind == "labels":
        if palette is None:
            raise ValueError("a palette is needed for a label preview")
        rgb = seg_rgb(data, palette)
    else:
        raise ValueError(f"no preview of kind {kind!r}")
    return thumbnail(rgb, max_side, pixel_aspect, nearest=kind == "labels")


# The score below which a keypoint is not drawn (its place is a guess); the accuracy gate
# compares the keypoints at or above it (tasks.precision_gate).
SHOWN_KEYPOINT_SCORE = 0.3


def pose_preview(
    plate: np.ndarray,
    people: Sequence[Any],
    skeleton: Sequence[tuple[int, int]],
    link_colours: Sequence[Sequence[int]] | Sequence[int],
    keypoint_colours: Sequence[Sequence[int]] | Sequence[int] | None = None,
    *,
    min_score: float = SHOWN_KEYPOINT_SCORE,
    max_side: int = MAX_SIDE,
    pixel_aspect: float = 1.0,
    frame_size: tuple[int, int] | None = None,
) -> np.ndarray:
    """The plate thumbnail with each person's skeleton drawn over it.

    `skeleton` holds keypoint index pairs; `link_colours` is one RGB per link or a single
    RGB; keypoints whose score is below `min_score` (and links touching them) are skipped.
    Keypoints are in plate pixels. With `frame_size` (the plate's width, height), `plate` is
    already the thumbnail (made on the model's device) and is drawn on as it is.
    """
    base = plate_rgb(plate)
    if frame_size is None:
        height, width = base.shape[:2]
        image = Image.fromarray(thumbnail(base, max_side, pixel_aspect))
    else:
        width, height = frame_size
        image = Image.fromarray(base)
    sx, sy = image.width / width, image.height / height
    draw = ImageDraw.Draw(image)
    line = max(1, round(max(image.size) / 256))
    links = _colour_list(link_colours, len(skeleton))
    for person in people:
        keypoints = np.asarray(_field(person, "keypoints"), dtype=np.float64)
        scores = np.asarray(_field(person, "scores"), dtype=np.float64)
        shown = np.isfinite(keypoints).all(axis=1) & (scores >= min_score)
        points = [(x * sx, y * sy) for x, y in keypoints]
        for (a, b), colour in zip(skeleton, links, strict=True):
            if shown[a] and shown[b]:
                draw.line([points[a], points[b]], fill=tuple(colour), width=line)
        dots = _colour_list(
            (255, 255, 255) if keypoint_colours is None else keypoint_colours, len(points)
        )
        radius = line + 0.5
        for (x, y), visible, colour in zip(points, shown, dots, strict=True):
            if visible:
                draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=tuple(colour))
    return np.asarray(image)


def encode_image(rgb: np.ndarray, image_format: str = "png", quality: int = 90) -> bytes:
    """PNG or JPEG bytes of uint8 RGB."""
    kind = image_format.lower().lstrip(".")
    buffer = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8))
    if kind == "png":
        image.save(buffer, format="PNG", optimize=False)
    elif kind in ("jpg", "jpeg"):
        image.save(buffer, format="JPEG", quality=quality)
    else:
        raise ValueError(f"previews are png or jpeg, not {image_format!r}")
    return buffer.getvalue()


def write_image(where: Where, rgb: np.ndarray) -> WriteResult:
    """Encode as the URI's extension says (.png, .jpg, .jpeg) and write atomically."""
    where = as_location(where)
    uri = where.uri
    extension = uri.rsplit(".", 1)[-1] if "." in uri.rsplit("/", 1)[-1] else ""
    return atomic_write_bytes(where, encode_image(rgb, extension))


def read_preview(where: Where) -> np.ndarray:
    """A preview back as uint8 RGB (used for contact sheets built from written thumbnails)."""
    fs, path = as_location(where).fs_and_path()
    with fs.open(path, "rb") as handle:
        return np.asarray(Image.open(handle).convert("RGB"))


def contact_sheet(
    items: Sequence[tuple[int, np.ndarray | Location | str]],
    *,
    columns: int = 8,
    cell_max_side: int = 256,
    max_cells: int = 96,
) -> np.ndarray:
    """A grid of thumbnails labelled with their frame numbers.

    `items` are (frame, uint8 RGB image or the location of a written preview); images are
    loaded one at a time. Longer shots are sampled evenly down to `max_cells` cells (first
    and last kept).
    """
    if not items:
        raise ValueError("a contact sheet needs at least one frame")
    chosen = _even_sample(len(items), max_cells)
    first = _load(items[chosen[0]][1])
    cell_w, cell_h = thumbnail_size(first.shape[1], first.shape[0], cell_max_side)
    font = ImageFont.load_default(size=max(10, cell_h // 10))
    label_h = font.size + 6
    columns = max(1, min(columns, len(chosen)))
    rows = -(-len(chosen) // columns)
    gap = 4
    sheet = Image.new(
        "RGB",
        (columns * (cell_w + gap) + gap, rows * (cell_h + label_h + gap) + gap),
        (24, 24, 24),
    )
    draw = ImageDraw.Draw(sheet)
    for slot, index in enumerate(chosen):
        frame, source = items[index]
        image = first if slot == 0 else _load(source)
        tile = Image.fromarray(image).resize((cell_w, cell_h), Image.Resampling.LANCZOS)
        left = gap + (slot % columns) * (cell_w + gap)
        top = gap + (slot // columns) * (cell_h + label_h + gap)
        sheet.paste(tile, (left, top))
        draw.text((left + 2, top + cell_h + 3), str(frame), fill=(230, 230, 230), font=font)
    return np.asarray(sheet)


def write_contact_sheet(
    where: Where,
    items: Sequence[tuple[int, np.ndarray | Location | str]],
    *,
    columns: int = 8,
    cell_max_side: int = 256,
    max_cells: int = 96,
) -> WriteResult:
    """Build `contact_sheet(items)` and write it (PNG or JPEG by extension) atomically."""
    sheet = contact_sheet(items, columns=columns, cell_max_side=cell_max_side, max_cells=max_cells)
    return write_image(where, sheet)


def srgb_encode(linear: np.ndarray) -> np.ndarray:
    """The sRGB transfer function (IEC 61966-2-1) on values clipped to [0, 1]."""
    x = np.clip(np.nan_to_num(linear, nan=0.0), 0.0, 1.0)
    return np.where(x <= 0.0031308, 12.92 * x, 1.055 * np.power(x, 1 / 2.4) - 0.055)


def _to_uint8(values: np.ndarray) -> np.ndarray:
    clean = np.nan_to_num(values, nan=0.0, posinf=1.0, neginf=0.0)
    return (np.clip(clean, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _even_sample(count: int, limit: int) -> list[int]:
    if count <= limit:
        return list(range(count))
    if limit < 2:
        return [0]
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})


def _load(source: np.ndarray | Location | str) -> np.ndarray:
    if isinstance(source, Location | str):
        return read_preview(source)
    return plate_rgb(source)


def _colour_list(colours: Sequence[Any], count: int) -> list[tuple[int, int, int]]:
    array = np.asarray(colours, dtype=np.int64)
    if array.shape == (3,):
        return [tuple(int(v) for v in array)] * count  # type: ignore[list-item]
    if array.shape != (count, 3):
        raise ValueError(f"expected one RGB colour or {count} of them, got shape {array.shape}")
    return [(int(r), int(g), int(b)) for r, g, b in array]


def _field(person: Any, name: str) -> Any:
    return person[name] if isinstance(person, Mapping) else getattr(person, name)
