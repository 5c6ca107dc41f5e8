"""Planning a shot (in the flow, before any GPU time): validate, discover frames, read one
header, resolve the colour space and the checkpoints, decide which frames are already done,
create the Zarr store once, and cut the rest into chunks aligned with the Zarr shards.

Every check that can fail on the user's input runs here, so a bad spec costs seconds, not a
cluster's time: SpecError, SequenceError, CheckpointChoiceError and colour errors all say
what to fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from schemas.settings import Settings
from schemas.spec import ShotSpec, SpecError, cache_key, check_paths
from schemas.summaries import PlateInfo
from storage.errors import FrameError, StorageError
from storage.fingerprint import sequence_fingerprints
from storage.frame import Frame
from storage.readers import read_frame
from storage.sequences import PlateSequence, discover_sequence
from storage.uri import filesystem_for
from storage.zarr_store import (
    create_shot_store,
    shard_frames,
    shard_of,
    stored_frames_per_shard,
)
from tasks import platform_version
from tasks.checkpoints import CheckpointRef, choose_checkpoints
from tasks.chunk_worker import ChunkJob
from tasks.colour import guess_colourspace, resolve_colourspace
from tasks.layout import ShotLayout

log = logging.getLogger("svfx.plan")


@dataclass
class ShotPlan:
    spec: ShotSpec
    sequence: PlateSequence
    plate: PlateInfo
    layout: ShotLayout
    checkpoints: dict[str, CheckpointRef]
    colour_note: str
    storage_options: dict[str, Any]
    todo: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    fps: float = 24.0  # the plate's framesPerSecond, for review clips
    frames_per_shard: int = 8  # of the Zarr store (storage.zarr_store.shard_frames)

    @property
    def untrained(self) -> list[str]:
        return [name for name, ref in self.checkpoints.items() if not ref.trained]

    def expected_key(self, plate_sha256: str) -> str:
        shas = [ref.sha256 for ref in self.checkpoints.values()]
        return cache_key(plate_sha256, shas, self.spec.settings_digest())

    def chunk_jobs(self, provenance: dict[str, str]) -> list[ChunkJob]:
        """One job per group of whole Zarr shards with frames to do (one writer per shard),
        of about ``chunk_frames`` frames."""
        all_frames = self.sequence.all_frames
        index_of = {frame: i for i, frame in enumerate(all_frames)}
        groups = shard_groups(
            [index_of[f] for f in self.todo], self.frames_per_shard, self.spec.chunk_frames
        )
        jobs = []
        for chunk_index, indices in enumerate(groups):
            frames = tuple(all_frames[i] for i in indices)
            jobs.append(
                ChunkJob(
                    index=chunk_index,
                    frames=frames,
                    plate_uris=tuple(self.sequence.uri_for(f) for f in frames),
                    store_indices=tuple(indices),
                    spec=self.spec.model_dump(mode="json"),
                    plate_colorspace=self.plate.colorspace,
                    checkpoints=self.checkpoints,
                    layout=self.layout,
                    frame_hw=(self.plate.height, self.plate.width),
                    storage_options=self.storage_options,
                    provenance=provenance,
                    fingerprints={f: self.plate.fingerprints[f][1] for f in frames},
                    plate_storage_options=dict(self.sequence.storage_options or {}),
                )
            )
        return jobs


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


def plan_shot(spec: ShotSpec, settings: Settings) -> ShotPlan:
    """Everything up to dispatch except registering the job (see `decide_work`)."""
    output_root = spec.output_root or settings.outputs
    problems = check_paths(spec, settings.roots, output_root)
    if problems:
        raise SpecError("\n".join(problems))
    sequence = discover_sequence(spec.plate, spec.frames, settings.storage_options_for(spec.plate))
    header = _first_readable(sequence)
    colorspace, guessed, note = _colourspace(spec, header)
    checkpoints = choose_checkpoints(
        spec.model_passes,
        spec.model_size,
        explicit=dict(spec.checkpoints),
        root=spec.checkpoint_root or settings.checkpoint_root,
        untrained_dir=settings.home / "checkpoints" / "untrained",
    )
    plate = PlateInfo(
        pattern=spec.plate,
        frames=tuple(sequence.frames),
        holes=tuple(sequence.holes),
        width=header.width,
        height=header.height,
        data_window=tuple(header.data_window),  # type: ignore[arg-type]
        display_window=tuple(header.display_window),  # type: ignore[arg-type]
        pixel_aspect=float(header.pixel_aspect),
        colorspace=colorspace,
        colorspace_guessed=guessed,
        fingerprints=sequence_fingerprints(sequence),
    )
    layout = ShotLayout.for_shot(
        output_root,
        spec.show,
        spec.sequence,
        spec.shot,
        spec.version,
        sequence.padding,
        element=spec.element,
    )
    storage_options = settings.storage_options_for(output_root)
    frames_per_shard = stored_frames_per_shard(layout.zarr, storage_options) or shard_frames(
        plate.height, plate.width, spec.passes, spec.max_people, spec.chunk_frames
    )
    return ShotPlan(
        spec=spec,
        sequence=sequence,
        plate=plate,
        layout=layout,
        checkpoints=checkpoints,
        colour_note=note,
        storage_options=storage_options,
        fps=_fps(header),
        frames_per_shard=frames_per_shard,
    )


def decide_work(plan: ShotPlan, catalog: Any) -> None:
    """Fill `plan.todo` / `plan.skipped`. A frame is skipped when the catalog has an output of
    every pass asked for (EXR; pose: its JSON record) with this frame's cache key, the plate
    frame's fingerprint is the one its checksum was recorded with, and the EXR is still there."""
    spec = plan.spec
    known = catalog.known_plate_frames(spec.show, spec.sequence, spec.shot, spec.plate)
    where = (spec.show, spec.sequence, spec.shot)
    root = plan.layout.root + "/"  # this element and version only
    existing = catalog.existing_outputs(*where, kind="exr", uri_prefix=root)
    if "pose" in spec.passes:  # pose has no EXR part: its per-frame record is the JSON
        existing.update(catalog.existing_outputs(*where, kind="pose_json", uri_prefix=root))
    on_disk = _existing_files(plan.layout.root, plan.storage_options)
    plan.todo, plan.skipped = [], []
    for frame in plan.sequence.frames:
        size_fp = plan.plate.fingerprints.get(frame)
        record = known.get(frame)
        done = False
        if size_fp and record and record[2] and record[1] == size_fp[1]:
            key = plan.expected_key(record[2])
            done = all(existing.get((frame, name)) == key for name in spec.passes)
            done = done and plan.layout.exr(frame).rpartition("/")[2] in on_disk
        (plan.skipped if done else plan.todo).append(frame)


def create_store(plan: ShotPlan, provenance: dict[str, str]) -> bool:
    """Create the shot's Zarr arrays once. Returns True when an existing store had another
    layout and was replaced (then every frame must be redone)."""
    args = (
        plan.layout.zarr,
        plan.sequence.all_frames,
        plan.plate.height,
        plan.plate.width,
        plan.spec.passes,
        plan.spec.max_people,
        provenance,
        plan.frames_per_shard,
    )
    try:
        create_shot_store(*args, storage_options=plan.storage_options or None)
        return False
    except StorageError as exc:
        log.warning("%s; replacing it and redoing every frame", exc)
        create_shot_store(*args, storage_options=plan.storage_options or None, overwrite=True)
        return True


def store_provenance(plan: ShotPlan, job_id: int, flow_run_id: str | None) -> dict[str, str]:
    prov = {
        "svfx/version": platform_version(),
        "svfx/job": str(job_id),
        "svfx/shot": plan.spec.shot_path,
        "svfx/plate": plan.spec.plate,
    }
    if flow_run_id:
        prov["svfx/flowRun"] = flow_run_id
    if plan.untrained:
        prov["sapiens2/UNTRAINED"] = f"random weights for {', '.join(plan.untrained)}"
    return prov


def _first_readable(sequence: PlateSequence) -> Frame:
    """The first frame that reads, for resolution and windows. Frames that do not read are
    left to the workers, which record each one's reason."""
    errors: list[str] = []
    for frame in sequence.frames[:5]:
        try:
            uri = sequence.uri_for(frame)
            return read_frame(uri, frame, storage_options=sequence.storage_options)
        except FrameError as exc:
            errors.append(str(exc))
    lines = "\n  ".join(errors)
    raise SpecError(f"no readable frame among the first frames of {sequence.pattern}:\n  {lines}")


def _colourspace(spec: ShotSpec, header: Frame) -> tuple[str, bool, str]:
    if spec.colorspace:
        try:
            space = resolve_colourspace(spec.colorspace)
        except (ValueError, LookupError) as exc:
            raise SpecError(f"colour space: {exc}") from None
        return space, False, f"plate colour space {space} (as given)"
    guess = guess_colourspace(header)
    note = f"plate colour space guessed: {guess.reason}"
    if not guess.certain:
        note += " -- pass --colorspace to say what it is"
    (log.info if guess.certain else log.warning)(note)
    return guess.colourspace, True, note


def _fps(header: Frame) -> float:
    try:
        fps = float(header.attributes.get("framesPerSecond") or 24)
    except (TypeError, ValueError):
        return 24.0
    return fps if 1 <= fps <= 1000 else 24.0


def _existing_files(directory: str, options: dict[str, Any]) -> set[str]:
    fs, path = filesystem_for(directory, options or None)
    try:
        fs.invalidate_cache(path)
        return {str(name).rstrip("/").rpartition("/")[2] for name in fs.ls(path, detail=False)}
    except FileNotFoundError:
        return set()
