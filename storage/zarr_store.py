"""The per-shot Zarr v3 store that ML and analysis tools read.

Layout (one group per shot, created once by the flow before any worker writes); the pass
arrays are described to it as ``storage.layers.ZarrArray`` values, which the pass table
(``schemas.passes``) declares:

| array      | shape          | dtype | dimension names                   | fill  |
|------------|----------------|-------|-----------------------------------|-------|
| `normal`   | (T, H, W, 3)   | f2    | frame, y, x, c                    | NaN   |
| `pointmap` | (T, H, W, 3)   | f4    | frame, y, x, c                    | NaN   |
| `albedo`   | (T, H, W, 3)   | f2    | frame, y, x, c                    | NaN   |
| `matte`    | (T, H, W)      | f2    | frame, y, x                       | NaN   |
| `seg`      | (T, H, W)      | u1    | frame, y, x                       | 255   |
| `depth`    | (T, H, W)      | f4    | frame, y, x                       | NaN   |
| `pose`     | (T, P, K, 3)   | f4    | frame, person, keypoint, xys      | NaN   |
| `frame`    | (T,)           | i8    | frame (the plate frame numbers)   | -1    |
| `frame_key`| (T, 32)        | u1    | frame, digest                     | 0     |

The fill values mark what was never written (a failed frame reads as NaN / 255, never as a
plausible zero); `pose` holds (x, y, score) per keypoint (K = 308, or 17 or 133 for a
Sapiens v1 COCO pose model) and NaN for absent people. `depth` is Sapiens v1's *relative*
depth (over the person 0 nearest to 1 farthest, -1 elsewhere), not metric: metric depth is
`pointmap[..., 2]`. Each array says what it holds in its `content` attribute; `seg` names its
classes in `class_names` (index -> name: Sapiens2's 29, or Sapiens v1's 28 without Eyeglass,
whose later indices are one lower).

`frame_key` is each frame's commit mark: the sha256 digest of the cache key its passes were
made with, written after every pass of the frame and zeroed before any pass is rewritten.
A frame counts as stored only when its mark equals the key a resubmit expects and every pass
array holds the shard it lies in (`committed_frames`), so a store that was recreated, lost
objects or was half-rewritten by a writer that died says which frames it really holds.
Empty chunks are written too (a frame with no people has an all-NaN pose block, which Zarr
would otherwise leave unwritten), so every committed frame's shards exist.

Chunks hold one frame; shards hold `frames_per_shard` frames (Blosc lz4 + byte shuffle,
`ZARR_COMPRESSOR`). Why lz4 rather than zstd: it encodes several times faster for a somewhat
larger store (docs/design/zarr-chunking.md). The store is written once per frame at farm rates
and read by ML tools, so CPU per frame wins; any Blosc build decodes either. Stores created
before keep their codec (it is in each array's metadata).
Zarr rewrites a whole shard for any write into it, without locking, so two writers touching
one shard lose data silently (stack-notes §4.3): give each shard to exactly one writer
(`frames_by_shard`), and create the store once, before fan-out (`create_shot_store`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import zarr
import zarr.codecs
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore

from storage.errors import StorageError
from storage.layers import ZarrArray
from storage.location import Location, Where, as_location
from storage.uri import check_driver

log = logging.getLogger(__name__)

STORE_FORMAT = "sapiens2-shot/2"  # /2 added frame_key; a /1 store is replaced (redone)
KEYPOINTS = 308
SEG_CLASS_COUNT = 29  # Sapiens2's body-part classes; a Sapiens v1 seg model has 28
SEG_FILL = 255
FRAME_ARRAY = "frame"
FRAME_KEY_ARRAY = "frame_key"
KEY_BYTES = 32  # a sha256 digest
WRITE_CONFIG = {"write_empty_chunks": True}
# Byte shuffle puts the high bytes of float16/float32 together, where lz4 finds runs.
ZARR_COMPRESSOR = zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")


# Zarr re-encodes a whole shard for every region written into it, so writing frame k of a
# shard costs k frames' worth of encoding (docs/design/zarr-chunking.md). Shards are capped so
# a shard of the largest array stays near this many raw bytes (at 4K: one frame; 1080p: five;
# small plates: as asked).
SHARD_BYTES = 128 * 2**20


def shard_frames(
    height: int, width: int, arrays: Sequence[ZarrArray], max_people: int, wanted: int
) -> int:
    """Frames per shard: ``wanted``, fewer when the largest array's frame is big."""
    sizes = {"H": height, "W": width, "P": max_people, "K": KEYPOINTS}
    largest = 1
    for spec in arrays:
        count = int(np.prod([sizes[d] if isinstance(d, str) else d for d in spec.trailing]))
        largest = max(largest, count * np.dtype(spec.dtype).itemsize)
    return max(1, min(wanted, SHARD_BYTES // largest))


def stored_frames_per_shard(where: Where) -> int | None:
    """The shard size of an existing shot store (None: no store), so a re-run keeps it."""
    with _opened(as_location(where), read_only=True) as store:
        existing = _existing_layout(store)
    if existing is None:
        return None
    value = existing[0].get("frames_per_shard")
    return int(value) if isinstance(value, int) and value >= 1 else None


def shard_of(frame_index: int, frames_per_shard: int) -> int:
    """The shard that holds the frame at `frame_index` (position in the store, not number)."""
    if frames_per_shard < 1:
        raise ValueError(f"frames_per_shard must be at least 1, got {frames_per_shard}")
    if frame_index < 0:
        raise ValueError(f"frame_index must be >= 0, got {frame_index}")
    return frame_index // frames_per_shard


def frames_by_shard(frames: Sequence[int], frames_per_shard: int) -> dict[int, list[int]]:
    """Frame numbers grouped by shard, in store order: give each group to one writer."""
    groups: dict[int, list[int]] = {}
    for index, frame in enumerate(frames):
        groups.setdefault(shard_of(index, frames_per_shard), []).append(int(frame))
    return groups


def create_shot_store(
    where: Where,
    frames: Sequence[int],
    height: int,
    width: int,
    arrays: Sequence[ZarrArray],
    max_people: int,
    provenance: Mapping[str, Any],
    frames_per_shard: int,
    overwrite: bool = False,
    keypoints: int = KEYPOINTS,
    seg_classes: Sequence[str] | None = None,
) -> None:
    """Create the shot's group and arrays once, before any frame is written.

    If a store with the same layout already exists it is kept as is (a re-run fills in the
    frames it is missing); a store with a different layout is refused unless `overwrite`.
    `arrays` are the pass arrays, in order; `keypoints` is the pose model's keypoint count;
    `seg_classes` the seg model's class names in index order, kept in the ``class_names``
    attribute of the arrays that hold class indices.
    """
    where = as_location(where)
    uri = where.uri
    frame_numbers = [int(frame) for frame in frames]
    _check_layout_args(uri, frame_numbers, height, width, arrays, max_people, frames_per_shard)
    layout: dict[str, Any] = {
        "format": STORE_FORMAT,
        "frames_per_shard": frames_per_shard,
        "height": height,
        "width": width,
        "max_people": max_people,
        "passes": [spec.name for spec in arrays],
    }
    if keypoints != KEYPOINTS:  # stores made before it was recorded hold 308
        layout["keypoints"] = keypoints
    # Another class list means other indices: such a store is another layout (and replaced).
    # Stores made before it was recorded hold Sapiens2's 29.
    labelled = any(spec.class_names for spec in arrays)
    if labelled and seg_classes is not None and len(seg_classes) != SEG_CLASS_COUNT:
        layout["seg_classes"] = len(seg_classes)
    names = list(seg_classes) if seg_classes is not None else None
    with _opened(where, read_only=False) as store:
        _create_in(uri, store, layout, arrays, frame_numbers, provenance, overwrite, names)


def _create_in(
    uri: str,
    store: Any,
    layout: dict[str, Any],
    arrays: Sequence[ZarrArray],
    frame_numbers: list[int],
    provenance: Mapping[str, Any],
    overwrite: bool,
    seg_classes: list[str] | None = None,
) -> None:
    """The shot's group and arrays in ``store``; nothing when the same layout with the same
    frames is there, a StorageError for another layout unless ``overwrite``."""
    frames_per_shard = int(layout["frames_per_shard"])
    if not overwrite:
        existing = _existing_layout(store)
        if existing is not None:
            same = _same_layout({key: existing[0].get(key) for key in layout}, layout)
            if same and existing[1] == frame_numbers:
                return
            raise StorageError(
                f"{uri}: a shot store with a different layout already exists; "
                "pass overwrite=True to replace it"
            )
    attributes = dict(layout)
    attributes["provenance"] = dict(provenance)
    group = zarr.create_group(store, overwrite=True, attributes=attributes, zarr_format=3)
    count = len(frame_numbers)
    _create_frame_arrays(group, frame_numbers, frames_per_shard)
    sizes = _sizes(layout)
    for spec in arrays:
        trailing = tuple(sizes[d] if isinstance(d, str) else d for d in spec.trailing)
        array_attributes: dict[str, Any] = {"content": spec.content}
        if spec.class_names and seg_classes is not None:
            array_attributes["class_names"] = seg_classes
        group.create_array(
            spec.name,
            shape=(count, *trailing),
            dtype=spec.dtype,
            chunks=(1, *trailing),
            shards=(min(frames_per_shard, count), *trailing),
            compressors=[ZARR_COMPRESSOR],
            fill_value=spec.fill,
            dimension_names=spec.dims,
            attributes=array_attributes,
        )


def _create_frame_arrays(
    group: zarr.Group, frame_numbers: list[int], frames_per_shard: int
) -> None:
    """The store's frame numbers (one per index) and its commit keys (zero: no frame is
    claimed yet)."""
    count = len(frame_numbers)
    frame_array = group.create_array(
        FRAME_ARRAY,
        shape=(count,),
        dtype="int64",
        chunks=(count,),
        fill_value=-1,
        dimension_names=("frame",),
        compressors=None,
    )
    frame_array[:] = np.asarray(frame_numbers, dtype=np.int64)
    group.create_array(
        FRAME_KEY_ARRAY,
        shape=(count, KEY_BYTES),
        dtype="uint8",
        chunks=(1, KEY_BYTES),
        shards=(min(frames_per_shard, count), KEY_BYTES),
        compressors=None,
        fill_value=0,
        dimension_names=("frame", "digest"),
    )


def _same_layout(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a store's layout is the one wanted; the order of its passes does not count
    (stores made before the pass table listed relative depth after seg)."""

    def passes_as_set(layout: Mapping[str, Any]) -> dict[str, Any]:
        return {**layout, "passes": sorted(layout.get("passes") or ())}

    return passes_as_set(existing) == passes_as_set(wanted)


def _sizes(layout: Mapping[str, Any]) -> dict[str, int]:
    """What the letters of `ZarrArray.trailing` stand for in a store's layout."""
    return {
        "H": int(layout["height"]),
        "W": int(layout["width"]),
        "P": int(layout["max_people"]),
        "K": int(layout.get("keypoints", KEYPOINTS)),
    }


def open_shot_store(where: Where, mode: str = "r") -> zarr.Group:
    """Open the shot group (`mode` "r" or "r+"); plain `zarr.open_group` works too."""
    where = as_location(where)
    try:
        return zarr.open_group(_store(where, read_only=mode == "r"), mode=mode)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError) as exc:
        raise StorageError(f"{where.uri}: no shot store there") from exc


def key_digest(cache_key: str) -> np.ndarray:
    """The 32 bytes of a hex sha256 cache key, as `frame_key` stores them."""
    digest = bytes.fromhex(cache_key)
    if len(digest) != KEY_BYTES:
        raise ValueError(f"a cache key is a hex sha256 (64 digits), got {cache_key!r}")
    return np.frombuffer(digest, dtype=np.uint8)


def committed_frames(where: Where) -> dict[int, str]:
    """Frame number -> cache key (hex) of every frame the store really holds: its commit mark
    is set and each pass array has the shard it lies in. Empty for a missing store or one of
    another format. Reads two small arrays and lists each pass array's shards once."""
    where = as_location(where)
    with _opened(where, read_only=True) as store:
        try:
            group = zarr.open_group(store, mode="r")
        except (FileNotFoundError, zarr.errors.GroupNotFoundError):
            return {}
        return _committed(group, where)


def _committed(group: zarr.Group, where: Location) -> dict[int, str]:
    attrs = dict(group.attrs)
    if attrs.get("format") != STORE_FORMAT or FRAME_KEY_ARRAY not in group:
        return {}
    frames = [int(frame) for frame in group[FRAME_ARRAY][:]]
    keys = np.asarray(group[FRAME_KEY_ARRAY][:])
    per_shard = int(attrs["frames_per_shard"])
    present = [_shards_present(group[name], where) for name in attrs["passes"]]
    committed = {}
    for index, frame in enumerate(frames):
        if not keys[index].any():
            continue
        shard = shard_of(index, per_shard)
        if all(shard in shards for shards in present):
            committed[frame] = keys[index].tobytes().hex()
    return committed


def _shards_present(array: zarr.Array, where: Location) -> set[int]:
    """Frame-axis indices of the shards of ``array`` that exist in storage (one listing)."""
    fs, root = where.join(array.basename).fs_and_path()
    first_key = array.metadata.encode_chunk_key((0,) * array.ndim)  # e.g. c/0/0/0/0
    prefix, _, _ = first_key.partition("0")
    try:
        fs.invalidate_cache(root)
        names = fs.find(f"{root}/{prefix}".rstrip("/"))
    except FileNotFoundError:
        return set()
    shards = set()
    start = len(f"{root}/{prefix}".rstrip("/")) + 1
    for name in names:
        head = str(name)[start:].split("/", 1)[0]
        if head.isdigit():
            shards.add(int(head))
    return shards


def read_stored_frame(
    where: Where, frame_index: int, passes: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """One frame of the named passes (default: all) as numpy arrays."""
    group = open_shot_store(where, "r")
    try:
        names = list(passes) if passes is not None else list(group.attrs["passes"])
        return {name: np.asarray(group[name][frame_index]) for name in names}
    finally:
        close_store(group.store)


def _store(where: Location, read_only: bool) -> Any:
    """A store over ``where``. Remote: an asynchronous filesystem of its own (not fsspec's
    shared instance), closed by `close_store` when the caller is done with it."""
    uri = where.uri
    if where.is_remote:
        check_driver(uri)
        options = {**where.fsspec_options(), "skip_instance_cache": True}
        return FsspecStore.from_url(uri, storage_options=options, read_only=read_only)
    path = uri.removeprefix("file://")
    return LocalStore(path, read_only=read_only)


def close_store(store: Any) -> None:
    """Close the network session of a remote store from `_store` (s3fs opens one aiohttp
    session per asynchronous filesystem and, unlike for its synchronous ones, registers
    nothing to close it: left to the garbage collector it is reported as "Unclosed client
    session"). Nothing to do for a local store."""
    client = getattr(getattr(store, "fs", None), "_s3", None)  # s3fs's aiobotocore client
    if client is not None:
        sync(client.close())
        store.fs._s3 = None


@contextmanager
def _opened(where: Location, read_only: bool) -> Iterator[Any]:
    store = _store(where, read_only)
    try:
        yield store
    finally:
        close_store(store)


def _existing_layout(store: Any) -> tuple[dict[str, Any], list[int]] | None:
    try:
        group = zarr.open_group(store, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError):
        return None
    frames = [int(frame) for frame in group[FRAME_ARRAY][:]] if FRAME_ARRAY in group else []
    return dict(group.attrs), frames


def _check_layout_args(
    uri: str,
    frames: list[int],
    height: int,
    width: int,
    arrays: Sequence[ZarrArray],
    max_people: int,
    frames_per_shard: int,
) -> None:
    problems = []
    if not frames:
        problems.append("no frames")
    if len(set(frames)) != len(frames):
        problems.append("frame numbers repeat")
    if height < 1 or width < 1:
        problems.append(f"size {width}x{height} is empty")
    names = [spec.name for spec in arrays]
    reserved = sorted(set(names) & {FRAME_ARRAY, FRAME_KEY_ARRAY})
    if reserved or len(set(names)) != len(names):
        problems.append(f"array names {names} repeat or use a reserved name")
    if not arrays:
        problems.append("no passes")
    if any(spec.keypoints for spec in arrays) and max_people < 1:
        problems.append("max_people must be at least 1 to store pose")
    if frames_per_shard < 1:
        problems.append("frames_per_shard must be at least 1")
    if problems:
        raise StorageError(f"{uri}: cannot create the shot store: {'; '.join(problems)}")
