"""Cryptomatte IDs, metadata and rank channels against the specification's test vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from storage import cryptomatte

# Sapiens2 body-part classes (sapiens2-reference.md §2.5), a test-local copy.
BODY_PARTS = [
    "Background", "Apparel", "Eyeglass", "Face_Neck", "Hair", "Left_Foot", "Left_Hand",
    "Left_Lower_Arm", "Left_Lower_Leg", "Left_Shoe", "Left_Sock", "Left_Upper_Arm",
    "Left_Upper_Leg", "Lower_Clothing", "Right_Foot", "Right_Hand", "Right_Lower_Arm",
    "Right_Lower_Leg", "Right_Shoe", "Right_Sock", "Right_Upper_Arm", "Right_Upper_Leg",
    "Torso", "Upper_Clothing", "Lower_Lip", "Upper_Lip", "Lower_Teeth", "Upper_Teeth", "Tongue",
]  # fmt: skip


# Float IDs from Psyop/Cryptomatte nuke/cryptomatte_utilities_tests.py (CryptoHashing) and the
# v1.2.0 specification's table (vfx-conventions.md §2.1).
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("hello", 6.0705627102400005616e-17),
        ("cube", -4.08461912519e15),
        ("sphere", 2.79018604383e15),
        ("plane", 3.66557617593e-11),
        ("равнина", -1.3192631212399999468e-25),
        ("mädchen", 6.2361298211599995797e25),
        ("torus", -1.54943624832e30),
        ("равнина", -1.31926312124e-25),
    ],
)
def test_float_ids_match_specification(name: str, expected: float) -> None:
    assert cryptomatte.float_id(name) == np.float32(expected)


def test_uint32_hashes_match_specification() -> None:
    assert cryptomatte.name_hash("torus") == 4053562365
    assert cryptomatte.name_hash("равнина") == 2518896926
    # MurmurHash3_x86_32 reference values for the empty input.
    assert cryptomatte.murmurhash3_32(b"") == 0
    assert cryptomatte.murmurhash3_32(b"", seed=1) == 0x514E28B7


def test_manifest_hex_matches_published_files() -> None:
    # The specification's manifest example and the cornellBox sample image's manifest.
    published = {
        "bunny": "13851a76",
        "default": "42c9679f",
        "bunny_porcelain_mat": "b24b26d4",
        "rect_[_top": "c1fa3f1f",
        "has_*_asterisk": "5def0d04",
    }
    assert cryptomatte.manifest(list(published)) == published


def test_layer_keys_match_published_files() -> None:
    # Psyop's sample cornellBox_CryptoWildcard.0001.exr has cryptomatte/2ae4678/name =
    # uCryptoWildcard (the keys in the specification's prose example are illustrative only).
    assert cryptomatte.layer_key("uCryptoWildcard") == "2ae4678"


def test_exponent_fix_never_gives_nan_inf_or_denormal() -> None:
    for index in range(2000):
        bits = cryptomatte.id_bits(f"name{index}")
        exponent = (bits >> 23) & 0xFF
        assert 0 < exponent < 0xFF
        assert np.isfinite(cryptomatte.bits_to_float(bits))
    # A hash whose exponent bits are all 0 or all 1 has bit 23 toggled, as the spec says.
    names = (f"n{i}" for i in range(10000))
    name = next(n for n in names if (cryptomatte.name_hash(n) >> 23) & 0xFF in (0, 0xFF))
    assert cryptomatte.id_bits(name) == cryptomatte.name_hash(name) ^ (1 << 23)


def test_metadata_and_manifest_round_trip() -> None:
    meta = cryptomatte.metadata("CryptoBodyPart", BODY_PARTS)
    key = cryptomatte.layer_key("CryptoBodyPart")
    assert len(key) == 7
    assert meta[f"cryptomatte/{key}/name"] == "CryptoBodyPart"
    assert meta[f"cryptomatte/{key}/hash"] == "MurmurHash3_32"
    assert meta[f"cryptomatte/{key}/conversion"] == "uint32_to_float32"
    manifest = json.loads(meta[f"cryptomatte/{key}/manifest"])
    assert list(manifest) == BODY_PARTS
    assert all(len(value) == 8 and int(value, 16) >= 0 for value in manifest.values())
    decoded = cryptomatte.decode_manifest(meta[f"cryptomatte/{key}/manifest"])
    for name in BODY_PARTS:
        assert decoded[cryptomatte.float_to_bits(cryptomatte.float_id(name))] == name
        assert cryptomatte.hex_to_id(manifest[name]) == cryptomatte.float_id(name)


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        cryptomatte.manifest(["Hair", "Hair"])


def test_one_hot_probabilities_give_full_coverage_of_that_class() -> None:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 29, size=(9, 11))
    probabilities = np.eye(29, dtype=np.float32)[labels]
    channels = cryptomatte.rank_channels(probabilities, BODY_PARTS, "CryptoBodyPart")
    assert list(channels) == cryptomatte.channel_names("CryptoBodyPart", 6)
    assert all(c.dtype == np.float32 and c.shape == (9, 11) for c in channels.values())
    ids = np.array([cryptomatte.float_id(n) for n in BODY_PARTS], dtype=np.float32)
    np.testing.assert_array_equal(channels["CryptoBodyPart00.R"], ids[labels])
    np.testing.assert_array_equal(channels["CryptoBodyPart00.G"], 1.0)
    coverage = sum(channels[f"CryptoBodyPart0{k}.{c}"] for k in range(3) for c in "GA")
    np.testing.assert_allclose(coverage, 1.0, atol=1e-6)
    # Every lower rank is "no object": ID 0, coverage 0.
    for name in ("CryptoBodyPart00.B", "CryptoBodyPart00.A", "CryptoBodyPart02.R"):
        np.testing.assert_array_equal(channels[name], 0.0)


def test_soft_probabilities_are_ranked_descending_and_renormalised() -> None:
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(5, 7, 29)) * 3
    probabilities = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
    channels = cryptomatte.rank_channels(
        probabilities, BODY_PARTS, "CryptoBodyPart", min_coverage=0.0
    )
    order = np.argsort(-probabilities, axis=-1)[..., :6]
    id_of = {
        cryptomatte.float_to_bits(cryptomatte.float_id(n)): i for i, n in enumerate(BODY_PARTS)
    }
    coverages = []
    for rank in range(6):
        layer, (id_c, cov_c) = rank // 2, ("R", "G") if rank % 2 == 0 else ("B", "A")
        ids = channels[f"CryptoBodyPart{layer:02d}.{id_c}"]
        got = np.vectorize(lambda v: id_of[cryptomatte.float_to_bits(v)])(ids)
        np.testing.assert_array_equal(got, order[..., rank])
        coverages.append(channels[f"CryptoBodyPart{layer:02d}.{cov_c}"])
    stacked = np.stack(coverages, axis=-1)
    assert (np.diff(stacked, axis=-1) <= 1e-7).all()
    np.testing.assert_allclose(stacked.sum(-1), 1.0, atol=1e-5)
    top6 = np.take_along_axis(probabilities, order, axis=-1)
    np.testing.assert_allclose(stacked, top6 / top6.sum(-1, keepdims=True), rtol=1e-5)


def test_ties_rank_deterministically() -> None:
    probabilities = np.full((1, 1, 29), 1 / 29, dtype=np.float32)
    channels = cryptomatte.rank_channels(probabilities, BODY_PARTS, "CryptoBodyPart")
    assert channels["CryptoBodyPart00.R"][0, 0] == cryptomatte.float_id("Tongue")
    assert channels["CryptoBodyPart00.B"][0, 0] == cryptomatte.float_id("Upper_Teeth")
    np.testing.assert_allclose(channels["CryptoBodyPart00.G"], 1 / 6, rtol=1e-5)


def test_small_probabilities_become_id_zero() -> None:
    probabilities = np.zeros((1, 1, 29), dtype=np.float32)
    probabilities[0, 0, 3] = 0.99995
    probabilities[0, 0, 4] = 0.00005
    channels = cryptomatte.rank_channels(probabilities, BODY_PARTS, "CryptoBodyPart")
    assert channels["CryptoBodyPart00.R"][0, 0] == cryptomatte.float_id("Face_Neck")
    assert channels["CryptoBodyPart00.B"][0, 0] == 0.0
    assert channels["CryptoBodyPart00.A"][0, 0] == 0.0


def test_bad_probabilities_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\(H, W, 29\)"):
        cryptomatte.rank_channels(np.zeros((2, 2, 3)), BODY_PARTS, "CryptoBodyPart")
    for value in (np.nan, -0.5):
        bad = np.full((2, 2, 29), value, dtype=np.float32)
        with pytest.raises(ValueError, match="finite and non-negative"):
            cryptomatte.rank_channels(bad, BODY_PARTS, "CryptoBodyPart")


def test_ranking_across_several_row_blocks_matches_a_plain_argsort() -> None:
    # Wide enough rows and enough of them that the ranking runs over several blocks of rows,
    # the last one partial; an infinity in one late row must still be refused.
    rng = np.random.default_rng(3)
    height, width = 203, 1500
    logits = rng.normal(size=(height, width, 29)).astype(np.float32) * 2
    probabilities = np.exp(logits)
    probabilities /= probabilities.sum(-1, keepdims=True)
    channels = cryptomatte.rank_channels(probabilities, BODY_PARTS, "CryptoBodyPart")
    ids = np.array([cryptomatte.float_id(n) for n in BODY_PARTS], dtype=np.float32)
    order = np.argsort(-probabilities, axis=-1, kind="stable")[..., :2]
    np.testing.assert_array_equal(channels["CryptoBodyPart00.R"], ids[order[..., 0]])
    np.testing.assert_array_equal(channels["CryptoBodyPart00.B"], ids[order[..., 1]])
    probabilities[height - 1, width - 1, 5] = np.inf
    with pytest.raises(ValueError, match="finite and non-negative"):
        cryptomatte.rank_channels(probabilities, BODY_PARTS, "CryptoBodyPart")


def test_negative_zero_probabilities_rank_as_zero() -> None:
    probabilities = np.zeros((2, 3, 29), dtype=np.float32)
    probabilities[..., 7] = 1.0
    expected = cryptomatte.rank_channels(probabilities, BODY_PARTS, "CryptoBodyPart")
    probabilities[..., 20:] = -0.0
    channels = cryptomatte.rank_channels(probabilities, BODY_PARTS, "CryptoBodyPart")
    for name, values in expected.items():
        np.testing.assert_array_equal(channels[name], values)
