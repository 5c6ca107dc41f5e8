"""Colour: plate -> model encoding, albedo -> scene-linear, names, guesses, provenance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tasks.colour as colour
from storage.frame import Frame
from storage.plate_reader import read_plate_frame
from tasks.colour import (
    MODEL_ENCODING,
    ColourConversion,
    albedo_to_scene_linear,
    guess_colourspace,
    resolve_colourspace,
    to_model_encoding,
    working_space_for,
)
from tests.plates import (
    AP1_CHROMATICITIES,
    REC709_CHROMATICITIES,
    code_ramp,
    ramp,
    write_exr,
    write_image,
)


def grey(value: float, channels: int = 3) -> np.ndarray:
    return np.full((2, 3, channels), value, dtype=np.float32)


@pytest.mark.parametrize(
    ("space", "value", "expected", "tolerance"),
    [
        ("acescg", 0.18, 0.4614, 2e-3),  # mid-grey lands where photos keep it
        ("lin_rec709", 1.0, 1.0, 1e-4),
        ("lin_rec709", 0.0, 0.0, 1e-6),
        ("srgb", 0.5, 0.5, 1e-6),
        ("logc3", 0.391, 0.4613, 2e-3),  # LogC3 (EI800) 18% grey code value
        ("logc4", 0.28, 0.4656, 2e-3),
        ("aces", 0.18, 0.4614, 2e-2),  # AP0 grey stays neutral grey
    ],
)
def test_known_values_to_model_encoding(
    space: str, value: float, expected: float, tolerance: float
) -> None:
    out, info = to_model_encoding(grey(value), space)
    np.testing.assert_allclose(out, expected, atol=tolerance)
    assert info.target == MODEL_ENCODING


def test_srgb_plate_is_left_unchanged() -> None:
    pixels = np.random.default_rng(1).random((16, 16, 3), dtype=np.float32)
    out, _ = to_model_encoding(pixels, "sRGB")
    np.testing.assert_allclose(out, pixels, atol=1e-6)


def test_output_is_clamped_to_unit_range() -> None:
    pixels = np.array([[[4.0, -0.5, 0.18]]], dtype=np.float32)
    out, _ = to_model_encoding(pixels, "lin_rec709")
    assert out[0, 0, 0] == 1.0
    assert out[0, 0, 1] == 0.0
    assert 0.0 < out[0, 0, 2] < 1.0


def test_view_mode_tone_maps_and_compresses_highlights() -> None:
    conversion = ColourConversion("ACEScg", mode="view")
    out = conversion.to_model_encoding(np.array([[[0.18] * 3, [4.0] * 3]], dtype=np.float32))
    np.testing.assert_allclose(out[0, 0], 0.349, atol=3e-3)
    assert 0.85 < out[0, 1, 0] < 1.0  # 4.0 stays below display white
    assert conversion.to_model_info.view == colour.VIEW_NAME
    assert conversion.to_model_info.display == colour.VIEW_DISPLAY


def test_alpha_passes_through_untouched() -> None:
    pixels = grey(0.18, channels=4)
    pixels[..., 3] = 0.25
    out, _ = to_model_encoding(pixels, "ACEScg")
    np.testing.assert_array_equal(out[..., 3], 0.25)
    np.testing.assert_allclose(out[..., :3], 0.4614, atol=2e-3)


def test_inplace_conversion_reuses_the_array_and_copy_does_not() -> None:
    pixels = grey(0.18)
    copy_out, _ = to_model_encoding(pixels, "ACEScg")
    assert copy_out is not pixels
    np.testing.assert_array_equal(pixels, np.float32(0.18))
    same, _ = to_model_encoding(pixels, "ACEScg", inplace=True)
    assert same is pixels
    np.testing.assert_allclose(pixels, 0.4614, atol=2e-3)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        to_model_encoding(grey(0.18).astype(np.float16), "ACEScg", inplace=True)


@pytest.mark.parametrize("working_space", ["ACEScg", "lin_rec709"])
def test_albedo_round_trip_for_in_gamut_values(working_space: str) -> None:
    rng = np.random.default_rng(7)
    albedo = rng.uniform(0.02, 0.98, size=(8, 8, 3)).astype(np.float32)
    linear, info = albedo_to_scene_linear(albedo, working_space)
    assert info.source == MODEL_ENCODING
    assert info.target == resolve_colourspace(working_space)
    back, _ = to_model_encoding(linear, working_space)
    np.testing.assert_allclose(back, albedo, atol=1e-4)
    # ...and the other way: an in-gamut scene-linear plate through the model encoding.
    again, _ = albedo_to_scene_linear(back, working_space)
    np.testing.assert_allclose(again, linear, atol=1e-4)


def test_albedo_grey_goes_back_to_scene_linear_grey() -> None:
    linear, _ = albedo_to_scene_linear(grey(0.4614), "ACEScg")
    np.testing.assert_allclose(linear, 0.18, atol=1e-3)


def test_plate_space_decides_the_albedo_working_space() -> None:
    assert ColourConversion("acescg").working_space == "ACEScg"
    assert ColourConversion("lin_rec709").working_space == "Linear Rec.709 (sRGB)"
    assert ColourConversion("srgb").working_space == "Linear Rec.709 (sRGB)"
    assert ColourConversion("rec709").working_space == "Linear Rec.709 (sRGB)"
    assert ColourConversion("logc3").working_space == "ACEScg"
    assert ColourConversion("aces").working_space == "ACES2065-1"
    assert ColourConversion("logc4", working_space="lin_rec709").working_space == (
        "Linear Rec.709 (sRGB)"
    )
    assert working_space_for("ARRI LogC4") == "ACEScg"
    # the EXR tag says the same space (it was ACEScg's for every plate)
    assert ColourConversion("srgb").albedo_interop_id == "lin_rec709_scene"
    assert ColourConversion("logc3").albedo_interop_id == "lin_ap1_scene"
    assert ColourConversion("aces").albedo_interop_id == "lin_ap0_scene"


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("acescg", "ACEScg"),
        ("ACESCG", "ACEScg"),
        ("aces", "ACES2065-1"),
        ("lin_rec709", "Linear Rec.709 (sRGB)"),
        ("Lin Rec709", "Linear Rec.709 (sRGB)"),
        ("srgb", "sRGB Encoded Rec.709 (sRGB)"),
        ("sRGB - Texture", "sRGB Encoded Rec.709 (sRGB)"),
        ("logc3", "ARRI LogC3 (EI800)"),
        ("LOGC4", "ARRI LogC4"),
        ("rec709", "Camera Rec.709"),
        ("arri logc3 (ei800)", "ARRI LogC3 (EI800)"),
        ("Input - ARRI - V3 LogC (EI800) - Wide Gamut", "ARRI LogC3 (EI800)"),
        ("scene_linear", "ACEScg"),
        ("lin_ap1_scene", "ACEScg"),
    ],
)
def test_colour_space_names_and_aliases(alias: str, name: str) -> None:
    assert resolve_colourspace(alias) == name


def test_unknown_colour_space_lists_close_matches() -> None:
    with pytest.raises(ValueError, match=r"unknown colour space 'acecg'.*close matches:.*ACEScg"):
        ColourConversion("acecg")
    with pytest.raises(ValueError, match=r"'logc5'.*ARRI LogC4"):
        to_model_encoding(grey(0.1), "logc5")


def test_every_conversion_reports_its_provenance() -> None:
    conversion = ColourConversion("logc3")
    info = conversion.to_model_info.as_dict()
    assert info["config_name"].startswith("studio-config-v")
    assert info["config_uri"].startswith("ocio://studio-config-v")  # resolved, never "latest"
    assert "latest" not in info["config_uri"]
    assert info["ocio_version"].count(".") == 2
    assert info["source"] == "ARRI LogC3 (EI800)"
    assert info["target"] == MODEL_ENCODING
    assert "ARRI LogC3 (EI800)" in info["description"]
    assert "display" not in info  # colorimetric: no display/view
    albedo = conversion.albedo_info
    assert (albedo.source, albedo.target) == (MODEL_ENCODING, "ACEScg")


def test_processors_are_built_once_and_cached() -> None:
    ColourConversion("logc4").to_model_encoding(grey(0.28))
    before = colour._processor.cache_info()
    ColourConversion("logc4").to_model_encoding(grey(0.28))
    after = colour._processor.cache_info()
    assert after.hits == before.hits + 1
    assert after.misses == before.misses


def test_rejects_pixels_that_are_not_rgb_images() -> None:
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        to_model_encoding(np.zeros((4, 4), np.float32), "srgb")


def _float_frame(**attributes: object) -> Frame:
    return Frame(
        pixels=ramp(),
        uri="plate.1001.exr",
        frame=1001,
        data_window=(0, 0, 7, 5),
        display_window=(0, 0, 7, 5),
        source_type="half",
        bit_depth=16,
        attributes=dict(attributes),
    )


def test_guess_float_exr_without_metadata_is_acescg() -> None:
    guess = guess_colourspace(_float_frame())
    assert guess.colourspace == "ACEScg"
    assert not guess.certain
    assert "ACEScg" in guess.reason and "no colour metadata" in guess.reason


def test_guess_follows_exr_chromaticities(tmp_path: Path) -> None:
    rec709 = read_plate_frame(
        str(write_exr(tmp_path / "a.exr", chromaticities=REC709_CHROMATICITIES))
    )
    guess = guess_colourspace(rec709)
    assert guess.colourspace == "Linear Rec.709 (sRGB)"
    assert guess.certain and "chromaticities" in guess.reason
    ap1 = read_plate_frame(str(write_exr(tmp_path / "b.exr", chromaticities=AP1_CHROMATICITIES)))
    assert guess_colourspace(ap1).colourspace == "ACEScg"
    odd = _float_frame(chromaticities=(0.5, 0.3, 0.3, 0.5, 0.2, 0.1, 0.3, 0.3))
    assert guess_colourspace(odd).colourspace == "ACEScg"
    assert not guess_colourspace(odd).certain


def test_guess_follows_an_explicit_interop_id() -> None:
    guess = guess_colourspace(_float_frame(colorInteropID="lin_rec709_scene"))
    assert guess.colourspace == "Linear Rec.709 (sRGB)"
    assert "colorInteropID" in guess.reason


@pytest.mark.parametrize(("name", "bits"), [("a.png", 8), ("a.jpg", 8), ("a.tif", 16)])
def test_guess_integer_images_are_srgb(tmp_path: Path, name: str, bits: int) -> None:
    frame = read_plate_frame(str(write_image(tmp_path / name, code_ramp(2, 3, bits), bits)))
    guess = guess_colourspace(frame)
    assert guess.colourspace == "sRGB Encoded Rec.709 (sRGB)"
    assert guess.reason


@pytest.mark.parametrize(
    ("transfer", "expected", "certain", "said"),
    [
        ("Logarithmic", "ARRI LogC3 (EI800)", False, "'Logarithmic'"),
        ("ITU-R 709-4", "Camera Rec.709", True, "'ITU-R 709-4'"),
        (None, "ARRI LogC3 (EI800)", False, "tells nothing usable"),  # OIIO: "User defined"
    ],
)
def test_guess_dpx_reads_the_transfer_field(
    tmp_path: Path, transfer: str | None, expected: str, certain: bool, said: str
) -> None:
    attributes = {"dpx:Transfer": transfer} if transfer else None
    path = write_image(tmp_path / "p.dpx", code_ramp(2, 3, 10), 10, attributes)
    frame = read_plate_frame(str(path))
    guess = guess_colourspace(frame)
    assert guess.colourspace == expected
    assert guess.certain is certain
    assert said in guess.reason and "10-bit DPX" in guess.reason


def test_chunked_conversion_matches_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    pixels = (np.random.default_rng(3).random((7, 9, 3)) * 2).astype(np.float32)
    whole = ColourConversion("logc3").to_model_encoding(pixels)
    monkeypatch.setattr(colour, "CHUNK_PIXELS", 10)  # 63 pixels: six full chunks and a tail
    chunked = ColourConversion("logc3").to_model_encoding(pixels)
    np.testing.assert_array_equal(chunked, whole)
    assert not np.array_equal(whole, np.clip(pixels, 0, 1))  # the conversion did something
