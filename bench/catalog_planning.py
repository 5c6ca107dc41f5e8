"""The planning of a resubmit of a shot whose version is done, as the flow plans it
(`flows.planning.work_to_do`: the plate frames and the version's outputs the catalog
recorded, then the files on disk, decided frame by frame), without Prefect or Dask: the plan
(`flows.shot_plan.ShotPlan`) is made from the bench's studio instead of from the plate's
files. The bench's outputs are not on this machine's disk, so the decision redoes every frame;
the catalog's part of the work is that of a no-op resubmit."""

from __future__ import annotations

import time
from typing import Any

from bench.catalog_record import OUTPUTS, checkpoint, plate_of, spec_of
from bench.catalog_studio import ShotHistory
from bench.catalog_timing import percentiles
from flows.planning import work_to_do
from flows.shot_plan import ShotPlan
from schemas.catalog import open_catalog
from storage.location import Location
from storage.sequences import PlateSequence
from tasks.checkpoints.files import CheckpointRef
from tasks.output_paths import ShotOutputPaths


def resubmit_plan(shot: ShotHistory) -> ShotPlan:
    """The plan of a resubmit of the shot's newest per-frame version."""
    version = [v for v in shot.versions if v.source is None][-1]
    spec = spec_of(shot, version, "bench")
    directory, name = spec.plate.rsplit("/", 1)
    sequence = PlateSequence(
        pattern=spec.plate,
        directory=directory,
        basename=name.split("####", 1)[0],
        extension=".exr",
        padding=4,
        frames=list(shot.frames),
        holes=[],
        location=Location(spec.plate),
    )
    refs = {}
    for name in spec.model_passes:
        c = checkpoint(name, version.generation)
        refs[name] = CheckpointRef(str(c["path"]), str(c["sha256"]), str(c["arch"]), name,
                                   bool(c["trained"]), int(c["size_bytes"]))  # type: ignore[call-overload]  # fmt: skip
    paths = ShotOutputPaths.for_shot(OUTPUTS, spec.show, spec.sequence, spec.shot, spec.version)
    return ShotPlan(spec, sequence, plate_of(shot, spec), paths, refs, "bench", "bench")


def time_planning(url: str, shot: ShotHistory, repeats: int) -> list[dict[str, Any]]:
    """The whole decision (`work_to_do`) and its catalog reads alone, ``repeats`` times."""
    catalog = open_catalog(url)
    plan = resubmit_plan(shot)
    spec, root = plan.spec, plan.paths.root + "/"
    whole, reads = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        work = work_to_do(plan, catalog, {})
        whole.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        catalog.known_plate_frames(spec.show, spec.sequence, spec.shot, spec.plate)
        catalog.frame_outputs(spec.show, spec.sequence, spec.shot, root)
        reads.append((time.perf_counter() - start) * 1000)
    name = f"{spec.shot_path} {spec.version}, {len(shot.frames)} frames"
    frames = f"{len(work.todo)} to do, {len(work.skipped)} skipped"
    return [
        {"what": f"resubmit planning (work_to_do) of {name}", "path": frames, "n": repeats,
         "status": [0], **percentiles(whole)},
        {"what": "  its catalog reads alone", "path": "known_plate_frames + frame_outputs",
         "n": repeats, "status": [0], **percentiles(reads)},
    ]  # fmt: skip
