"""The shot's Nuke script (`<name>.nk` beside the EXRs): every layer of the passes asked for,
read with the right frame range and colour handling, shuffled out under its name, with a
Cryptomatte node on the body-part layer, grouped on backdrops. Open it and the passes are
there; nothing needs wiring by hand.

Why each node is the one it is (raw and colour-managed Reads, the legacy Shuffle, the
native Cryptomatte node, S3 paths, the motion layer's VectorBlur): docs/design/nuke-script.md.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack

from schemas import passes as pass_table
from schemas.passes import MOTION_CHANNELS
from storage.exr_writer import part_channels
from storage.layers import ExrLayer as ExrPart
from storage.nuke_script import (
    KnobValue,
    NukeNode,
    NukeScript,
    quote,
    render,
    tcl_literal,
    write_nuke_script,
)
from storage.uri import is_remote
from tasks.output_paths import ShotOutputPaths

# The EXR writer tags the albedo part colorInteropID "lin_ap1_scene" unless told otherwise:
# ACEScg, by its name in the ACES OCIO configs (and Nuke's own fn-nuke_cg config).
DEFAULT_ALBEDO_COLORSPACE = "ACEScg"
ON_ERROR = "checkerboard"

# Node Graph paths, in Nuke DAG units (y grows downwards). Footprints are generous: a node
# tile is about 80x18, a Read with its postage stamp about 80x80.
NODE_SIZE = (80, 30)
READ_SIZE = (80, 110)
COLUMN = 140  # from one node to the next in a group
GROUP_GAP = 60  # between two group backdrops
READ_ROW_Y = 0
LAYER_ROW_Y = 360
PAD = 40  # backdrop margin around its nodes
TITLE_LINE = 28  # backdrop label height per line (note_font_size 20)
CHAR_WIDTH = 11  # about half an em at note_font_size 20: a backdrop is as wide as its label
FONT_SIZE = 20
_NUKE_CHANNEL = {"r": "red", "g": "green", "b": "blue", "a": "alpha"}
_NUKE_CHANNEL.update({name: name for name in _NUKE_CHANNEL.values()})
# Channel sets that are one layer of Nuke's built-in set, not layers named by their prefixes.
_NUKE_LAYERS = {MOTION_CHANNELS: "motion"}
VECTOR_BLUR_SCALE = 0.5  # of the per-frame vectors: a 180-degree shutter
_COLOURS = {  # backdrop tile colours (0xRRGGBBAA): the Reads', then each pass's
    "read": "0x444444ff",
    **{p.name: p.nuke_colour for p in pass_table.PASSES},
}


Groups = Sequence[tuple[str, Sequence[str]]]  # (pass, its node names), in the graph's order
Positions = dict[str, tuple[int, int]]  # node name -> (x, y) in the Node Graph


@dataclass(frozen=True)
class ExrLayer:
    """One Nuke layer of the shot's EXR: the part and pass it comes from, its channels."""

    part: str
    pass_name: str
    layer: str
    channels: tuple[str, ...]  # Nuke channel names: x y z, red green blue, alpha, Z, id


def exr_layers(passes: Sequence[str]) -> tuple[ExrLayer, ...]:
    """The Nuke layers the EXR holds for `passes`, in part order (Cryptomatte ranks left out:
    the Cryptomatte node reads those). Raises ValueError for a pass the platform lacks."""
    known = pass_table.PASS_NAMES
    unknown = sorted(set(passes) - set(known))
    if unknown:
        raise ValueError(f"unknown passes {unknown}; known passes are {sorted(known)}")
    layers: list[ExrLayer] = []
    for spec in pass_table.PASSES:
        if spec.name not in passes:
            continue
        for part in (part for part in spec.exr if not part.cryptomatte):
            for layer, channels in _part_layers(part):
                layers.append(ExrLayer(part.part, spec.name, layer, channels))
    return tuple(layers)


def _cryptomatte_layer(passes: Sequence[str]) -> tuple[str, str] | None:
    """(pass, layer) of the Cryptomatte among `passes`' parts, if there is one."""
    return next(
        (
            (spec.name, part.part)
            for spec in pass_table.PASSES
            if spec.name in passes
            for part in spec.exr
            if part.cryptomatte
        ),
        None,
    )


def build_shot_script(
    paths: ShotOutputPaths,
    frames: Sequence[int],
    passes: Sequence[str],
    *,
    image_size: tuple[int, int],
    data_window: tuple[int, int, int, int] | None = None,
    pixel_aspect: float = 1.0,
    fps: float = 24.0,
    albedo_colorspace: str | None = None,
) -> NukeScript:
    """The Nuke script for one shot's EXR sequence (what `FinalizeJob` holds).

    `frames` are the frames with outputs (first/last = min/max; holes read as checkerboard),
    `image_size` (width, height) of the data window, `albedo_colorspace` the OCIO name of the
    working space albedo was written in (`ColourConversion.working_space`; default ACEScg).
    Raises ValueError when no pass is in the EXR or the inputs disagree.
    """
    where = paths.nuke_script
    if not frames:
        raise ValueError(f"{where}: no frames with outputs, nothing for Nuke to read")
    width, height = _checked_size(where, image_size, data_window, pixel_aspect, fps)
    layers = exr_layers(passes)
    crypto = _cryptomatte_layer(passes)
    if not layers:
        raise ValueError(f"{where}: passes {list(passes)} put nothing in the EXR")
    first, last = min(frames), max(frames)
    colorspace = albedo_colorspace or DEFAULT_ALBEDO_COLORSPACE
    fmt = _format(width, height, pixel_aspect)

    groups = _groups(layers, crypto)
    labels = {name: _group_label(name, colorspace) for name, _ in groups}
    positions = _positions(groups, {name: _label_width(label) for name, label in labels.items()})
    reads = _reads(paths, groups, positions, first, last, fmt, colorspace)
    layer_nodes = _layer_nodes(groups, layers, positions, crypto)
    read_boxes = [((_x(read), _y(read)), READ_SIZE) for read in reads]
    backdrops = [_backdrop("Backdrop_read", _reads_label(paths, frames), "read", read_boxes)]
    for pass_name, names in groups:
        boxes = [(positions[name], NODE_SIZE) for name in names]
        backdrops.append(_backdrop(f"Backdrop_{pass_name}", labels[pass_name], pass_name, boxes))
    root: dict[str, KnobValue] = {
        "frame": first,
        "first_frame": first,
        "last_frame": last,
        "lock_range": True,
        "fps": float(fps),
        "format": fmt,
    }
    comments = (
        f"Sapiens2 passes of {paths.name}, frames {first}-{last}: written by sapiens-vfx.",
        "For Nuke 13 or later" + (" (its native Cryptomatte node)." if crypto else "."),
    )
    # Backdrops first (Nuke draws them under the nodes; they take nothing from the stack),
    # then each Read followed by the nodes it feeds.
    nodes: list[NukeNode] = list(backdrops)
    for read in reads:
        nodes.append(read)
        nodes.extend(node for node in layer_nodes if node.inputs == (read.name,))
    return NukeScript(root=root, nodes=tuple(nodes), comments=comments)


def _layer_nodes(
    groups: Groups, layers: Sequence[ExrLayer], positions: Positions, crypto: tuple[str, str] | None
) -> list[NukeNode]:
    """The node of each name in ``groups``: the Cryptomatte node, a motion layer's
    VectorBlur or a layer's Shuffle, each fed by its pass's Read (Read_data for data)."""
    by_layer = {f"Shuffle_{layer.layer}": layer for layer in layers}
    nodes: list[NukeNode] = []
    for pass_name, names in groups:
        colour = pass_table.BY_NAME[pass_name].scene_linear
        source = f"Read_{pass_name}" if colour else "Read_data"
        for name in names:
            if crypto is not None and name == _CRYPTO_NODE:
                nodes.append(_cryptomatte(positions[name], source, crypto[1]))
            elif name.startswith(_VECTOR_BLUR):
                layer = by_layer[name.replace(_VECTOR_BLUR, "Shuffle_", 1)]
                nodes.append(_vector_blur(name, layer, positions[name], source))
            else:
                nodes.append(_shuffle(name, by_layer[name], positions[name], source))
    return nodes


class ShotImage(TypedDict, total=False):
    """What `build_shot_script` needs to know of the shot's images, besides its frames and
    passes (the keyword arguments both functions take)."""

    data_window: tuple[int, int, int, int] | None
    pixel_aspect: float
    fps: float
    albedo_colorspace: str | None


def write_shot_nuke_script(
    paths: ShotOutputPaths,
    frames: Sequence[int],
    passes: Sequence[str],
    *,
    image_size: tuple[int, int],
    **image: Unpack[ShotImage],
) -> str | None:
    """Write `paths.nuke_script` atomically (local or object store); returns its URI, or
    None when the passes put nothing in the EXR (pose only): there is nothing to read.
    Raises ValueError on inconsistent inputs, StorageError when the file cannot be written."""
    if not exr_layers(passes):
        return None
    script = build_shot_script(paths, frames, passes, image_size=image_size, **image)
    return write_nuke_script(paths.at(paths.nuke_script), render(script))


# -- nodes ---------------------------------------------------------------------------------
_CRYPTO_NODE = "Cryptomatte_BodyPart"
_VECTOR_BLUR = "VectorBlur_"  # a motion layer's VectorBlur: VectorBlur_<layer>


def _reads(
    paths: ShotOutputPaths,
    groups: Groups,
    positions: Positions,
    first: int,
    last: int,
    fmt: str,
    colorspace: str,
) -> list[NukeNode]:
    """Read_data (raw) above the first data group, Read_<pass> above a colour pass's Shuffle
    (albedo: its values are scene-linear colour)."""
    colour = [p for p, _ in groups if pass_table.BY_NAME[p].scene_linear]
    data = [names[0] for pass_name, names in groups if pass_name not in colour]
    albedo = [names[0] for pass_name, names in groups if pass_name in colour]
    reads: list[NukeNode] = []
    data_x = positions[data[0]][0] if data else None
    if data_x is not None:
        label = "data passes: raw (no colour transform)"
        reads.append(_read("Read_data", paths, first, last, fmt, data_x, raw=True, label=label))
    if albedo:
        x = positions[albedo[0]][0]
        if data_x is not None and abs(x - data_x) < COLUMN:
            x = data_x + COLUMN
        label = f"{colour[0]}: scene-linear {colorspace}"
        reads.append(
            _read(
                f"Read_{colour[0]}",
                paths,
                first,
                last,
                fmt,
                x,
                raw=False,
                label=label,
                colorspace=colorspace,
            )
        )
    return reads


def _read(
    name: str,
    paths: ShotOutputPaths,
    first: int,
    last: int,
    fmt: str,
    x: int,
    *,
    raw: bool,
    label: str,
    colorspace: str | None = None,
) -> NukeNode:
    knobs: dict[str, KnobValue] = {
        "file_type": "exr",
        "file": tcl_literal(paths.exr_pattern),
        "format": fmt,
        "first": first,
        "last": last,
        "origfirst": first,
        "origlast": last,
        "origset": True,
        "on_error": ON_ERROR,
        "raw": raw,
    }
    if colorspace is not None:
        knobs["colorspace"] = colorspace
    knobs.update(label=tcl_literal(label), xpos=x, ypos=READ_ROW_Y)
    return NukeNode("Read", name, knobs)


def _shuffle(name: str, layer: ExrLayer, position: tuple[int, int], source: str) -> NukeNode:
    """Legacy Shuffle: `in` = the layer; red..alpha name the layer's channel positions."""
    if len(layer.channels) == 1:
        routing = {"red": "red", "green": "red", "blue": "red", "alpha": "red"}
        target = "rgba"
    elif len(layer.channels) == 4:  # four mattes (parts): each to its own channel
        routing = {"red": "red", "green": "green", "blue": "blue", "alpha": "alpha"}
        target = "rgba"
    else:
        routing = {"red": "red", "green": "green", "blue": "blue", "alpha": "black"}
        target = "rgb"
    channels = " ".join(
        channel if "." in channel else f"{layer.layer}.{channel}" for channel in layer.channels
    )
    knobs: dict[str, KnobValue] = {"in": layer.layer, "out": "rgba", **routing}
    knobs.update(label=tcl_literal(f"{channels} -> {target}"), xpos=position[0], ypos=position[1])
    return NukeNode("Shuffle", name, knobs, inputs=(source,))


def _vector_blur(name: str, layer: ExrLayer, position: tuple[int, int], source: str) -> NukeNode:
    """VectorBlur2 on the motion layer's forward vectors, disabled (see the module's notes)."""
    knobs: dict[str, KnobValue] = {
        "disable": True,
        "channels": "rgba",
        "uv": layer.layer,
        "scale": VECTOR_BLUR_SCALE,
        "label": tcl_literal(
            f"uv {layer.layer}: copy it into an element's stream, then enable (180-degree shutter)"
        ),
        "xpos": position[0],
        "ypos": position[1],
    }
    return NukeNode("VectorBlur2", name, knobs, inputs=(source,))


def _cryptomatte(position: tuple[int, int], source: str, layer: str) -> NukeNode:
    knobs: dict[str, KnobValue] = {
        "cryptoLayer": layer,
        "cryptoLayerLock": True,
        "label": tcl_literal(f"{layer}: pick body parts"),
        "xpos": position[0],
        "ypos": position[1],
    }
    return NukeNode("Cryptomatte", _CRYPTO_NODE, knobs, inputs=(source,))


def _backdrop(
    name: str, label: str, colour: str, boxes: Sequence[tuple[tuple[int, int], tuple[int, int]]]
) -> NukeNode:
    """A backdrop enclosing `boxes` ((x, y), (w, h)) with room for its label on top."""
    title = TITLE_LINE * (label.count("\n") + 1)
    left = min(x for (x, _), _ in boxes) - PAD
    top = min(y for (_, y), _ in boxes) - PAD - title
    right = max(max(x + w for (x, _), (w, _) in boxes) + PAD, left + _label_width(label))
    bottom = max(y + h for (_, y), (_, h) in boxes) + PAD
    knobs: dict[str, KnobValue] = {
        "tile_color": _COLOURS[colour],
        "label": tcl_literal(label),
        "note_font_size": FONT_SIZE,
        "xpos": left,
        "ypos": top,
        "bdwidth": right - left,
        "bdheight": bottom - top,
    }
    return NukeNode("BackdropNode", name, knobs, inputs=())


# -- layout and helpers ----------------------------------------------------------------------
def _groups(
    layers: Sequence[ExrLayer], crypto: tuple[str, str] | None
) -> list[tuple[str, list[str]]]:
    """Node names per pass, in the pass table's order; the Cryptomatte node joins the group
    of its pass (seg)."""
    groups: dict[str, list[str]] = {}
    for layer in layers:
        groups.setdefault(layer.pass_name, []).append(f"Shuffle_{layer.layer}")
        if layer.channels == MOTION_CHANNELS:  # motion vectors: what a compositor uses them in
            groups[layer.pass_name].append(f"{_VECTOR_BLUR}{layer.layer}")
    if crypto is not None:
        groups.setdefault(crypto[0], []).insert(0, _CRYPTO_NODE)
    return [(name, groups[name]) for name in pass_table.PASS_NAMES if name in groups]


def _positions(groups: Groups, label_widths: dict[str, int]) -> Positions:
    """One row of groups, each as wide as its nodes or its backdrop label, whichever is more."""
    positions: Positions = {}
    left = -PAD  # backdrop edge of the group being placed
    for group, names in groups:
        for index, name in enumerate(names):
            positions[name] = (left + PAD + index * COLUMN, LAYER_ROW_Y)
        nodes = (len(names) - 1) * COLUMN + NODE_SIZE[0] + 2 * PAD
        left += max(nodes, label_widths[group]) + GROUP_GAP
    return positions


def _group_label(pass_name: str, colorspace: str) -> str:
    spec = pass_table.BY_NAME[pass_name]
    note = f"scene-linear {colorspace}" if spec.scene_linear else spec.nuke_note
    return f"{pass_name}\n{note}"


def _label_width(label: str) -> int:
    return max(len(line) for line in label.split("\n")) * CHAR_WIDTH + PAD


def _reads_label(paths: ShotOutputPaths, frames: Sequence[int]) -> str:
    first, last = min(frames), max(frames)
    lines = [paths.name, f"Sapiens2 passes, frames {first}-{last}"]
    present, span = len(set(frames)), last - first + 1
    if present < span:
        lines.append(f"{span - present} of {span} frames missing: they read as checkerboard")
    if is_remote(paths.exr_pattern):
        lines.append("S3 paths: Nuke cannot read s3:// - sync or mount the files, then repath")
    return "\n".join(lines)


def _checked_size(
    where: str,
    image_size: tuple[int, int],
    data_window: tuple[int, int, int, int] | None,
    pixel_aspect: float,
    fps: float,
) -> tuple[int, int]:
    width, height = (int(v) for v in image_size)
    if width <= 0 or height <= 0:
        raise ValueError(f"{where}: image size {image_size} is not a picture")
    if data_window is not None:
        xmin, ymin, xmax, ymax = data_window
        if (xmax - xmin + 1, ymax - ymin + 1) != (width, height):
            raise ValueError(
                f"{where}: image size {image_size} is not the size of data window {data_window}"
            )
    if not pixel_aspect > 0 or not fps > 0:  # also refuses NaN
        raise ValueError(f"{where}: pixel aspect {pixel_aspect} and fps {fps} must be positive")
    return width, height


def _format(width: int, height: int, pixel_aspect: float) -> str:
    """Nuke's format string "w h x y r t pixel_aspect name"; the name says the size."""
    aspect = quote(float(pixel_aspect))
    name = f"sapiens2_{width}x{height}"
    if aspect != "1":
        name += "_pa" + aspect.replace(".", "p").replace("-", "m")
    return f"{width} {height} 0 0 {width} {height} {aspect} {name}"


def _x(node: NukeNode) -> int:
    return int(node.knob("xpos"))


def _y(node: NukeNode) -> int:
    return int(node.knob("ypos"))


@functools.cache
def _part_layers(part: ExrPart) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(layer, Nuke channels) of an EXR part, asked of the writer (one Cryptomatte layer)."""
    names = part_channels(part, crypto_ranks=1)
    if tuple(names) in _NUKE_LAYERS:
        return ((_NUKE_LAYERS[tuple(names)], tuple(names)),)
    layers: dict[str, list[str]] = {}
    for channel in names:
        layer, _, last = channel.rpartition(".")
        # Nuke's EXR reader (ExrChannelNameToNuke): layer = the name before the last period,
        # non-alphanumerics as "_"; R/G/B/A become red/green/blue/alpha.
        layer = re.sub(r"[^A-Za-z0-9]", "_", layer)
        layers.setdefault(layer, []).append(_NUKE_CHANNEL.get(last.lower(), last))
    return tuple((layer, tuple(channels)) for layer, channels in layers.items())
