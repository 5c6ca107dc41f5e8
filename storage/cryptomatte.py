"""Cryptomatte encoding (Psyop specification v1.2.0) of per-pixel class probabilities.

IDs: MurmurHash3_x86_32 (seed 0) of the UTF-8 name; if the exponent bits (23-30) are all 0 or
all 1, bit 23 is toggled (the spec's older wording clamps the exponent to [1, 254], which is the
same thing); the 32 bits are then read as a little-endian float32. The manifest maps each name
to the 8-hex-digit bit pattern of its float ID. The metadata key of a layer is the first 7 hex
digits of the float ID of the layer name, as the Nuke tools derive it (`layer_hash`).

Ranks: the top `DEFAULT_RANKS` classes of each pixel by probability, those below
`DEFAULT_MIN_COVERAGE` as ID 0 / coverage 0 (the spec's "no object"), renormalised; rank 2k
goes to `<layer>NN.R/G` (ID, coverage) and rank 2k+1 to `<layer>NN.B/A`, NN = k, as float32
(half destroys IDs). The ranking itself is per-pixel work and runs on the model's device
(`tasks.seg_outputs.seg_outputs`); this module holds what the file format needs.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence

import mmh3
import numpy as np

HASH_NAME = "MurmurHash3_32"
CONVERSION = "uint32_to_float32"
DEFAULT_RANKS = 6
DEFAULT_MIN_COVERAGE = 1e-4
_RGBA = ("R", "G", "B", "A")


def murmurhash3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 as an unsigned 32-bit int (the ``mmh3`` package's)."""
    return int(mmh3.hash(data, seed, signed=False))


def name_hash(name: str) -> int:
    """The uint32 MurmurHash3 of the UTF-8 bytes of `name`."""
    return murmurhash3_32(name.encode("utf-8"))


def id_bits(name: str) -> int:
    """The uint32 bit pattern of the float ID of `name` (hash with the exponent fix)."""
    bits = name_hash(name)
    exponent = (bits >> 23) & 0xFF
    if exponent in (0, 0xFF):
        bits ^= 1 << 23
    return bits


def float_id(name: str) -> np.float32:
    """The float32 Cryptomatte ID of `name`."""
    return bits_to_float(id_bits(name))


def bits_to_float(bits: int) -> np.float32:
    return np.frombuffer(struct.pack("<I", bits & 0xFFFFFFFF), dtype="<f4")[0]


def float_to_bits(value: float | np.floating) -> int:
    return int(np.array([value], dtype="<f4").view("<u4")[0])


def id_to_hex(value: float | np.floating) -> str:
    """8 hex digits of a float ID's bit pattern, as written in manifests."""
    return f"{float_to_bits(value):08x}"


def hex_to_id(text: str) -> np.float32:
    return bits_to_float(int(text, 16))


def layer_key(layer_name: str) -> str:
    """The 7-character metadata key of a Cryptomatte layer (first 7 hex digits of its ID)."""
    return f"{id_bits(layer_name):08x}"[:7]


def manifest(names: Sequence[str]) -> dict[str, str]:
    """Name -> 8-hex-digit ID; refuses duplicate names and hash collisions."""
    result: dict[str, str] = {}
    seen: dict[int, str] = {}
    for name in names:
        if name in result:
            raise ValueError(f"Cryptomatte names must be unique; {name!r} appears twice")
        bits = id_bits(name)
        if bits in seen:
            raise ValueError(f"Cryptomatte ID collision between {seen[bits]!r} and {name!r}")
        seen[bits] = name
        result[name] = f"{bits:08x}"
    return result


def metadata(layer_name: str, names: Sequence[str]) -> dict[str, str]:
    """The `cryptomatte/<key>/...` header attributes for one layer, manifest embedded."""
    key = layer_key(layer_name)
    return {
        f"cryptomatte/{key}/name": layer_name,
        f"cryptomatte/{key}/hash": HASH_NAME,
        f"cryptomatte/{key}/conversion": CONVERSION,
        f"cryptomatte/{key}/manifest": json.dumps(manifest(names), separators=(",", ":")),
    }


def decode_manifest(text: str) -> dict[int, str]:
    """Manifest JSON -> {ID bit pattern: name}, for decoding pixel IDs back to names."""
    parsed = json.loads(text)
    if not isinstance(parsed, Mapping):
        raise ValueError("a Cryptomatte manifest must be a JSON object of name -> hex ID")
    return {int(str(hex_id), 16): str(name) for name, hex_id in parsed.items()}


def channel_names(layer_name: str, ranks: int = DEFAULT_RANKS) -> list[str]:
    """`<layer>00.R` ... for `ranks` ranks (two ranks per RGBA layer)."""
    layers = (ranks + 1) // 2
    return [f"{layer_name}{index:02d}.{c}" for index in range(layers) for c in _RGBA]


def class_ids(names: Sequence[str]) -> np.ndarray:
    """The float32 IDs of ``names``, in order (checked like ``manifest``): ``ids[c]`` is the
    ID of class ``c`` in the rank planes (``tasks.seg_outputs``)."""
    return np.array([float_id(name) for name in manifest(names)], dtype=np.float32)
