"""The plan step of a shot, in one place: `plan_shot` checks the input and makes the shot's
plan (a frozen `ShotPlan`: the input checks of `flows.inputs`, the checkpoints, the plate's
facts, the Zarr store's shard size), and `work_to_do` reads the catalog and the disk once and
returns the work (a frozen `Work`: frames to do, skipped, adopted, redone and why, holes, and
the chunk jobs to dispatch).

Every check that can fail on the user's input runs in `plan_shot`, before dispatch, so a bad
spec costs seconds, not a cluster's time: SpecError, SequenceError, CheckpointChoiceError and
colour errors all say what to fix. Neither function writes anything.
"""

from __future__ import annotations

from dataclasses import replace

from schemas.catalog.writer import Catalog
from schemas.passes import zarr_arrays
from schemas.settings import Settings
from schemas.spec import ShotSpec
from schemas.summaries import PlateInfo
from storage.fingerprint import sequence_fingerprints
from storage.frame import Frame
from storage.zarr_store import shard_frames, stored_frames_per_shard
from tasks.checkpoints.choice import resolve_checkpoints
from tasks.checkpoints.verify import verify_checkpoints

from .inputs import ShotInputs, check_inputs
from .resume import decide_work
from .shot_plan import ShotPlan, Work


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
        family=spec.family,
        asked=spec.passes,
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
    # the settings' options as they are (the flow's own environment is not consulted here)
    store = settings.location(inputs.output_root).at(paths.zarr)
    frames_per_shard = stored_frames_per_shard(store) or shard_frames(
        plate.height, plate.width, zarr_arrays(spec.passes), spec.max_people, spec.chunk_frames
    )
    return ShotPlan(
        spec=spec,
        sequence=sequence,
        plate=plate,
        paths=paths,
        checkpoints=choice.checkpoints,
        checkpoint_note=choice.reason,
        colour_note=inputs.colour_note,
        fps=_fps(header),
        frames_per_shard=frames_per_shard,
        qc_threshold=settings.qc_flicker_threshold,
        source=inputs.source,
    )


def work_to_do(plan: ShotPlan, catalog: Catalog, provenance: dict[str, str]) -> Work:
    """The frames of ``plan`` still to make, decided from the catalog and the disk together
    (`flows.resume`), cut into chunk jobs that carry ``provenance``; reads only."""
    work = decide_work(plan, catalog)
    holes = {
        f: f"{plan.sequence.uri_for(f)}: frame {f}: missing from the sequence (a hole)"
        for f in plan.sequence.holes
    }
    return replace(work, holes=holes, jobs=tuple(plan.chunk_jobs(provenance, work.todo)))


def _fps(header: Frame) -> float:
    try:
        fps = float(header.attributes.get("framesPerSecond") or 24)
    except (TypeError, ValueError):
        return 24.0
    return fps if 1 <= fps <= 1000 else 24.0
