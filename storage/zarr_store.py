"""The per-shot Zarr v3 store that ML and analysis tools read.

Layout (one group per shot, created once by the flow before any worker writes):

| array      | shape          | dtype | dimension names                   | fill  |
|------------|----------------|-------|-----------------------------------|-------|
| `normal`   | (T, H, W, 3)   | f2    | frame, y, x, c                    | NaN   |
| `pointmap` | (T, H, W, 3)   | f4    | frame, y, x, c                    | NaN   |
| `albedo`   | (T, H, W, 3)   | f2    | frame, y, x, c                    | NaN   |
| `matte`    | (T, H, W)      | f2    | frame, y, x                       | NaN   |
| `seg`      | (T, H, W)      | u1    | frame, y, x                       | 255   |
| `pose`     | (T, P, 308, 3) | f4    | frame, person, keypoint, xys      | NaN   |
| `frame`    | (T,)           | i8    | frame (the plate frame numbers)   | -1    |

The fill values mark what was never written (a failed frame reads as NaN / 255, never as a
plausible zero); `pose` holds (x, y, score) per keypoint and NaN for absent people.

Chunks hold one frame; shards hold `frames_per_shard` frames (Blosc lz4 + byte shuffle,
`ZARR_COMPRESSOR`). Why lz4 rather than zstd: on a 4096x2160 frame of every pass, Blosc zstd
clevel 5 took 2.2 core-s to encode against 0.21 for lz4 (zstd clevel 1: 0.51), for a store
about 15% larger (noisy stand-in data; stack-notes §4.2 measured 1.44 against 1.63 ratio on
render-like data). The store is written once per frame at farm rates and read by ML tools,
so CPU per frame wins; any Blosc build decodes either. Stores created before keep their
codec (it is in each array's metadata).
Zarr rewrites a whole shard for any write into it, without locking, so two writers touching
one shard lose data silently (stack-notes §4.3): give each shard to exactly one writer
(`frames_by_shard`), and create the store once, before fan-out (`create_shot_store`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
import zarr.codecs
from zarr.storage import FsspecStore, LocalStore

from storage.errors import FrameError, StorageError
from storage.uri import default_storage_options, is_remote

log = logging.getLogger(__name__)

STORE_FORMAT = "sapiens2-shot/1"
KEYPOINTS = 308
SEG_FILL = 255
FRAME_ARRAY = "frame"
# Byte shuffle puts the high bytes of float16/float32 together, where lz4 finds runs.
ZARR_COMPRESSOR = zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")


@dataclass(frozen=True)
class PassLayout:
    """How one pass is laid out: per-frame trailing shape, dtype, dimension names, fill."""

    trailing: tuple[int | str, ...]  # "P" stands for max_people
    dtype: str
    dims: tuple[str, ...]
    fill: float | int


PASS_LAYOUTS: dict[str, PassLayout] = {
    "normal": PassLayout(("H", "W", 3), "float16", ("frame", "y", "x", "c"), np.nan),
    "pointmap": PassLayout(("H", "W", 3), "float32", ("frame", "y", "x", "c"), np.nan),
    "albedo": PassLayout(("H", "W", 3), "float16", ("frame", "y", "x", "c"), np.nan),
    "matte": PassLayout(("H", "W"), "float16", ("frame", "y", "x"), np.nan),
    "seg": PassLayout(("H", "W"), "uint8", ("frame", "y", "x"), SEG_FILL),
    "pose": PassLayout(
        ("P", KEYPOINTS, 3), "float32", ("frame", "person", "keypoint", "xys"), np.nan
    ),
}


# Zarr re-encodes a whole shard for every region written into it, so writing frame k of a
# shard costs k frames' worth of encoding: measured at 4096x2160 with 8-frame shards, frames 0
# to 7 cost 0.62 to 2.74 core-s. Shards are capped so a shard of the largest array stays near
# this many raw bytes (at 4K: one frame; 1080p: five; small plates: as asked).
SHARD_BYTES = 128 * 2**20


def shard_frames(
    height: int, width: int, passes: Sequence[str], max_people: int, wanted: int
) -> int:
    """Frames per shard: ``wanted``, fewer when the largest array's frame is big."""
    sizes = {"H": height, "W": width, "P": max_people}
    largest = 1
    for name in passes:
        spec = PASS_LAYOUTS.get(name)
        if spec is None:
            continue
        count = int(np.prod([sizes[d] if isinstance(d, str) else d for d in spec.trailing]))
        largest = max(largest, count * np.dtype(spec.dtype).itemsize)
    return max(1, min(wanted, SHARD_BYTES // largest))


def stored_frames_per_shard(uri: str, storage_options: dict[str, Any] | None = None) -> int | None:
    """The shard size of an existing shot store (None: no store), so a re-run keeps it."""
    existing = _existing_layout(_store(uri, storage_options, read_only=True))
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
    uri: str,
    frames: Sequence[int],
    height: int,
    width: int,
    passes: Sequence[str],
    max_people: int,
    provenance: Mapping[str, Any],
    frames_per_shard: int,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> None:
    """Create the shot's group and arrays once, before any frame is written.

    If a store with the same layout already exists it is kept as is (a re-run fills in the
    frames it is missing); a store with a different layout is refused unless `overwrite`.
    """
    frame_numbers = [int(frame) for frame in frames]
    _check_layout_args(uri, frame_numbers, height, width, passes, max_people, frames_per_shard)
    layout = {
        "format": STORE_FORMAT,
        "frames_per_shard": frames_per_shard,
        "height": height,
        "width": width,
        "max_people": max_people,
        "passes": [name for name in PASS_LAYOUTS if name in passes],
    }
    store = _store(uri, storage_options, read_only=False)
    if not overwrite:
        existing = _existing_layout(store)
        if existing is not None:
            same = {key: existing[0].get(key) for key in layout} == layout
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
    sizes = {"H": height, "W": width, "P": max_people}
    for name in layout["passes"]:
        spec = PASS_LAYOUTS[name]
        trailing = tuple(sizes[d] if isinstance(d, str) else d for d in spec.trailing)
        group.create_array(
            name,
            shape=(count, *trailing),
            dtype=spec.dtype,
            chunks=(1, *trailing),
            shards=(min(frames_per_shard, count), *trailing),
            compressors=[ZARR_COMPRESSOR],
            fill_value=spec.fill,
            dimension_names=spec.dims,
        )


def open_shot_store(
    uri: str, mode: str = "r", storage_options: dict[str, Any] | None = None
) -> zarr.Group:
    """Open the shot group (`mode` "r" or "r+"); plain `zarr.open_group` works too."""
    try:
        return zarr.open_group(_store(uri, storage_options, read_only=mode == "r"), mode=mode)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError) as exc:
        raise StorageError(f"{uri}: no shot store there") from exc


class ShotStoreWriter:
    """Writes frames into an existing store; one per shard writer, arrays opened once."""

    def __init__(self, uri: str, storage_options: dict[str, Any] | None = None) -> None:
        self.uri = uri
        self.group = open_shot_store(uri, "r+", storage_options)
        self.frames = [int(frame) for frame in self.group[FRAME_ARRAY][:]]
        self.max_people = int(self.group.attrs["max_people"])
        self._arrays = {name: self.group[name] for name in self.group.attrs["passes"]}

    def index_of(self, frame_number: int) -> int:
        try:
            return self.frames.index(int(frame_number))
        except ValueError:
            raise FrameError(
                self.uri, frame_number, "frame is not part of this shot store"
            ) from None

    def write_frame(self, frame_index: int, arrays: Mapping[str, Any]) -> list[str]:
        """Write one frame's region of every pass given; returns the passes written."""
        prepared = self.prepare_frame(frame_index, arrays)
        self.write_prepared(frame_index, prepared)
        return list(prepared)

    def prepare_frame(self, frame_index: int, arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Check one frame's arrays and convert them to the blocks stored (seg labels, pose
        rows, store dtypes), without writing: a caller can checksum exactly what is stored."""
        if not 0 <= frame_index < len(self.frames):
            raise FrameError(
                self.uri, None, f"frame index {frame_index} outside 0..{len(self.frames) - 1}"
            )
        frame = self.frames[frame_index]
        unknown = sorted(set(arrays) - set(self._arrays))
        if unknown:
            raise FrameError(
                self.uri, frame, f"passes {unknown} are not in this store ({list(self._arrays)})"
            )
        prepared = {}
        for name, value in arrays.items():
            target = self._arrays[name]
            try:
                prepared[name] = self._prepare(name, value, target.shape[1:])
            except ValueError as exc:
                raise FrameError(self.uri, frame, f"pass {name!r}: {exc}") from exc
        return prepared

    def write_prepared(self, frame_index: int, prepared: Mapping[str, np.ndarray]) -> None:
        """Store blocks from `prepare_frame` (one writer per shard at a time)."""
        for name, block in prepared.items():
            self._arrays[name][frame_index] = block

    def _prepare(self, name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
        if name == "pose" and not isinstance(value, np.ndarray):
            return _pose_block(value, self.max_people)
        block = np.asarray(value)
        if name == "seg" and block.ndim == 3:
            block = np.argmax(block, axis=-1)  # class probabilities -> labels
        if block.shape != shape:
            raise ValueError(f"expected shape {shape}, got {block.shape}")
        if name == "seg" and block.size and (block.min() < 0 or block.max() >= SEG_FILL):
            raise ValueError(f"class labels must lie in 0..{SEG_FILL - 1}")
        return block.astype(PASS_LAYOUTS[name].dtype, copy=False)


def write_frame(
    uri: str,
    frame_index: int,
    arrays: Mapping[str, Any],
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Open the existing store (r+) and write one frame's region; see ShotStoreWriter."""
    return ShotStoreWriter(uri, storage_options).write_frame(frame_index, arrays)


def read_frame(
    uri: str,
    frame_index: int,
    passes: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """One frame of the named passes (default: all) as numpy arrays."""
    group = open_shot_store(uri, "r", storage_options)
    names = list(passes) if passes is not None else list(group.attrs["passes"])
    return {name: np.asarray(group[name][frame_index]) for name in names}


def _pose_block(people: Sequence[Any], max_people: int) -> np.ndarray:
    """(P, 308, 3) x/y/score from a list of people; NaN rows for absent people."""
    block = np.full((max_people, KEYPOINTS, 3), np.nan, dtype=np.float32)
    rows = []
    for person in people:
        keypoints = np.asarray(_field(person, "keypoints"), dtype=np.float32)
        scores = np.asarray(_field(person, "scores"), dtype=np.float32)
        if keypoints.shape != (KEYPOINTS, 2) or scores.shape != (KEYPOINTS,):
            raise ValueError(
                f"each person needs keypoints ({KEYPOINTS}, 2) and scores ({KEYPOINTS},), "
                f"got {keypoints.shape} and {scores.shape}"
            )
        rows.append(np.concatenate([keypoints, scores[:, None]], axis=1))
    if len(rows) > max_people:
        log.warning(
            "%d people in a frame but the store holds %d; keeping the most confident",
            len(rows),
            max_people,
        )
        rows = sorted(rows, key=lambda row: -float(np.nanmean(row[:, 2])))[:max_people]
    for slot, row in enumerate(rows):
        block[slot] = row
    return block


def _field(person: Any, name: str) -> Any:
    return person[name] if isinstance(person, Mapping) else getattr(person, name)


def _store(uri: str, storage_options: dict[str, Any] | None, read_only: bool) -> Any:
    if is_remote(uri):
        options = default_storage_options(uri) if storage_options is None else storage_options
        return FsspecStore.from_url(uri, storage_options=options, read_only=read_only)
    path = uri.removeprefix("file://")
    return LocalStore(path, read_only=read_only)


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
    passes: Sequence[str],
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
    unknown = sorted(set(passes) - set(PASS_LAYOUTS))
    if unknown:
        problems.append(f"unknown passes {unknown} (known: {list(PASS_LAYOUTS)})")
    if not passes:
        problems.append("no passes")
    if "pose" in passes and max_people < 1:
        problems.append("max_people must be at least 1 to store pose")
    if frames_per_shard < 1:
        problems.append("frames_per_shard must be at least 1")
    if problems:
        raise StorageError(f"{uri}: cannot create the shot store: {'; '.join(problems)}")
