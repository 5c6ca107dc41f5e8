"""Cryptomatte encoding (Psyop specification v1.2.0) of per-pixel class probabilities.

IDs: MurmurHash3_x86_32 (seed 0) of the UTF-8 name; if the exponent bits (23-30) are all 0 or
all 1, bit 23 is toggled (the spec's older wording clamps the exponent to [1, 254], which is the
same thing); the 32 bits are then read as a little-endian float32. The manifest maps each name
to the 8-hex-digit bit pattern of its float ID. The metadata key of a layer is the first 7 hex
digits of the float ID of the layer name, as the Nuke tools derive it (`layer_hash`).

Ranks: for each pixel the classes are sorted by probability (ties: higher class index
first), the top `ranks` are kept,
probabilities below `min_coverage` become ID 0 / coverage 0 (the spec's "no object"), and the
kept coverages are renormalised to sum to 1 (summed rank by rank, in rank order). Rank 2k
goes to `<layer>NN.R/G` (ID, coverage) and rank 2k+1 to `<layer>NN.B/A`, NN = k, as float32
(half destroys IDs). Probabilities of -0.0 rank as 0.

Cost: ~0.7 core-s for the 6 ranks of 29 classes over a 4096x2160 frame (2-core VM), of which
the per-pixel sort of 29 keys is half; the ranking runs over blocks of rows that stay in the
CPU cache and writes into the output planes directly.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence

import numpy as np

HASH_NAME = "MurmurHash3_32"
CONVERSION = "uint32_to_float32"
DEFAULT_RANKS = 6
DEFAULT_MIN_COVERAGE = 1e-4
_RGBA = ("R", "G", "B", "A")
_BLOCK_BYTES = 1 << 20  # rows of probabilities ranked at once: they stay in the CPU cache


def murmurhash3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 as an unsigned 32-bit int.

    Written here rather than adding the `mmh3` package: it hashes a few dozen class names
    once per file, and the spec's test vectors pin it down (tests/test_cryptomatte.py).
    """
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    length = len(data)
    h = seed & mask
    whole = length - length % 4
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[whole:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h


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


def rank_channels(
    probabilities: np.ndarray,
    names: Sequence[str],
    layer_name: str,
    ranks: int = DEFAULT_RANKS,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
) -> dict[str, np.ndarray]:
    """Ranked ID/coverage channels (float32, H x W each) from (H, W, C) class probabilities.

    `names[c]` is the name of class `c`. `ranks` is rounded up to a whole RGBA layer; ranks
    beyond the number of classes stay 0.
    """
    if probabilities.ndim != 3 or probabilities.shape[2] != len(names):
        raise ValueError(
            f"probabilities must be (H, W, {len(names)}) for {len(names)} class names, "
            f"got {probabilities.shape}"
        )
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    ids = np.array([float_id(name) for name in manifest(names)], dtype=np.float32)
    height, width, classes = probabilities.shape
    layers = (ranks + 1) // 2
    kept = min(ranks, classes)
    # Rank by sorting packed uint32 keys: the bit pattern of a non-negative float32 orders like
    # the float, so its lowest mantissa bits are replaced by the class index and one sort of
    # the `classes` keys per pixel (numpy's SIMD sort; faster than a partition plus a sort of
    # the top `kept`, and several times faster than argpartition + take_along_axis) gives
    # classes and probabilities together. The coverage loses those low bits (relative error
    # < 2**-(23 - index_bits), 4e-6 for 29 classes) before renormalising.
    index_bits = max(1, (classes - 1).bit_length())
    if index_bits > 16:
        raise ValueError(f"too many classes ({classes}) for one Cryptomatte layer")
    index_mask = np.uint32((1 << index_bits) - 1)
    value_mask = np.uint32(0x7FFFFFFF ^ int(index_mask))  # the sign bit too: -0.0 ranks as 0
    # rank, (id, coverage), pixel: each block of rows is one run of pixels in every plane
    planes = np.zeros((layers * 2, 2, height * width), dtype=np.float32)
    block_rows = max(1, _BLOCK_BYTES // max(1, width * classes * 4))
    keys_buffer = np.empty((block_rows * width, classes), dtype=np.uint32)
    # The class index of every key, as a full block: OR-ing a broadcast row is slower.
    class_index = np.tile(np.arange(classes, dtype=np.uint32), (block_rows * width, 1))
    top_buffer = np.empty((kept, block_rows * width), dtype=np.uint32)
    for top in range(0, height, block_rows):
        rows = slice(top, min(top + block_rows, height))
        block = np.ascontiguousarray(probabilities[rows], dtype=np.float32)
        bits = block.view(np.uint32).reshape(-1, classes)
        # Finite non-negative float32 values are exactly the bit patterns below +inf's, and
        # -0.0 (0x80000000); one max finds out whether the full check is needed.
        if bits.max() >= 0x7F800000 and (not np.isfinite(block).all() or (block < 0).any()):
            raise ValueError("class probabilities must be finite and non-negative")
        count = bits.shape[0]
        keys = keys_buffer[:count]
        np.bitwise_and(bits, value_mask, out=keys)
        keys |= class_index[:count]
        keys.sort(axis=-1)
        best = top_buffer[:, :count]
        np.copyto(best, keys[:, ::-1][:, :kept].T)  # (kept, pixels), rank 0 first
        pixels = slice(top * width, top * width + count)
        pixel_ids, coverage = planes[:kept, 0, pixels], planes[:kept, 1, pixels]
        np.bitwise_and(best, value_mask, out=coverage.view(np.uint32))
        np.copyto(coverage, np.float32(0.0), where=coverage < min_coverage)
        total = coverage.sum(axis=0)
        np.divide(coverage, total, out=coverage, where=total > 0)
        best &= index_mask
        np.take(ids, best, out=pixel_ids, mode="clip")  # indices < classes: no check
        np.copyto(pixel_ids, np.float32(0.0), where=coverage == 0)
    channels: dict[str, np.ndarray] = {}
    for layer in range(layers):
        prefix = f"{layer_name}{layer:02d}"
        channels[f"{prefix}.R"] = planes[2 * layer, 0].reshape(height, width)
        channels[f"{prefix}.G"] = planes[2 * layer, 1].reshape(height, width)
        channels[f"{prefix}.B"] = planes[2 * layer + 1, 0].reshape(height, width)
        channels[f"{prefix}.A"] = planes[2 * layer + 1, 1].reshape(height, width)
    return channels
