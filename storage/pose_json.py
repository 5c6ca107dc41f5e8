"""Pose for a whole shot as one plain JSON file, readable without the platform.

    {
      "format": "sapiens2-pose/1",
      "image_size": {"width": W, "height": H},
      "data_window": [xmin, ymin, xmax, ymax],          # when known
      "coordinates": "...",                             # what x, y mean
      "keypoint_names": [... K names ...],
      "skeleton": [[a, b], ...],                         # as given (names or indices)
      "provenance": {...},
      "frames": {"1001": [{"box": [x1, y1, x2, y2], "box_score": s,   # box_score if known
                           "keypoints": [[x, y, score], ... K]}], ...},
      "missing_frames": [1005, ...]                      # frames with no pose record
    }

A frame with nobody in it is `[]`; a frame that failed is absent from `frames` and listed in
`missing_frames`. Coordinates are rounded to 1/1000 pixel and scores to 1e-4; non-finite
values are written as null (strict JSON has no NaN).

Workers write one small fragment per frame (`write_pose_fragment`); the flow streams the
fragments into the shot file (`assemble_pose_json`), holding one frame at a time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from storage.atomic import WriteResult, atomic_open, atomic_write_bytes
from storage.errors import FrameError, StorageError
from storage.frame import Box
from storage.location import Location, Where, as_location
from storage.uri import join

POSE_FORMAT = "sapiens2-pose/1"
FRAGMENT_FORMAT = "sapiens2-pose-frame/1"
COORDINATES = (
    "plate pixels of the data window: x right, y down, (0, 0) at the top-left corner of the "
    "data window's first pixel"
)


@dataclass(frozen=True)
class PoseHeader:
    """What the shot file says before its frames: the keypoints, the skeleton (names or
    indices), the (width, height) of the data window the coordinates refer to, and where
    they came from."""

    keypoint_names: Sequence[str]
    skeleton: Sequence[Sequence[Any]]
    image_size: tuple[int, int]
    data_window: Box | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def opening(self) -> str:
        """The JSON object up to (not including) its closing brace."""
        names = [str(name) for name in self.keypoint_names]
        header: dict[str, Any] = {
            "format": POSE_FORMAT,
            "image_size": {"width": int(self.image_size[0]), "height": int(self.image_size[1])},
        }
        if self.data_window is not None:
            header["data_window"] = [int(value) for value in self.data_window]
        header["coordinates"] = COORDINATES
        header["keypoint_names"] = names
        header["skeleton"] = _checked_skeleton(self.skeleton, names)
        header["provenance"] = dict(self.provenance)
        return json.dumps(header, ensure_ascii=False, allow_nan=False)[:-1]


def person_record(person: Any, keypoint_count: int | None = None) -> dict[str, Any]:
    """One person as JSON-ready data; `person` is a mapping or object with box/keypoints/scores."""
    box = np.asarray(_field(person, "box"), dtype=np.float64).reshape(-1)
    keypoints = np.asarray(_field(person, "keypoints"), dtype=np.float64)
    scores = np.asarray(_field(person, "scores"), dtype=np.float64).reshape(-1)
    if box.shape != (4,):
        raise ValueError(f"box must be [x1, y1, x2, y2], got shape {box.shape}")
    if keypoints.ndim != 2 or keypoints.shape[1] != 2 or scores.shape != (keypoints.shape[0],):
        raise ValueError(
            f"keypoints must be (K, 2) with scores (K,), got {keypoints.shape} and {scores.shape}"
        )
    if keypoint_count is not None and keypoints.shape[0] != keypoint_count:
        raise ValueError(f"expected {keypoint_count} keypoints, got {keypoints.shape[0]}")
    record: dict[str, Any] = {"box": [_number(value, 3) for value in box]}
    box_score = _optional_field(person, "box_score")
    if box_score is not None:
        record["box_score"] = _number(float(box_score), 4)
    record["keypoints"] = [
        [_number(x, 3), _number(y, 3), _number(s, 4)]
        for (x, y), s in zip(keypoints.tolist(), scores.tolist(), strict=True)
    ]
    return record


def write_pose_json(
    where: Where,
    frames: Iterable[tuple[int, Sequence[Any] | None]],
    header: PoseHeader,
) -> WriteResult:
    """Stream (frame, people) pairs into the shot's pose JSON at `where`, atomically.

    `people` is a list of persons, or None for a frame whose pose is missing.
    """
    where = as_location(where)
    uri = where.uri
    opening = header.opening()
    keypoint_count = len(header.keypoint_names)
    writer = atomic_open(where)
    missing: list[int] = []
    seen: set[int] = set()
    with writer as handle:
        handle.write(f'{opening}, "frames": {{'.encode())
        first = True
        for frame, people in frames:
            frame = int(frame)
            if frame in seen:
                raise FrameError(uri, frame, "frame given twice")
            seen.add(frame)
            if people is None:
                missing.append(frame)
                continue
            try:
                records = [person_record(person, keypoint_count) for person in people]
            except ValueError as exc:
                raise FrameError(uri, frame, f"bad pose record: {exc}") from exc
            entry = json.dumps({str(frame): records}, allow_nan=False)[1:-1]
            handle.write(("\n" if first else ",\n").encode() + entry.encode())
            first = False
        handle.write(f'}}, "missing_frames": {json.dumps(sorted(missing))}}}\n'.encode())
    assert writer.result is not None
    return writer.result


def fragment_uri(fragments_uri: str, frame: int) -> str:
    return join(fragments_uri, f"pose.{int(frame)}.json")


def _fragment(fragments: Location, frame: int) -> Location:
    return fragments.at(fragment_uri(fragments.uri, frame))


def write_pose_fragment(fragments: Where, frame: int, people: Sequence[Any]) -> WriteResult:
    """Worker side: one frame's people as a small JSON file under `fragments`."""
    where = _fragment(as_location(fragments), frame)
    uri = where.uri
    try:
        records = [person_record(person) for person in people]
    except ValueError as exc:
        raise FrameError(uri, frame, f"bad pose record: {exc}") from exc
    payload = {"format": FRAGMENT_FORMAT, "frame": int(frame), "people": records}
    return atomic_write_bytes(where, json.dumps(payload, allow_nan=False).encode())


def assemble_pose_json(
    where: Where, fragments: Where, frames: Sequence[int], header: PoseHeader
) -> WriteResult:
    """Flow side: stream the per-frame fragments (under `fragments`) into the shot JSON at
    `where`; absent ones are missing."""
    fragments = as_location(fragments)
    loaded = ((int(frame), read_pose_fragment(fragments, int(frame))) for frame in frames)
    return write_pose_json(where, loaded, header)


def read_pose_fragment(fragments: Where, frame: int) -> list[dict[str, Any]] | None:
    """One frame's people from its fragment under ``fragments`` (box, keypoints, scores;
    null as NaN), None when it has none; StorageError naming it when it is unreadable."""
    where = _fragment(as_location(fragments), frame)
    fs, path = where.fs_and_path()
    try:
        with fs.open(path, "rb") as handle:
            payload = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StorageError(f"{where.uri}: unreadable pose fragment: {exc}") from exc
    try:
        return [_person_from_record(record) for record in payload["people"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise StorageError(f"{where.uri}: malformed pose fragment: {exc}") from exc


def read_pose_json(where: Where) -> dict[str, Any]:
    """The parsed pose JSON (plain `json.load`; nothing platform-specific is needed)."""
    where = as_location(where)
    uri = where.uri
    fs, path = where.fs_and_path()
    with fs.open(path, "rb") as handle:
        data = json.load(handle)
    if data.get("format") != POSE_FORMAT:
        raise StorageError(f"{uri}: not a {POSE_FORMAT} file (format={data.get('format')!r})")
    return data


def _person_from_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON person record back to box/keypoints/scores (null becomes NaN)."""
    rows = np.asarray(record["keypoints"], dtype=np.float64).reshape(-1, 3)
    return {
        "box": np.asarray(record["box"], dtype=np.float64),
        "box_score": record.get("box_score"),
        "keypoints": rows[:, :2],
        "scores": rows[:, 2],
    }


def _checked_skeleton(skeleton: Sequence[Sequence[Any]], names: list[str]) -> list[list[Any]]:
    known = set(names)
    links = []
    for link in skeleton:
        pair = list(link)
        if len(pair) != 2:
            raise ValueError(f"skeleton links must be pairs, got {link!r}")
        for end in pair:
            if isinstance(end, str):
                if end not in known:
                    raise ValueError(f"skeleton names unknown keypoint {end!r}")
            elif not 0 <= int(end) < len(names):
                raise ValueError(f"skeleton index {end!r} outside 0..{len(names) - 1}")
        links.append([end if isinstance(end, str) else int(end) for end in pair])
    return links


def _number(value: float, digits: int) -> float | None:
    return round(float(value), digits) if math.isfinite(value) else None


def _field(person: Any, name: str) -> Any:
    return person[name] if isinstance(person, Mapping) else getattr(person, name)


def _optional_field(person: Any, name: str) -> Any:
    if isinstance(person, Mapping):
        return person.get(name)
    return getattr(person, name, None)
