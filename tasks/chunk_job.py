"""One chunk's work order (`ChunkJob`): what a worker needs to process a few frames, small
and picklable, with no torch in it, so planning a shot (and deciding there is nothing to do)
does not import the models' code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage.location import Location
from tasks.checkpoints.files import CheckpointRef
from tasks.output_paths import ShotOutputPaths


@dataclass(frozen=True)
class ChunkJob:
    """One chunk's work order: small and picklable (URIs and settings only)."""

    index: int
    frames: tuple[int, ...]
    plate_uris: tuple[str, ...]
    # the plate (its pattern), with the options that reach its frames; plates may live
    # elsewhere than the outputs (plates on S3, outputs on local disk, ...)
    plate: Location
    store_indices: tuple[int, ...]  # each frame's index in the shot's Zarr arrays
    spec: dict[str, Any]  # ShotSpec as JSON
    plate_colorspace: str  # resolved OCIO name
    checkpoints: dict[str, CheckpointRef]  # model pass -> checkpoint
    paths: ShotOutputPaths  # where the outputs go, with the options that reach them
    frame_hw: tuple[int, int]  # expected data-window size (every frame must match)
    provenance: dict[str, str] = field(default_factory=dict)  # job id, flow run, version
    fingerprints: dict[int, str] = field(default_factory=dict)
    # A stabilised version's chunk (`tasks.stabilise.worker`): the per-frame version its
    # passes are read from, the frames either side of the chunk read for context (number,
    # plate URI; not written), and the pose model's keypoint count.
    source: ShotOutputPaths | None = None
    margin: tuple[tuple[int, str], ...] = ()
    keypoints: int | None = None
    # plate frames outside the chunk that motion needs (frame -> URI): each chunk frame's
    # neighbours f-1 and f+1 where the plate has them; read and decoded for flow only, their
    # checksums not recorded (`tasks.frame_motion`). Empty when motion is not asked for.
    neighbours: dict[int, str] = field(default_factory=dict)


def flow_neighbours(frames: tuple[int, ...], present: set[int] | frozenset[int]) -> list[int]:
    """The frames beside ``frames`` (f-1, f+1) that the plate has (``present``) and the chunk
    does not: what a chunk reads for motion only."""
    inside = set(frames)
    return sorted({n for f in frames for n in (f - 1, f + 1) if n in present and n not in inside})
