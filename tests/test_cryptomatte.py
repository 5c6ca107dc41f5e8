"""Cryptomatte IDs and metadata against the specification's test vectors (the rank planes:
tests/test_seg_outputs.py)."""

from __future__ import annotations

import json
import random
import struct

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


def _murmurhash3_32_reference(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 written out (the module's own before it used ``mmh3``)."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & mask
    whole = len(data) - len(data) % 4
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = (k * c1) & mask
        k = (((k << 15) | (k >> 17)) & mask) * c2 & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    if tail := data[whole:]:
        k = (int.from_bytes(tail, "little") * c1) & mask
        h ^= (((k << 15) | (k >> 17)) & mask) * c2 & mask
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    return h ^ (h >> 16)


def test_ids_are_the_written_out_hash_on_many_names() -> None:
    """``mmh3`` gives the IDs the hand-written hash gave, bit for bit: every tail length,
    seeds, and names outside ASCII (accents, Cyrillic, kana, emoji, the last code point)."""
    rng = random.Random(43)
    alphabet = [chr(c) for c in [*range(32, 127), *range(0xA0, 0x500), *range(0x3040, 0x3100)]]
    alphabet += ["\U0001f600", "\U0010ffff", "\ufffd"]
    names = ["", "a", "ab", "abc", "abcd", "person", "naïve café", "日本語", "x" * 1000]
    names += ["".join(rng.choices(alphabet, k=rng.randint(0, 40))) for _ in range(5000)]
    for name in names:
        data = name.encode("utf-8")
        assert cryptomatte.name_hash(name) == _murmurhash3_32_reference(data), name
        for seed in (1, 0xFFFFFFFF):
            assert cryptomatte.murmurhash3_32(data, seed) == _murmurhash3_32_reference(data, seed)


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
