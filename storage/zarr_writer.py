"""Writing frames into an existing shot store (``storage.zarr_store`` creates it and says
what it holds): one writer per shard writer, the arrays opened once; a frame's blocks are
checked against their arrays, its commit mark zeroed before and set after."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from storage.errors import FrameError
from storage.location import Where, as_location
from storage.zarr_store import (
    FRAME_ARRAY,
    FRAME_KEY_ARRAY,
    KEY_BYTES,
    KEYPOINTS,
    WRITE_CONFIG,
    close_store,
    key_digest,
    open_shot_store,
)

log = logging.getLogger(__name__)


class ShotStoreWriter:
    """Writes frames into an existing store; one per shard writer, arrays opened once."""

    def __init__(self, where: Where) -> None:
        where = as_location(where)
        self.uri = where.uri
        self.group = open_shot_store(where, "r+")
        self.frames = [int(frame) for frame in self.group[FRAME_ARRAY][:]]
        self.max_people = int(self.group.attrs["max_people"])
        self._arrays = {
            name: self.group[name].with_config(WRITE_CONFIG) for name in self.group.attrs["passes"]
        }
        self._keys = self.group[FRAME_KEY_ARRAY]

    def close(self) -> None:
        close_store(self.group.store)

    @property
    def arrays(self) -> list[str]:
        """The pass arrays of the store."""
        return list(self._arrays)

    def array_uri(self, name: str) -> str:
        return array_uri(self.uri, name)

    def retract(self, frame_index: int) -> None:
        """Zero the frame's commit mark before any of its passes is rewritten."""
        self._keys[frame_index] = np.zeros(KEY_BYTES, dtype=np.uint8)

    def commit(self, frame_index: int, cache_key: str) -> None:
        """Mark the frame stored with ``cache_key`` (hex sha256), after all its passes."""
        self._keys[frame_index] = key_digest(cache_key)

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
        target = self._arrays[name]
        if isinstance(value, list | tuple):  # people: a keypoint array's block
            return people_block(value, self.max_people, shape[1])
        block = np.asarray(value)
        if block.shape != shape:
            raise ValueError(f"expected shape {shape}, got {block.shape}")
        dtype = np.dtype(target.dtype)
        if dtype.kind == "u" and block.size:  # class labels: the fill value means unwritten
            fill = int(target.fill_value)
            if block.min() < 0 or block.max() >= fill:
                raise ValueError(f"class labels must lie in 0..{fill - 1}")
        return block.astype(dtype, copy=False)


def write_frame(where: Where, frame_index: int, arrays: Mapping[str, Any]) -> list[str]:
    """Open the existing store (r+) and write one frame's region; see ShotStoreWriter."""
    writer = ShotStoreWriter(where)
    try:
        return writer.write_frame(frame_index, arrays)
    finally:
        writer.close()


def people_block(people: Sequence[Any], max_people: int, count: int = KEYPOINTS) -> np.ndarray:
    """(P, K, 3) x/y/score from a list of people; NaN rows for absent people."""
    block = np.full((max_people, count, 3), np.nan, dtype=np.float32)
    rows = []
    for person in people:
        keypoints = np.asarray(_field(person, "keypoints"), dtype=np.float32)
        scores = np.asarray(_field(person, "scores"), dtype=np.float32)
        if keypoints.shape != (count, 2) or scores.shape != (count,):
            raise ValueError(
                f"each person needs keypoints ({count}, 2) and scores ({count},), "
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


def array_uri(store_uri: str, name: str) -> str:
    """The URI of a pass's array in the shot's store (what the catalog records for it)."""
    return f"{store_uri.rstrip('/')}/{name}"
