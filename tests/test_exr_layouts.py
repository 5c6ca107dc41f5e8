"""Both EXR layouts (multi-part, single-part) through the readers outside Nuke: OpenEXR's own
Python reader, OpenImageIO and cryptomatte-api (a C++ reader that validates manifests, hashes
and channel names and reads only a file's first part). Every body-part mask is decoded by name
and compared with the coverage the writer was given; a resubmit that asks for another layout
than the version's files is refused."""

# ruff: noqa: F811 (the fixtures plate and passes are test_exr_writer's, taken as arguments)
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import cryptomatte_api
import numpy as np
import OpenEXR
import OpenImageIO as oiio
import pytest

from flows.inputs import exr_layout_problem
from schemas.spec import ShotSpec, parse_spec
from storage import cryptomatte
from storage.exr_layout import exr_layout
from storage.exr_writer import write_passes_exr
from storage.frame import Frame
from storage.layers import ExrLayout
from storage.zarr_store import read_stored_frame
from tasks.chunk_worker import process_chunk
from tasks.output_paths import ShotOutputPaths
from tests.exr_parts import exr_parts
from tests.shot_helpers import make_plate, small_chunk_job, spec_data
from tests.test_cryptomatte import BODY_PARTS
from tests.test_exr_writer import (  # noqa: F401 (fixtures)
    EXPECTED_CHANNELS,
    LAYERS,
    PROVENANCE,
    passes,
    plate,
)

CRYPTO = "CryptoBodyPart"
KEY = cryptomatte.layer_key(CRYPTO)


def _write(
    path: Path, plate: Frame, passes: Mapping[str, np.ndarray], layout: ExrLayout, *names: str
) -> dict[str, dict[str, np.ndarray]]:
    """Write the parts named (every part without names); returns what the writer was given."""
    given = exr_parts(passes, BODY_PARTS)
    if names:
        given = {name: given[name] for name in names}
    write_passes_exr(
        str(path), plate, LAYERS, given, PROVENANCE, class_names=BODY_PARTS, layout=layout
    )
    return given


def _planes(given: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Channel name -> plane of what the writer was given ((H, W, 3) colour split in R/G/B)."""
    planes: dict[str, np.ndarray] = {}
    for channels in given.values():
        for key, values in channels.items():
            if values.ndim == 3:
                planes.update({f"{key}.{c}": values[..., i] for i, c in enumerate("RGB")})
            else:
                planes[key] = values
    return planes


def _masks(channels: Mapping[str, np.ndarray], manifest: str) -> dict[str, np.ndarray]:
    """Every manifest name's mask: the summed coverage of the ranks holding its ID."""
    names = {name: cryptomatte.hex_to_id(hex_id) for name, hex_id in json.loads(manifest).items()}
    ranks = [
        (f"{CRYPTO}{i:02d}.{a}", f"{CRYPTO}{i:02d}.{b}") for i in range(3) for a, b in ("RG", "BA")
    ]
    return {
        name: sum(
            np.where(channels[ident].view(np.uint32) == value.view(np.uint32), channels[cov], 0)
            for ident, cov in ranks
        ).astype(np.float32)
        for name, value in names.items()
    }


def _written_masks(given: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    manifest = cryptomatte.metadata(CRYPTO, BODY_PARTS)[f"cryptomatte/{KEY}/manifest"]
    return _masks(_planes(given), manifest)


def _openexr_channels(path: Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """Every channel of every part, and the header of the part holding the Cryptomatte."""
    exr = OpenEXR.File(str(path), separate_channels=True)
    channels = {n: c.pixels for part in exr.parts for n, c in part.channels.items()}
    crypto = next(p for p in exr.parts if f"{CRYPTO}00.R" in p.channels)
    return channels, crypto.header


def _oiio_channels(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str], str]:
    """Every channel of every subimage in its own type (uint read as uint), the OIIO type of
    each, and the Cryptomatte manifest as OIIO reads it."""
    image = oiio.ImageInput.open(str(path))
    assert image is not None, oiio.geterror()
    channels: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    manifest = ""
    try:
        subimage = 0
        while image.seek_subimage(subimage, 0):
            spec = image.spec()
            formats = spec.channelformats or (spec.format,) * spec.nchannels
            for index, (name, fmt) in enumerate(zip(spec.channelnames, formats, strict=True)):
                read_as = "uint" if str(fmt) == "uint" else "float"
                pixels = image.read_image(subimage, 0, index, index + 1, read_as)
                channels[name], types[name] = pixels[..., 0], str(fmt)
            manifest = spec.getattribute(f"cryptomatte/{KEY}/manifest") or manifest
            subimage += 1
    finally:
        image.close()
    return channels, types, manifest


def test_single_part_holds_every_layer_of_the_multi_part_file(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    """The same channels, types and values in one header; what each part's header said of its
    layer is said per layer (Nuke takes the layers from the channel names either way)."""
    _write(tmp_path / "multi.exr", plate, passes, "multipart")
    _write(tmp_path / "single.exr", plate, passes, "single")
    multi = OpenEXR.File(str(tmp_path / "multi.exr"), separate_channels=True)
    single = OpenEXR.File(str(tmp_path / "single.exr"), separate_channels=True)
    assert len(multi.parts) == len(EXPECTED_CHANNELS)
    assert len(single.parts) == 1
    one = single.parts[0]
    every = {n: c.pixels for part in multi.parts for n, c in part.channels.items()}
    assert sorted(one.channels) == sorted(every)
    for name, values in every.items():
        assert one.channels[name].pixels.dtype == values.dtype, name
        np.testing.assert_array_equal(one.channels[name].pixels, values, err_msg=name)
    header = one.header
    for part in multi.parts:
        layer = part.name()
        assert header[f"sapiens2/content/{layer}"] == part.header["sapiens2/content"]
        assert header[f"sapiens2/colorInteropID/{layer}"] == part.header["colorInteropID"]
    assert header["sapiens2/classNames/seg"] == multi.parts[-1].header["sapiens2/classNames"]
    assert "colorInteropID" not in header  # albedo is scene-linear, the rest data
    assert header[f"cryptomatte/{KEY}/name"] == CRYPTO
    for key, value in PROVENANCE.items():
        assert header[key] == value
    assert (exr_layout(str(tmp_path / "multi.exr")), exr_layout(str(tmp_path / "single.exr"))) == (
        "multipart",
        "single",
    )


def test_single_part_of_data_layers_only_is_tagged_data(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    _write(tmp_path / "data.exr", plate, passes, "single", "N", "matte")
    header = OpenEXR.File(str(tmp_path / "data.exr")).parts[0].header
    assert header["colorInteropID"] == "data"


@pytest.mark.parametrize("layout", ["multipart", "single"])
def test_openexr_decodes_every_body_part_by_name(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray], layout: ExrLayout
) -> None:
    given = _write(tmp_path / "f.exr", plate, passes, layout)
    channels, header = _openexr_channels(tmp_path / "f.exr")
    decoded = _masks(channels, str(header[f"cryptomatte/{KEY}/manifest"]))
    expected = _written_masks(given)
    assert sorted(decoded) == sorted(BODY_PARTS)
    for name in BODY_PARTS:
        np.testing.assert_array_equal(decoded[name], expected[name], err_msg=name)
    np.testing.assert_allclose(sum(decoded.values()), 1.0, atol=1e-5)


@pytest.mark.parametrize("layout", ["multipart", "single"])
def test_openimageio_reads_every_channel_in_its_type_and_every_body_part(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray], layout: ExrLayout
) -> None:
    given = _write(tmp_path / "f.exr", plate, passes, layout)
    channels, types, manifest = _oiio_channels(tmp_path / "f.exr")
    oiio_type = {np.float16: "half", np.float32: "float", np.uint32: "uint"}
    written = _planes(given)
    assert sorted(channels) == sorted(written)
    for part, (names, dtype) in EXPECTED_CHANNELS.items():
        for name in names:
            assert types[name] == oiio_type[dtype], (part, name)
            np.testing.assert_array_equal(
                channels[name], written[name].astype(channels[name].dtype), err_msg=name
            )
    assert manifest, "OpenImageIO does not see the Cryptomatte manifest"
    decoded = _masks(channels, manifest)
    expected = _written_masks(given)
    for name in BODY_PARTS:
        np.testing.assert_array_equal(decoded[name], expected[name], err_msg=name)


@pytest.mark.parametrize(
    ("layout", "names"),
    [("single", ()), ("single", (CRYPTO,)), ("multipart", (CRYPTO, "seg"))],
    ids=["single-every-pass", "single-seg-only", "multipart-seg-only"],
)
def test_cryptomatte_api_decodes_every_body_part_by_name(
    tmp_path: Path,
    plate: Frame,
    passes: dict[str, np.ndarray],
    layout: ExrLayout,
    names: tuple[str, ...],
) -> None:
    given = _write(tmp_path / "f.exr", plate, passes, layout, *names)
    (matte,) = cryptomatte_api.Cryptomatte.load(str(tmp_path / "f.exr"))
    assert (matte.width(), matte.height()) == (given[CRYPTO][f"{CRYPTO}00.R"].shape[::-1])
    assert matte.num_levels() == cryptomatte.DEFAULT_RANKS
    expected = _written_masks(given)
    decoded = matte.masks()
    assert sorted(decoded) == sorted(BODY_PARTS)
    for name in BODY_PARTS:
        np.testing.assert_allclose(matte.mask(name), expected[name], atol=1e-6, err_msg=name)
        np.testing.assert_allclose(decoded[name], expected[name], atol=1e-6, err_msg=name)


def test_cryptomatte_api_cannot_read_a_multipart_file_whose_first_part_is_another_pass(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    """Why the single layout exists: cryptomatte-api 1.0.0 reads only the first part. If this
    starts passing, the reader table of docs/user/outputs.md and the default deserve another
    look."""
    _write(tmp_path / "f.exr", plate, passes, "multipart")
    with pytest.raises(ValueError, match="empty channel list"):
        cryptomatte_api.Cryptomatte.load(str(tmp_path / "f.exr"))


def _spec(layout: ExrLayout) -> ShotSpec:
    return ShotSpec(
        plate="/p/plate.####.exr",
        show="x",
        sequence="sq",
        shot="sh010",
        exr_layout=layout,
        tiles="all",  # as every output was made before the person gate
    )


def test_resubmit_with_another_layout_than_the_versions_files_is_refused(
    tmp_path: Path, plate: Frame, passes: dict[str, np.ndarray]
) -> None:
    paths = ShotOutputPaths.for_shot(str(tmp_path), "x", "sq", "sh010", "v001")
    assert exr_layout_problem(_spec("single"), paths) is None  # nothing written yet
    Path(paths.root).mkdir(parents=True)
    _write(Path(paths.exr(1001)), plate, passes, "multipart", "N")  # one part: no multi bit
    assert exr_layout_problem(_spec("multipart"), paths) is None
    problem = exr_layout_problem(_spec("single"), paths)
    assert problem is not None and "\n" not in problem
    assert problem.startswith(paths.exr(1001))
    assert "version v001 of x/sq/sh010" in problem
    assert "exr_layout multipart, this submit asks for single" in problem


def test_layout_is_in_the_cache_key_only_when_it_changes_the_bytes() -> None:
    # the digest every multi-part output was recorded with before the option existed
    assert _spec("multipart").settings_digest() == "faafd616a63f19e2"
    assert _spec("single").settings_digest() != _spec("multipart").settings_digest()


def test_a_worker_writes_the_single_layout_that_first_part_readers_decode(tmp_path: Path) -> None:
    """Through the chunk worker (tiny untrained models): the frame's EXR is one part, its
    Cryptomatte decodes in cryptomatte-api, and its class index is what the Zarr store holds."""
    pattern = make_plate(tmp_path / "plates", frames=1)
    spec = parse_spec(spec_data(pattern, tmp_path / "out", model_size="tiny", exr_layout="single"))
    job = small_chunk_job(tmp_path, pattern, spec, (1001,))
    (frame,) = process_chunk(job).frames
    assert frame.status == "done", frame.error
    path = job.paths.exr(1001)
    assert exr_layout(path) == "single"
    exr = OpenEXR.File(path, separate_channels=True)
    assert len(exr.parts) == 1
    channels = {n: c.pixels for n, c in exr.parts[0].channels.items()}
    (matte,) = cryptomatte_api.Cryptomatte.load(path)
    manifest = str(exr.parts[0].header[f"cryptomatte/{KEY}/manifest"])
    expected = _masks(channels, manifest)
    names = sorted(json.loads(manifest))
    assert sorted(matte.masks()) == names
    for name in names:
        np.testing.assert_allclose(matte.mask(name), expected[name], atol=1e-6, err_msg=name)
    stored = read_stored_frame(job.paths.zarr, 0)
    np.testing.assert_array_equal(stored["seg"], channels["seg.id"].astype(np.uint8))
