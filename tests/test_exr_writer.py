"""Multi-part EXR passes, read back with OpenEXR and with OpenImageIO."""

from __future__ import annotations

import hashlib
import io
import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import OpenEXR
import OpenImageIO as oiio
import pytest
import s3fs

from schemas.passes import DEFAULT_PASSES, PASS_NAMES, exr_layers
from storage import cryptomatte
from storage.errors import FrameError
from storage.exr_writer import DEFAULT_CAMERA_AXES, write_passes_exr
from storage.frame import Frame
from storage.location import Location
from tests.exr_parts import exr_parts
from tests.test_cryptomatte import BODY_PARTS

# Overscan: a 37x23 data window (odd size) around a 30x18 display window, anamorphic 2:1.
DATA_WINDOW = (-3, -2, 33, 20)
DISPLAY_WINDOW = (0, 0, 29, 17)
HEIGHT, WIDTH = 23, 37
PROVENANCE = {
    "sapiens2/model": "sapiens2_0.4b",
    "sapiens2/checkpointSha256": "ab" * 32,
    "sapiens2/colorTransform": "ACEScg -> sRGB - Display",
    "sapiens2/platformVersion": "0.1.0",
    "sapiens2/weights": "untrained",
}
EXPECTED_CHANNELS = {
    "N": (["N.x", "N.y", "N.z"], np.float16),
    "P": (["P.x", "P.y", "P.z", "depth.Z"], np.float32),
    "albedo": (["albedo.R", "albedo.G", "albedo.B"], np.float16),
    "matte": (["matte.A"], np.float16),
    "CryptoBodyPart": (cryptomatte.channel_names("CryptoBodyPart", 6), np.float32),
    "seg": (["seg.id"], np.uint32),
}
# the parts of every Sapiens2 pass, in the writer's order (relDepth is Sapiens v1's)
LAYERS = exr_layers(PASS_NAMES)
WRITTEN = [layer.part for layer in exr_layers(DEFAULT_PASSES)]
OIIO_TYPES = {np.float16: "half", np.float32: "float", np.uint32: "uint"}


@pytest.fixture
def plate() -> Frame:
    return Frame(
        pixels=np.zeros((HEIGHT, WIDTH, 3), np.float32),
        uri="/plates/sh010.1001.exr",
        frame=1001,
        data_window=DATA_WINDOW,
        display_window=DISPLAY_WINDOW,
        pixel_aspect=2.0,
        attributes={
            "timeCode": "10:20:30:12",
            "framesPerSecond": 23.976,
            "capDate": "2026:03:04 05:06:07",
            "unrelated": object(),
        },
    )


@pytest.fixture
def passes() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    normal = rng.normal(size=(HEIGHT, WIDTH, 3)).astype(np.float32)
    normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
    logits = rng.normal(size=(HEIGHT, WIDTH, 29)) * 4
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return {
        "normal": normal,
        "pointmap": (rng.normal(size=(HEIGHT, WIDTH, 3)) * 3 + [0, 0, 5]).astype(np.float32),
        "albedo": rng.random((HEIGHT, WIDTH, 3), dtype=np.float32),
        "matte": rng.random((HEIGHT, WIDTH), dtype=np.float32),
        "seg": probabilities.astype(np.float32),
    }


def _write_all(path: Path, plate: Frame, passes: dict[str, np.ndarray], **kw: Any) -> Any:
    parts = exr_parts(passes, BODY_PARTS)
    return write_passes_exr(
        str(path), plate, LAYERS, parts, PROVENANCE, class_names=BODY_PARTS, **kw
    )


def _parts(passes: dict[str, np.ndarray], *names: str) -> dict[str, dict[str, np.ndarray]]:
    """Only the parts named, of every pass given."""
    every = exr_parts(passes, BODY_PARTS)
    return {name: every[name] for name in names}


def test_openexr_reads_every_part_as_specified(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    path = tmp_path / "sh010.1001.exr"
    result = _write_all(path, plate, passes)
    assert result.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert result.size == path.stat().st_size

    exr = OpenEXR.File(str(path), separate_channels=True)
    assert [part.name() for part in exr.parts] == WRITTEN
    crypto_key = cryptomatte.layer_key("CryptoBodyPart")
    all_channels = [name for part in exr.parts for name in part.channels]
    assert len(all_channels) == len(set(all_channels))  # Nuke merges every part's channels
    for part in exr.parts:
        header = part.header
        # What a multi-part file needs per part: a unique name, a type, a chunk count; no view.
        assert header["name"] == part.name()
        assert header["chunkCount"] > 0
        assert "view" not in header
        names, dtype = EXPECTED_CHANNELS[part.name()]
        assert sorted(part.channels) == sorted(names)
        assert {c.pixels.dtype for c in part.channels.values()} == {np.dtype(dtype)}
        assert all(c.pixels.shape == (HEIGHT, WIDTH) for c in part.channels.values())
        assert header["compression"] == OpenEXR.ZIP_COMPRESSION
        assert header["type"] == OpenEXR.scanlineimage
        assert [list(v) for v in header["dataWindow"]] == [[-3, -2], [33, 20]]
        assert [list(v) for v in header["displayWindow"]] == [[0, 0], [29, 17]]
        assert header["pixelAspectRatio"] == 2.0
        timecode = header["timeCode"]
        assert (timecode.hours, timecode.minutes, timecode.seconds, timecode.frame) == (
            10,
            20,
            30,
            12,
        )
        assert header["framesPerSecond"] == Fraction(24000, 1001)
        assert header["capDate"] == "2026:03:04 05:06:07"
        for key, value in PROVENANCE.items():
            assert header[key] == value
        assert header["sapiens2/cameraAxes"] == DEFAULT_CAMERA_AXES
        assert header["colorInteropID"] == ("lin_ap1_scene" if part.name() == "albedo" else "data")
        assert header[f"cryptomatte/{crypto_key}/name"] == "CryptoBodyPart"
        assert "unrelated" not in header
        if part.name() == "seg":
            assert json.loads(header["sapiens2/classNames"]) == BODY_PARTS

    channels = {name: c.pixels for part in exr.parts for name, c in part.channels.items()}
    for axis, index in (("x", 0), ("y", 1), ("z", 2)):
        expected_half = passes["normal"][..., index].astype(np.float16)
        np.testing.assert_array_equal(channels[f"N.{axis}"], expected_half)
        np.testing.assert_allclose(channels[f"N.{axis}"], passes["normal"][..., index], atol=1e-3)
        np.testing.assert_array_equal(channels[f"P.{axis}"], passes["pointmap"][..., index])
    np.testing.assert_array_equal(channels["depth.Z"], passes["pointmap"][..., 2])
    for colour, index in (("R", 0), ("G", 1), ("B", 2)):
        np.testing.assert_allclose(
            channels[f"albedo.{colour}"], passes["albedo"][..., index], atol=5e-4
        )
    np.testing.assert_allclose(channels["matte.A"], passes["matte"], atol=5e-4)
    labels = np.argmax(passes["seg"], axis=-1)
    np.testing.assert_array_equal(channels["seg.id"], labels)


def test_cryptomatte_ids_decode_to_class_names(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    path = tmp_path / "crypto.exr"
    write_passes_exr(
        str(path),
        plate,
        LAYERS,
        _parts(passes, "CryptoBodyPart"),
        PROVENANCE,
        class_names=BODY_PARTS,
    )
    exr = OpenEXR.File(str(path), separate_channels=True)
    assert [part.name() for part in exr.parts] == ["CryptoBodyPart"]
    header = exr.parts[0].header
    key = cryptomatte.layer_key("CryptoBodyPart")
    assert header[f"cryptomatte/{key}/hash"] == "MurmurHash3_32"
    assert header[f"cryptomatte/{key}/conversion"] == "uint32_to_float32"
    by_bits = cryptomatte.decode_manifest(header[f"cryptomatte/{key}/manifest"])
    rank0 = exr.parts[0].channels["CryptoBodyPart00.R"].pixels
    decoded = np.vectorize(lambda v: by_bits[cryptomatte.float_to_bits(v)])(rank0)
    expected = np.asarray(BODY_PARTS)[np.argmax(passes["seg"], axis=-1)]
    np.testing.assert_array_equal(decoded, expected)
    coverage = sum(
        exr.parts[0].channels[f"CryptoBodyPart{layer:02d}.{c}"].pixels
        for layer in range(3)
        for c in "GA"
    )
    np.testing.assert_allclose(coverage, 1.0, atol=1e-5)


def test_openimageio_reads_parts_windows_types_and_attributes(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    path = tmp_path / "oiio.exr"
    _write_all(path, plate, passes)
    image = oiio.ImageInput.open(str(path))
    assert image is not None, oiio.geterror()
    try:
        seen = []
        subimage = 0
        while image.seek_subimage(subimage, 0):
            spec = image.spec()
            name = spec.getattribute("oiio:subimagename")
            seen.append(name)
            names, dtype = EXPECTED_CHANNELS[name]
            assert sorted(spec.channelnames) == sorted(names)
            formats = spec.channelformats or (spec.format,) * spec.nchannels
            assert {str(f) for f in formats} == {OIIO_TYPES[dtype]}
            assert spec.getattribute("compression") == "zip"
            assert (spec.x, spec.y, spec.width, spec.height) == (-3, -2, WIDTH, HEIGHT)
            assert (spec.full_x, spec.full_y, spec.full_width, spec.full_height) == (0, 0, 30, 18)
            assert spec.getattribute("PixelAspectRatio") == 2.0
            assert spec.getattribute("smpte:TimeCode")[0] == 0x10203012  # 10:20:30:12 in BCD
            assert tuple(spec.getattribute("FramesPerSecond")) == (24000, 1001)
            for key, value in PROVENANCE.items():
                assert spec.getattribute(key) == value
            # OpenImageIO normalises uint to [0, 1] when asked for float: read ids as uint.
            pixel_type = "uint" if name == "seg" else "float"
            pixels = image.read_image(subimage, 0, 0, spec.nchannels, pixel_type)
            assert pixels.shape == (HEIGHT, WIDTH, spec.nchannels)
            if name == "P":
                index = list(spec.channelnames).index("depth.Z")
                np.testing.assert_array_equal(pixels[..., index], passes["pointmap"][..., 2])
            if name == "seg":
                np.testing.assert_array_equal(pixels[..., 0], np.argmax(passes["seg"], axis=-1))
            if name == "N":
                index = list(spec.channelnames).index("N.y")
                np.testing.assert_allclose(pixels[..., index], passes["normal"][..., 1], atol=1e-3)
            subimage += 1
        assert seen == WRITTEN
    finally:
        image.close()


def test_only_the_parts_given_in_their_order(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    path = tmp_path / "some.exr"
    write_passes_exr(str(path), plate, LAYERS, _parts(passes, "N"), PROVENANCE)
    assert [p.name() for p in OpenEXR.File(str(path)).parts] == ["N"]
    write_passes_exr(
        str(path), plate, LAYERS, _parts(passes, "seg", "P"), PROVENANCE, class_names=BODY_PARTS
    )
    exr = OpenEXR.File(str(path))
    assert [p.name() for p in exr.parts] == ["P", "seg"]
    # No Cryptomatte channels, so no Cryptomatte metadata pointing at a missing layer.
    assert not any(key.startswith("cryptomatte/") for p in exr.parts for key in p.header)


def test_bad_input_names_file_and_frame(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    path = str(tmp_path / "bad.exr")
    normal = _parts(passes, "N")
    short = {"N": {name: plane[1:] for name, plane in normal["N"].items()}}
    with pytest.raises(FrameError, match=r"frame 1001 .*bad\.exr.*\(22, 37\).*\(23, 37\)"):
        write_passes_exr(path, plate, LAYERS, short, PROVENANCE)
    as_float = {"N": {name: plane.astype(np.float32) for name, plane in normal["N"].items()}}
    with pytest.raises(FrameError, match=r"part 'N': N.x is float32, .* float16"):
        write_passes_exr(path, plate, LAYERS, as_float, PROVENANCE)
    with pytest.raises(FrameError, match=r"channels \['N.x', 'N.y'\] given"):
        write_passes_exr(
            path, plate, LAYERS, {"N": dict(list(normal["N"].items())[:2])}, PROVENANCE
        )
    with pytest.raises(FrameError, match="unknown EXR parts"):
        write_passes_exr(path, plate, LAYERS, {"normal": normal["N"]}, PROVENANCE)
    with pytest.raises(FrameError, match="no part"):
        write_passes_exr(path, plate, LAYERS, {}, PROVENANCE)
    with pytest.raises(FrameError, match="class_names"):
        write_passes_exr(path, plate, LAYERS, _parts(passes, "seg"), PROVENANCE)
    with pytest.raises(FrameError, match="compression"):
        write_passes_exr(path, plate, LAYERS, _parts(passes, "matte"), {"compression": "dwaa"})
    assert not (tmp_path / "bad.exr").exists()


def test_camera_axes_can_be_declared(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    path = tmp_path / "gl.exr"
    axes = {"sapiens2/cameraAxes": "opengl: +x right, +y up, -z forward"}
    write_passes_exr(str(path), plate, LAYERS, _parts(passes, "N"), axes)
    header = OpenEXR.File(str(path)).parts[0].header
    assert header["sapiens2/cameraAxes"] == axes["sapiens2/cameraAxes"]


def test_timecode_from_openimageio_and_openexr_forms(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    path = tmp_path / "tc.exr"
    for value in ((0x10203012, 0), (10, 20, 30, 12, 0, 0, 0, 0, 0, 0)):
        plate.attributes = {"smpte:TimeCode": value, "FramesPerSecond": (25, 1)}
        write_passes_exr(str(path), plate, LAYERS, _parts(passes, "matte"), PROVENANCE)
        header = OpenEXR.File(str(path)).parts[0].header
        timecode = header["timeCode"]
        assert (timecode.hours, timecode.minutes, timecode.seconds, timecode.frame) == (
            10,
            20,
            30,
            12,
        )
        assert header["framesPerSecond"] == Fraction(25, 1)


def test_writes_to_s3(
    s3_bucket: tuple[str, dict[str, Any]], plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    root, options = s3_bucket
    uri = f"{root}/show/sq/sh010/v001/sh010.1001.exr"
    result = write_passes_exr(
        Location(uri, options),
        plate,
        LAYERS,
        exr_parts(passes, BODY_PARTS),
        PROVENANCE,
        class_names=BODY_PARTS,
    )
    data = s3fs.S3FileSystem(**options).cat_file(uri)
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    exr = OpenEXR.File(io.BytesIO(data), separate_channels=True)
    assert [p.name() for p in exr.parts] == WRITTEN
    manifest = json.loads(
        exr.parts[0].header[f"cryptomatte/{cryptomatte.layer_key('CryptoBodyPart')}/manifest"]
    )
    assert list(manifest) == BODY_PARTS
