"""The shot's Nuke script, checked by parsing the text back (tests/nuke_parse.py): node
classes, knobs, paths, frame ranges, colour handling per pass, paths, and quoting that no
path or name can break out of."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import OpenEXR
import pytest

from schemas.passes import PASS_NAMES, exr_layers
from storage.exr_writer import write_passes_exr
from storage.frame import Frame
from storage.location import Location
from storage.nuke_script import NukeNode, NukeScript, quote, render, tcl_literal
from tasks.output_paths import ShotOutputPaths
from tasks.shot_nuke_script import (
    NODE_SIZE,
    READ_SIZE,
    build_shot_script,
    write_shot_nuke_script,
)
from tests.exr_parts import exr_parts
from tests.nuke_parse import NkNode, NkScript, NukeParseError, evaluates_tcl, parse, tcl_unliteral

ALL = ("normal", "pointmap", "albedo", "matte", "seg", "pose")
# The Nuke layers each pass puts in the EXR (ARCHITECTURE.md "Outputs"; Cryptomatte ranks are
# read by the Cryptomatte node, not shuffled).
LAYERS = {
    "normal": {"N"},
    "pointmap": {"P", "depth"},
    "albedo": {"albedo"},
    "matte": {"matte"},
    "seg": {"seg"},
    "pose": set(),
}
DATA_LAYERS = {"N", "P", "depth", "matte", "seg"}
HOSTILE = [
    "",
    "plain",
    "with space",
    'quote " inside',
    "braces { and } unbalanced }",
    "back\\slash and \\\\ two",
    "ends with a backslash\\",
    "bracket [exec touch /tmp/pwned]",
    "dollar $HOME ${x} $::env(HOME)",
    "non-ASCII é ñ 漢字 🎬",
    "new\nline\ttab\rreturn",
    "controls \x01\x1b\x7f",
    '\\"',
    "}",
    "{",
    "#not a comment",
    "; set x 1",
    "0x12",
    "true",
]


def _layout(tmp_path: Path, **kw: Any) -> ShotOutputPaths:
    return ShotOutputPaths.for_shot(str(tmp_path / "passes"), "abc", "sq010", "sh020", "v001", **kw)


def _script(paths: ShotOutputPaths, passes: Sequence[str] = ALL, **kw: Any) -> NkScript:
    args: dict[str, Any] = {"frames": range(1001, 1025), "image_size": (64, 36)} | kw
    frames = args.pop("frames")
    return parse(render(build_shot_script(paths, frames, passes, **args)))


def _inside(node: NkNode, backdrop: NkNode, size: tuple[int, int]) -> bool:
    x, y = int(node.knobs["xpos"]), int(node.knobs["ypos"])
    left, top = int(backdrop.knobs["xpos"]), int(backdrop.knobs["ypos"])
    right = left + int(backdrop.knobs["bdwidth"])
    bottom = top + int(backdrop.knobs["bdheight"])
    return left <= x and x + size[0] <= right and top <= y and y + size[1] <= bottom


def _box(node: NkNode) -> tuple[int, int, int, int]:
    x, y = int(node.knobs["xpos"]), int(node.knobs["ypos"])
    if node.cls == "BackdropNode":
        return x, y, x + int(node.knobs["bdwidth"]), y + int(node.knobs["bdheight"])
    width, height = READ_SIZE if node.cls == "Read" else NODE_SIZE
    return x, y, x + width, y + height


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_every_pass_gives_reads_shuffles_cryptomatte_and_backdrops(tmp_path: Path) -> None:
    paths = _layout(tmp_path)
    nk = _script(paths, fps=23.976, pixel_aspect=2.0, albedo_colorspace="ACEScg")
    assert nk.version == "13.0 v1"
    assert nk.root["first_frame"] == "1001" and nk.root["last_frame"] == "1024"
    assert nk.root["fps"] == "23.976" and nk.root["lock_range"] == "true"
    assert nk.root["format"].split()[:7] == ["64", "36", "0", "0", "64", "36", "2"]
    assert sorted(node.cls for node in nk.nodes if node.cls != "BackdropNode") == [
        "Cryptomatte", "Read", "Read", *["Shuffle"] * 6
    ]  # fmt: skip

    data, albedo = nk.node("Read_data"), nk.node("Read_albedo")
    for read in (data, albedo):
        assert read.inputs == ()
        assert read.knobs["file"] == paths.exr_pattern
        assert read.knobs["file"].endswith("/sh020_sapiens2_v001.%04d.exr")
        assert read.knobs["file_type"] == "exr"
        assert (read.knobs["first"], read.knobs["last"]) == ("1001", "1024")
        assert (read.knobs["origfirst"], read.knobs["origlast"]) == ("1001", "1024")
        assert read.knobs["on_error"] in ("black", "checkerboard")
        assert read.knobs["format"] == nk.root["format"]
    assert data.knobs["raw"] == "true" and "colorspace" not in data.knobs
    assert albedo.knobs["raw"] == "false" and albedo.knobs["colorspace"] == "ACEScg"

    shuffles = {node.knobs["in"]: node for node in nk.of_class("Shuffle")}
    assert set(shuffles) == set().union(*LAYERS.values())
    for layer, node in shuffles.items():
        assert node.name == f"Shuffle_{layer}"
        assert node.inputs == (("Read_data",) if layer in DATA_LAYERS else ("Read_albedo",))
        assert node.knobs["out"] == "rgba"
    assert [shuffles["N"].knobs[c] for c in ("red", "green", "blue", "alpha")] == [
        "red", "green", "blue", "black"
    ]  # fmt: skip
    assert {shuffles["depth"].knobs[c] for c in ("red", "green", "blue", "alpha")} == {"red"}

    (crypto,) = nk.of_class("Cryptomatte")
    assert crypto.knobs["cryptoLayer"] == "CryptoBodyPart"
    assert crypto.inputs == ("Read_data",)  # raw: Cryptomatte IDs must not be colour-converted


def test_backdrops_enclose_their_nodes_and_nothing_overlaps(tmp_path: Path) -> None:
    nk = _script(_layout(tmp_path))
    backdrops = {node.name: node for node in nk.of_class("BackdropNode")}
    assert set(backdrops) == {
        "Backdrop_read", "Backdrop_normal", "Backdrop_pointmap", "Backdrop_albedo",
        "Backdrop_matte", "Backdrop_seg",
    }  # fmt: skip
    members = {
        "Backdrop_read": ["Read_data", "Read_albedo"],
        "Backdrop_normal": ["Shuffle_N"],
        "Backdrop_pointmap": ["Shuffle_P", "Shuffle_depth"],
        "Backdrop_albedo": ["Shuffle_albedo"],
        "Backdrop_matte": ["Shuffle_matte"],
        "Backdrop_seg": ["Shuffle_seg", "Cryptomatte_BodyPart"],
    }
    for backdrop, names in members.items():
        assert backdrops[backdrop].knobs["label"]
        for name in names:
            node = nk.node(name)
            size = READ_SIZE if node.cls == "Read" else NODE_SIZE
            assert _inside(node, backdrops[backdrop], size), (name, backdrop)
    others = [node for node in nk.nodes if node.cls != "BackdropNode"]
    for group in (list(backdrops.values()), others):
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                assert not _overlap(_box(a), _box(b)), (a.name, b.name)


@pytest.mark.parametrize(
    "passes",
    [("normal",), ("pointmap",), ("albedo",), ("matte",), ("seg",), ("normal", "albedo"),
     ("albedo", "matte", "pose"), ("pointmap", "seg", "pose")],
)  # fmt: skip
def test_only_what_the_passes_put_in_the_exr(tmp_path: Path, passes: tuple[str, ...]) -> None:
    nk = _script(_layout(tmp_path), passes)
    expected = set().union(*(LAYERS[name] for name in passes))
    assert {node.knobs["in"] for node in nk.of_class("Shuffle")} == expected
    assert bool(nk.of_class("Cryptomatte")) == ("seg" in passes)
    reads = {node.name for node in nk.of_class("Read")}
    assert ("Read_albedo" in reads) == ("albedo" in passes)
    assert ("Read_data" in reads) == bool(expected & DATA_LAYERS)
    backdrops = {node.name for node in nk.of_class("BackdropNode")}
    assert backdrops == {"Backdrop_read"} | {f"Backdrop_{p}" for p in passes if p != "pose"}
    for node in nk.nodes:  # every node takes its input from one of the Reads
        assert all(name in reads for name in node.inputs)


def test_normal_only_has_no_cryptomatte_no_seg_and_no_albedo(tmp_path: Path) -> None:
    nk = _script(_layout(tmp_path), ("normal",))
    assert [node.name for node in nk.nodes if node.cls != "BackdropNode"] == [
        "Read_data", "Shuffle_N"
    ]  # fmt: skip
    text = render(build_shot_script(_layout(tmp_path), [1], ("normal",), image_size=(8, 8)))
    assert "Cryptomatte" not in text and "albedo" not in text and "seg" not in text


def test_shuffles_match_the_layers_of_a_real_exr(tmp_path: Path) -> None:
    """The layers Nuke finds in a file the EXR writer wrote (name before the last period)."""
    size = 4
    plate = Frame(np.zeros((size, size, 3), np.float32), "plate.exr", 1, (0, 0, 3, 3), (0, 0, 3, 3))
    rng = np.random.default_rng(0)
    probabilities = rng.random((size, size, 3)).astype(np.float32)
    passes = {
        "normal": rng.random((size, size, 3)).astype(np.float32),
        "pointmap": rng.random((size, size, 3)).astype(np.float32),
        "albedo": rng.random((size, size, 3)).astype(np.float32),
        "matte": rng.random((size, size)).astype(np.float32),
        "seg": probabilities / probabilities.sum(-1, keepdims=True),
    }
    path = tmp_path / "sh.0001.exr"
    names = ["Background", "Hair", "Face"]
    write_passes_exr(
        str(path), plate, exr_layers(PASS_NAMES), exr_parts(passes, names), {}, class_names=names
    )
    channels = [
        name
        for part in OpenEXR.File(str(path), separate_channels=True).parts
        for name in part.channels
    ]
    layers = {name.rpartition(".")[0] for name in channels}
    crypto = {layer for layer in layers if re.fullmatch(r"CryptoBodyPart\d\d", layer)}
    assert crypto

    nk = _script(_layout(tmp_path), tuple(passes))
    assert {node.knobs["in"] for node in nk.of_class("Shuffle")} == layers - crypto
    assert {node.knobs["cryptoLayer"] for node in nk.of_class("Cryptomatte")} == {
        layer[:-2] for layer in crypto
    }


@pytest.mark.parametrize(
    ("frames", "first", "last"),
    [
        (range(-12, -2), -12, -3),
        ([1001], 1001, 1001),
        ([1010, 1001, 1005, 1005], 1001, 1010),  # unordered, holes, a repeat
        (range(-2, 3), -2, 2),
        ([0], 0, 0),
    ],
)
def test_frame_ranges(tmp_path: Path, frames: Sequence[int], first: int, last: int) -> None:
    nk = _script(_layout(tmp_path), ("normal", "albedo"), frames=frames)
    assert (nk.root["first_frame"], nk.root["last_frame"]) == (str(first), str(last))
    for read in nk.of_class("Read"):
        assert (int(read.knobs["first"]), int(read.knobs["last"])) == (first, last)
        assert (int(read.knobs["origfirst"]), int(read.knobs["origlast"])) == (first, last)
    label = nk.node("Backdrop_read").knobs["label"]
    assert ("missing" in label) == (len(set(frames)) < last - first + 1)


def test_padding_follows_the_layout(tmp_path: Path) -> None:
    nk = _script(_layout(tmp_path, padding=6), ("matte",))
    assert nk.node("Read_data").knobs["file"].endswith(".%06d.exr")


@pytest.mark.parametrize("text", HOSTILE)
def test_any_string_round_trips_and_substitutes_nothing(text: str) -> None:
    node = NukeNode("NoOp", "n1", {"label": text, "file": text, "note": text})
    nk = parse(render(NukeScript(root={"name": text}, nodes=(node,), comments=(text,))))
    assert nk.root["name"] == text
    assert nk.node("n1").knobs == {"label": text, "file": text, "note": text, "name": "n1"}
    # and one level deeper, for knobs Nuke evaluates as TCL (file paths, labels)
    assert not evaluates_tcl(tcl_literal(text))
    assert tcl_unliteral(tcl_literal(text)) == text


def test_the_parser_refuses_what_nuke_would_substitute() -> None:
    for body in ('label "a[b]"', 'label "$HOME"', "label a[b]", 'label "a"b'):
        with pytest.raises(NukeParseError):
            parse(f"NoOp {{\n {body}\n name n\n}}\n")


@pytest.mark.parametrize(
    ("root", "name"),
    [
        ('we ird [exec touch pwned] $HOME "q" {b} \\ é 漢字', "sh020_sapiens2_v001"),
        ("plain", 'sh"o{t}[x]$y\\z é'),
    ],
)
def test_hostile_paths_and_names_stay_text(tmp_path: Path, root: str, name: str) -> None:
    paths = ShotOutputPaths(Location(str(tmp_path / root)), name=name)
    nk = _script(paths)
    for read in nk.of_class("Read"):
        assert not evaluates_tcl(read.knobs["file"])
        assert tcl_unliteral(read.knobs["file"]) == paths.exr_pattern
    for node in nk.nodes:
        assert not evaluates_tcl(node.knobs.get("label", "")), node.name
    assert tcl_unliteral(nk.node("Backdrop_read").knobs["label"]).startswith(name + "\n")


def test_s3_paths_are_written_as_given_and_flagged(tmp_path: Path) -> None:
    paths = ShotOutputPaths.for_shot("s3://bucket/passes", "abc", "sq010", "sh020", "v001")
    nk = _script(paths, ("normal",))
    assert nk.node("Read_data").knobs["file"] == paths.exr_pattern
    assert paths.exr_pattern.startswith("s3://bucket/passes/abc/sq010/sh020/")
    assert "s3://" in nk.node("Backdrop_read").knobs["label"]
    local = _script(_layout(tmp_path), ("normal",))
    assert "s3" not in local.node("Backdrop_read").knobs["label"].lower()


def test_written_beside_the_exrs_atomically(tmp_path: Path) -> None:
    paths = _layout(tmp_path)
    uri = write_shot_nuke_script(
        paths, range(1001, 1011), ALL, image_size=(64, 36), data_window=(0, 0, 63, 35)
    )
    assert uri == paths.nuke_script == f"{paths.root}/{paths.name}.nk"
    path = Path(uri)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    nk = parse(path.read_text(encoding="utf-8"))
    assert nk.node("Read_data").knobs["file"] == paths.exr_pattern


def test_pose_only_writes_nothing(tmp_path: Path) -> None:
    paths = _layout(tmp_path)
    assert write_shot_nuke_script(paths, [1], ("pose",), image_size=(8, 8)) is None
    assert not Path(paths.root).exists()
    with pytest.raises(ValueError, match="nothing in the EXR"):
        build_shot_script(paths, [1], ("pose",), image_size=(8, 8))


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"frames": []}, "no frames"),
        ({"passes": ("normal", "shadow")}, "unknown passes"),
        ({"image_size": (0, 36)}, "not a picture"),
        ({"data_window": (0, 0, 10, 10)}, "data window"),
        ({"fps": float("nan")}, "positive"),
        ({"pixel_aspect": 0.0}, "positive"),
    ],
)
def test_bad_inputs_say_which_file_and_why(tmp_path: Path, kw: dict[str, Any], reason: str) -> None:
    paths = _layout(tmp_path)
    args: dict[str, Any] = {"frames": [1], "passes": ("normal",), "image_size": (64, 36)} | kw
    with pytest.raises(ValueError, match=reason) as err:
        build_shot_script(paths, args.pop("frames"), args.pop("passes"), **args)
    assert paths.nuke_script in str(err.value) or "unknown passes" in str(err.value)


def test_writer_refuses_what_it_cannot_write() -> None:
    read = NukeNode("Read", "r", {"file": "a"})
    with pytest.raises(ValueError, match="used twice"):
        render(NukeScript(nodes=(read, read)))
    with pytest.raises(ValueError, match="not written before"):
        render(NukeScript(nodes=(NukeNode("Shuffle", "s", inputs=("r",)), read)))
    with pytest.raises(ValueError, match="node name"):
        NukeNode("Read", "bad name")
    with pytest.raises(ValueError, match="node class"):
        NukeNode("Read {", "r")
    with pytest.raises(ValueError, match="knob name"):
        NukeNode("Read", "r", {"fi le": 1})
    with pytest.raises(ValueError, match="fields of NukeNode"):
        NukeNode("Read", "r", {"name": "x"})
    with pytest.raises(ValueError, match="cannot be written"):
        NukeNode("Read", "r", {"x": float("inf")})
    with pytest.raises(TypeError):
        quote([1, 2])  # type: ignore[arg-type]
    assert [quote(v) for v in (True, False, -3, 24.0, 23.976, 1e-9, "a/b.%04d.exr")] == [
        "true", "false", "-3", "24", "23.976", "1e-09", "a/b.%04d.exr"
    ]  # fmt: skip


def test_one_read_feeds_many_through_the_stack() -> None:
    read = NukeNode("Read", "r", {"file": "x"})
    nodes = (read, *(NukeNode("Shuffle", f"s{i}", {"in": "rgba"}, ("r",)) for i in range(3)))
    merge = NukeNode("Merge2", "m", {}, ("s2", "s0"))
    text = render(NukeScript(nodes=(*nodes, merge)))
    assert "push" in text and "[stack 0]" in text
    nk = parse(text)
    assert [node.inputs for node in nk.nodes] == [(), ("r",), ("r",), ("r",), ("s2", "s0")]


def test_layout_names_the_script() -> None:
    paths = ShotOutputPaths.for_shot("/out", "abc", "sq010", "sh020", "v001", element="bg01")
    assert (
        paths.nuke_script == "/out/abc/sq010/sh020/bg01/sapiens2_v001/sh020_bg01_sapiens2_v001.nk"
    )


def test_the_four_parts_mattes_go_to_rgba_through_the_data_read(tmp_path: Path) -> None:
    nk = _script(_layout(tmp_path), passes=("parts",))
    (shuffle,) = nk.of_class("Shuffle")
    assert shuffle.name == "Shuffle_parts" and shuffle.inputs == ("Read_data",)
    assert [shuffle.knobs[c] for c in ("red", "green", "blue", "alpha")] == [
        "red", "green", "blue", "alpha"
    ]  # fmt: skip
    assert "parts.clothing parts.face parts.hair parts.skin -> rgba" in shuffle.knobs["label"]


def test_motion_is_nukes_motion_layer_with_a_vector_blur_wired_to_it(tmp_path: Path) -> None:
    nk = _script(_layout(tmp_path), passes=("normal", "motion"))
    shuffle = nk.node("Shuffle_motion")
    assert shuffle.knobs["in"] == "motion" and shuffle.inputs == ("Read_data",)
    assert [shuffle.knobs[c] for c in ("red", "green", "blue", "alpha")] == [
        "red", "green", "blue", "alpha"
    ]  # fmt: skip
    assert "forward.u forward.v backward.u backward.v -> rgba" in shuffle.knobs["label"]
    (blur,) = nk.of_class("VectorBlur2")
    assert blur.name == "VectorBlur_motion"
    assert blur.inputs == ("Read_data",)  # raw: vectors must not be colour-converted
    assert blur.knobs["uv"] == "motion" and blur.knobs["disable"] == "true"
    assert float(blur.knobs["scale"]) == 0.5  # a 180-degree shutter of per-frame vectors
    backdrop = nk.node("Backdrop_motion")
    for node in (shuffle, blur):
        assert _inside(node, backdrop, NODE_SIZE), node.name
    others = [node for node in nk.nodes if node.cls != "BackdropNode"]
    for i, a in enumerate(others):
        for b in others[i + 1 :]:
            assert not _overlap(_box(a), _box(b)), (a.name, b.name)
    assert not {node.knobs["in"] for node in nk.of_class("Shuffle")} & {"forward", "backward"}
