"""Planning a shot (in the flow, before any GPU time): the input checks (`flows.inputs`:
roots, frames, one header, the colour space), then the checkpoints, the plate's facts and
the Zarr store's shard size; later the store is created once and the frames to do are cut
into chunks aligned with its shards.

Every check that can fail on the user's input runs before dispatch, so a bad spec costs
seconds, not a cluster's time: SpecError, SequenceError, CheckpointChoiceError and colour
errors all say what to fix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from schemas.settings import Settings
from schemas.spec import ShotSpec, cache_key
from schemas.summaries import PlateInfo
from storage.errors import StorageError, writing
from storage.fingerprint import sequence_fingerprints
from storage.frame import Frame
from storage.sequences import PlateSequence
from storage.zarr_store import (
    create_shot_store,
    shard_frames,
    shard_of,
    stored_frames_per_shard,
)
from tasks.checkpoint_verify import verify_checkpoints
from tasks.checkpoints import CheckpointRef, resolve_checkpoints
from tasks.chunk_worker import ChunkJob
from tasks.output_paths import ShotOutputPaths
from tasks.provenance import platform_version

from .inputs import ShotInputs, check_inputs

log = logging.getLogger("svfx.plan")


@dataclass(frozen=True)
class ShotPlan:
    spec: ShotSpec
    sequence: PlateSequence
    plate: PlateInfo
    paths: ShotOutputPaths
    checkpoints: dict[str, CheckpointRef]
    checkpoint_note: str  # which checkpoints, and why (the size `auto` chose)
    colour_note: str
    storage_options: dict[str, Any]
    fps: float = 24.0  # the plate's framesPerSecond, for review clips
    frames_per_shard: int = 8  # of the Zarr store (storage.zarr_store.shard_frames)
    qc_threshold: float = 3.0  # flicker score above which a frame is flagged (settings)

    @property
    def untrained(self) -> list[str]:
        return [name for name, ref in self.checkpoints.items() if not ref.trained]

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
                    paths=self.paths,
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


def plan_shot(spec: ShotSpec, settings: Settings, inputs: ShotInputs | None = None) -> ShotPlan:
    """Everything up to dispatch that needs no catalog (the run registers the job and
    decides what is done: `flows.shot_runner`, `flows.resume`). ``inputs``, when the caller
    has checked them already (`flows.inputs.check_inputs`), are not checked again."""
    inputs = inputs or check_inputs(spec, settings)
    sequence, header = inputs.sequence, inputs.header
    choice = resolve_checkpoints(
        spec.model_passes,
        spec.model_size,
        explicit=dict(spec.checkpoints),
        root=spec.checkpoint_root or settings.checkpoint_root,
        untrained_dir=settings.home / "checkpoints" / "untrained",
        preferred=settings.model_size,
    )
    verify_checkpoints(choice.checkpoints)  # header, shapes, finiteness: once per file
    plate = PlateInfo(
        pattern=spec.plate,
        frames=tuple(sequence.frames),
        holes=tuple(sequence.holes),
        width=header.width,
        height=header.height,
        data_window=tuple(header.data_window),  # type: ignore[arg-type]
        display_window=tuple(header.display_window),  # type: ignore[arg-type]
        pixel_aspect=float(header.pixel_aspect),
        colorspace=inputs.colorspace,
        colorspace_guessed=inputs.colorspace_guessed,
        fingerprints=sequence_fingerprints(sequence),
    )
    paths = inputs.paths
    storage_options = settings.storage_options_for(inputs.output_root)
    frames_per_shard = stored_frames_per_shard(paths.zarr, storage_options) or shard_frames(
        plate.height, plate.width, spec.passes, spec.max_people, spec.chunk_frames
    )
    return ShotPlan(
        spec=spec,
        sequence=sequence,
        plate=plate,
        paths=paths,
        checkpoints=choice.checkpoints,
        checkpoint_note=choice.reason,
        colour_note=inputs.colour_note,
        storage_options=storage_options,
        fps=_fps(header),
        frames_per_shard=frames_per_shard,
        qc_threshold=settings.qc_flicker_threshold,
    )


def create_store(plan: ShotPlan, provenance: dict[str, str]) -> bool:
    """Create the shot's Zarr arrays once. Returns True when an existing store had another
    layout and was replaced (its frames' commit marks are gone with it, so `flows.resume`
    redoes them)."""
    args = (
        plan.paths.zarr,
        plan.sequence.all_frames,
        plan.plate.height,
        plan.plate.width,
        plan.spec.passes,
        plan.spec.max_people,
        provenance,
        plan.frames_per_shard,
    )
    options = plan.storage_options or None
    with writing(plan.paths.zarr, None):
        try:
            create_shot_store(*args, storage_options=options)
            return False
        except StorageError as exc:
            log.warning("%s; replacing it and redoing every frame", exc)
            create_shot_store(*args, storage_options=options, overwrite=True)
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


def _fps(header: Frame) -> float:
    try:
        fps = float(header.attributes.get("framesPerSecond") or 24)
    except (TypeError, ValueError):
        return 24.0
    return fps if 1 <= fps <= 1000 else 24.0
