"""A planned shot as a value: what the plate is, where the outputs go, which checkpoints
make them, and how frames to do are cut into chunk jobs. Frozen: nothing fills it in later;
the work to do is a separate value (`Work`, from `flows.planning.work_to_do`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas.passes import BY_NAME, first_of_kind
from schemas.spec import ShotSpec, cache_key
from schemas.summaries import ChunkSummary, PlateInfo
from storage.location import Location
from storage.sequences import PlateSequence
from storage.zarr_store import KEYPOINTS, shard_of
from tasks.checkpoints.files import CheckpointRef, seg_class_names
from tasks.chunk_job import ChunkJob, flow_neighbours
from tasks.output_paths import ShotOutputPaths


@dataclass(frozen=True)
class ShotPlan:
    spec: ShotSpec
    sequence: PlateSequence
    plate: PlateInfo
    paths: ShotOutputPaths  # the outputs, with the options that reach them
    checkpoints: dict[str, CheckpointRef]
    checkpoint_note: str  # which checkpoints, and why (the size `auto` chose)
    colour_note: str
    fps: float = 24.0  # the plate's framesPerSecond, for review clips
    frames_per_shard: int = 8  # of the Zarr store (storage.zarr_store.shard_frames)
    qc_threshold: float = 3.0  # flicker score above which a frame is flagged (settings)
    source: ShotOutputPaths | None = None  # a stabilised version's per-frame version

    @property
    def plate_location(self) -> Location:
        """The plate as the workers reach it: with the options it was listed with, empty
        ones meaning each worker's environment (`Location.or_environment`)."""
        return self.sequence.location.or_environment()

    @property
    def untrained(self) -> list[str]:
        return [name for name, ref in self.checkpoints.items() if not ref.trained]

    @property
    def keypoints(self) -> int:
        """The pose model's keypoint count (308; a Sapiens v1 COCO model 17 or 133)."""
        posed = first_of_kind(self.checkpoints, "keypoints")
        pose = self.checkpoints[posed] if posed else None
        return pose.outputs if pose is not None and pose.outputs else KEYPOINTS

    @property
    def seg_classes(self) -> tuple[str, ...]:
        """The seg model's class names, index order (Sapiens v1 has no Eyeglass class)."""
        return seg_class_names(self.checkpoints)

    def expected_key(self, plate_sha256: str) -> str:
        shas = [ref.sha256 for ref in self.checkpoints.values()]
        return cache_key(plate_sha256, shas, self.spec.settings_digest())

    def chunk_jobs(self, provenance: dict[str, str], todo: Iterable[int]) -> list[ChunkJob]:
        """One job per group of whole Zarr shards with frames to do (one writer per shard),
        of about ``chunk_frames`` frames."""
        all_frames = self.sequence.all_frames
        index_of = {frame: i for i, frame in enumerate(all_frames)}
        groups = shard_groups(
            [index_of[f] for f in todo], self.frames_per_shard, self.spec.chunk_frames
        )
        flow = any(BY_NAME[name].inference == "plate_flow" for name in self.spec.passes)
        present = frozenset(self.sequence.frames)
        jobs = []
        for chunk_index, indices in enumerate(groups):
            frames = tuple(all_frames[i] for i in indices)
            margin = self._margin(frames)
            beside = flow_neighbours(frames, present) if flow else []
            jobs.append(
                ChunkJob(
                    index=chunk_index,
                    frames=frames,
                    plate_uris=tuple(self.sequence.uri_for(f) for f in frames),
                    plate=self.plate_location,
                    store_indices=tuple(indices),
                    spec=self.spec.model_dump(mode="json"),
                    plate_colorspace=self.plate.colorspace,
                    checkpoints=self.checkpoints,
                    paths=self.paths,
                    frame_hw=(self.plate.height, self.plate.width),
                    provenance=provenance,
                    fingerprints={
                        f: self.plate.fingerprints[f][1] for f in (*frames, *dict(margin))
                    },
                    source=self.source,
                    margin=margin,
                    keypoints=self.keypoints,
                    neighbours={n: self.sequence.uri_for(n) for n in beside},
                )
            )
        return jobs

    def _margin(self, frames: tuple[int, ...]) -> tuple[tuple[int, str], ...]:
        """A stabilised chunk's context: up to ``temporal_radius`` present frames of the
        plate on each side of the chunk (the keypoint smoother's radius when it is larger and
        pose is stabilised; none for a per-frame version)."""
        if self.source is None:
            return ()
        present = self.sequence.frames
        radius = self.spec.temporal_radius
        if first_of_kind(self.spec.passes, "keypoints"):  # the keypoint smoother's window
            from tasks.stabilise.smoothing import DEFAULT_SMOOTHING

            radius = max(radius, DEFAULT_SMOOTHING.radius)
        first, last = present.index(frames[0]), present.index(frames[-1])
        around = [*present[max(0, first - radius) : first], *present[last + 1 : last + 1 + radius]]
        return tuple((f, self.sequence.uri_for(f)) for f in around)


def shard_groups(indices: list[int], frames_per_shard: int, chunk_frames: int) -> list[list[int]]:
    """Store indices to do, cut into work chunks: whole shards (by store position, so no
    shard is ever split between two writers), consecutive shards joined until a chunk holds
    at least ``chunk_frames`` frames."""
    by_shard: dict[int, list[int]] = {}
    for index in sorted(set(indices)):
        by_shard.setdefault(shard_of(index, frames_per_shard), []).append(index)
    groups: list[list[int]] = []
    current: list[int] = []
    for _, members in sorted(by_shard.items()):
        current.extend(members)
        if len(current) >= chunk_frames:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


@dataclass(frozen=True)
class Work:
    """What a run of a plan has to do, decided before dispatch (`flows.planning.work_to_do`;
    which frames are done: `flows.resume.decide_work`)."""

    todo: tuple[int, ...]
    skipped: tuple[int, ...]  # every output present and matching its cache key
    adopted: dict[int, ChunkSummary]  # proved on disk from its frame record: what to record
    redone: dict[int, str] = field(default_factory=dict)  # recorded before, redone: why
    holes: dict[int, str] = field(default_factory=dict)  # missing from the plate: why
    jobs: tuple[ChunkJob, ...] = ()  # the chunks of `todo`, ready to dispatch

    @property
    def note(self) -> str:
        note = f"{len(self.todo)} to do, {len(self.skipped)} already done"
        if self.adopted:
            note += f", {len(self.adopted)} found on disk and recorded"
        return note
