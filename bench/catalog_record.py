"""Recording a planned shot (`bench.catalog_studio.ShotHistory`) through the catalog's own
writer, as the flow would: ``register_job``, ``record_chunk`` per chunk of frames,
``record_skipped`` for a resubmit's frames that were done, ``finish_job``, ``record_flicker``
for temporal QC and ``record_publish``. Nothing is written behind the writer's back.

The records look like a worker's: per frame one multi-part EXR (a row per part), a region of
each pass's Zarr array, a preview per pass and a pose fragment, with the cache key the planner
expects (`flows.shot_plan.ShotPlan.expected_key`); a stabilised version's frames name the
per-frame outputs of their window as sources (``output_sources``)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import cache

from bench.catalog_studio import ARTISTS, ShotHistory, VersionPlan
from bench.common import full_frame_plate
from schemas.catalog import Catalog
from schemas.passes import BY_NAME
from schemas.spec import ShotSpec, cache_key
from schemas.summaries import ChunkSummary, FrameSummary, OutputRecord, PlateInfo
from storage.pose_json import fragment_uri
from storage.zarr_writer import array_uri
from tasks.output_paths import ShotOutputPaths

PLATES = "/mnt/studio/plates"
OUTPUTS = "/mnt/studio/renders"
PLATE_SIZE = (4448, 3096)
QC_METHOD = "follows-motion-256"  # tasks.temporal_qc.METHOD when this bench was written
FUSION_METHOD = "edge-reach"  # tasks.stabilise.settings.METHOD likewise
RADIUS = 2
DEVICES = ("NVIDIA H100 80GB HBM3", "NVIDIA L40S", "NVIDIA A100-SXM4-80GB")
COLOUR = {
    "config_name": "studio-config-v2.2.0_aces-v1.3_ocio-v2.4",
    "source": "ARRI LogC3 (EI800)",
    "target": "sRGB - Display",
}
TILING = {"tile_height": 1024, "tile_width": 768, "overlap": 128}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@cache
def checkpoint(pass_name: str, generation: int) -> dict[str, object]:
    """The checkpoint of a pass in a generation (0: the untrained stand-in)."""
    size = "0.4b" if generation == 0 else ("1b", "1b", "1b-4k", "5b")[generation % 4]
    return {
        "sha256": sha(f"checkpoint {pass_name} generation {generation}"),
        "arch": f"sapiens2_{size}",
        "task": pass_name,
        "family": "sapiens2",
        "path": f"/mnt/models/sapiens2/{pass_name}_{size}_g{generation}.safetensors",
        "trained": generation > 0,
        "size_bytes": 1_600_000_000 + generation,
    }


@dataclass(frozen=True)
class Recorded:
    outputs: int
    jobs: int


@dataclass
class _Version:
    """One version being recorded: its spec, plate, paths, checkpoints and cache keys."""

    shot: ShotHistory
    plan: VersionPlan
    spec: ShotSpec
    plate: PlateInfo
    paths: ShotOutputPaths
    checkpoints: dict[str, dict[str, object]]
    keys: dict[int, str]
    source: ShotOutputPaths | None
    worker: str


def spec_of(shot: ShotHistory, plan: VersionPlan, artist: str) -> ShotSpec:
    stabilised = {}
    if plan.source is not None:
        stabilised = {
            "temporal": "stabilize",
            "source_version": plan.source,
            "fusion_method": FUSION_METHOD,
        }
    return ShotSpec(
        plate=f"{PLATES}/{shot.path}/{shot.shot}_plate.####.exr",
        show=shot.show,
        sequence=shot.sequence,
        shot=shot.shot,
        passes=shot.passes,  # type: ignore[arg-type]
        output_root=OUTPUTS,
        version=plan.version,
        submitter=artist,
        **stabilised,  # type: ignore[arg-type]
    )


def plate_sha(shot: ShotHistory, frame: int) -> str:
    return sha(f"plate {shot.path} {frame}")


def plate_of(shot: ShotHistory, spec: ShotSpec) -> PlateInfo:
    """The shot's plate as planning finds it (sizes and fingerprints of its frames)."""
    prints = {f: (50_000_000 + f, f"{50_000_000 + f}:1700000000") for f in shot.frames}
    return full_frame_plate(
        spec.plate, shot.frames, PLATE_SIZE, "ARRI LogC3 (EI800)", fingerprints=prints
    )


def _version(shot: ShotHistory, plan: VersionPlan, rng: random.Random) -> _Version:
    spec = spec_of(shot, plan, rng.choice(ARTISTS))
    plate = plate_of(shot, spec)
    checkpoints = {p: checkpoint(p, plan.generation) for p in spec.model_passes}
    shas = [str(c["sha256"]) for c in checkpoints.values()]
    digest = spec.settings_digest()
    keys = {f: cache_key(plate_sha(shot, f), shas, digest) for f in shot.frames}
    source = None
    if plan.source is not None:
        source = ShotOutputPaths.for_shot(OUTPUTS, shot.show, shot.sequence, shot.shot, plan.source)
    paths = ShotOutputPaths.for_shot(OUTPUTS, shot.show, shot.sequence, shot.shot, plan.version)
    worker = f"render-{rng.randrange(1, 41):02d}:{rng.randrange(1000, 99999)}"
    return _Version(shot, plan, spec, plate, paths, checkpoints, keys, source, worker)


def _outputs(v: _Version, frame: int) -> list[OutputRecord]:
    """A finished frame's records: a row per EXR part, Zarr array, preview and fragment."""
    key, paths, out = v.keys[frame], v.paths, []
    for kind, name in sorted(v.shot.wanted):
        salt = f"{paths.root} {name} {frame} {key}"
        if kind == "exr":
            for layer in BY_NAME[name].exr:
                uri, shape = paths.exr(frame), (PLATE_SIZE[1], PLATE_SIZE[0], len(layer.channels))
                size = 9_000_000 + len(salt) * 1000
                out.append(OutputRecord(name, frame, "exr", uri, sha(f"{salt} {layer.part}"),
                                        size, shape, "half", layer.part, key))  # fmt: skip
        elif kind == "zarr":
            uri = array_uri(paths.zarr, name)
            shape = (3, PLATE_SIZE[1], PLATE_SIZE[0])
            out.append(OutputRecord(name, frame, "zarr", uri, sha(salt), 14_000_000, shape,
                                    "float16", None, key))  # fmt: skip
        elif kind == "preview":
            uri = paths.preview(name, frame)
            out.append(OutputRecord(name, frame, "preview", uri, sha(salt), 180_000,
                                    (1080, 1552, 3), "uint8", None, key))  # fmt: skip
        else:
            uri = fragment_uri(paths.pose_fragments, frame)
            out.append(OutputRecord(name, frame, "pose_json", uri, sha(salt), 24_000, (308, 3),
                                    "float32", None, key))  # fmt: skip
    return out


def _sources(v: _Version, frame: int) -> list[tuple[str, int]]:
    """A stabilised frame's sources: the per-frame version's EXR, Zarr arrays and pose
    fragments of the frames in its window."""
    if v.source is None:
        return []
    frames = [f for f in range(frame - RADIUS, frame + RADIUS + 1) if f in v.keys]
    uris: list[tuple[str, int]] = []
    for f in frames:
        uris.append((v.source.exr(f), f))
        uris += [(array_uri(v.source.zarr, name), f) for _kind, name in v.shot.wanted
                 if _kind == "zarr"]  # fmt: skip
        if "pose" in v.shot.passes:
            uris.append((fragment_uri(v.source.pose_fragments, f), f))
    return uris


def _chunk(v: _Version, frames: list[int], failed: set[int], index: int) -> ChunkSummary:
    summaries = []
    for frame in frames:
        common = {
            "frame": frame,
            "plate_uri": v.spec.plate.replace("####", f"{frame:04d}"),
            "plate_sha256": plate_sha(v.shot, frame),
            "plate_size": v.plate.fingerprints[frame][0],
            "plate_fingerprint": v.plate.fingerprints[frame][1],
        }
        if frame in failed:
            error = f"{common['plate_uri']}: frame {frame}: the worker ran out of GPU memory"
            summaries.append(FrameSummary(**common, status="failed", error=error))  # type: ignore[arg-type]
            continue
        summaries.append(
            FrameSummary(
                **common,  # type: ignore[arg-type]
                status="done",
                outputs=_outputs(v, frame),
                timings={"read": 0.41, "model": 1.93, "write": 0.35},
                cache_key=v.keys[frame],
                sources=_sources(v, frame),
            )
        )
    device = DEVICES[int(sha(v.worker)[:8], 16) % len(DEVICES)]
    environment = {"platform": "sapiens-vfx 0.1.0", "torch": "2.13.0", "device": device}
    return ChunkSummary(index, summaries, v.worker, environment, v.checkpoints, COLOUR, TILING)


def record_shot(catalog: Catalog, shot: ShotHistory, chunk_frames: int) -> Recorded:
    """Every version of the shot, oldest first, with its jobs, QC scores and publishes."""
    rng = random.Random(f"record {shot.path}")
    outputs = jobs = 0
    for plan in shot.versions:
        v = _version(shot, plan, rng)
        job_id = _first_job(catalog, v, chunk_frames)
        jobs += 1
        if plan.fixed:
            job_id = _resubmit(catalog, v, redo=list(plan.failed), chunk_frames=chunk_frames)
            jobs += 1
        for _ in range(plan.noops):
            job_id = _resubmit(catalog, v, redo=[], chunk_frames=chunk_frames)
            jobs += 1
        if plan.qc:
            _qc(catalog, v, job_id, rng)
        if plan.publish is not None:
            _publish(catalog, v, job_id, plan.publish, rng)
        done = len(shot.frames) - (0 if plan.fixed else len(plan.failed))
        outputs += done * shot.outputs_per_frame
    return Recorded(outputs, jobs)


def _register(catalog: Catalog, v: _Version) -> int:
    run = sha(f"{v.paths.root} {v.worker} {catalog.engine.url}")[:32]
    return catalog.register_job(v.spec, v.plate, run, output_root=v.paths.root)


def _first_job(catalog: Catalog, v: _Version, chunk_frames: int) -> int:
    """The version's first run: every frame, in chunks; the failed frames fail."""
    job_id = _register(catalog, v)
    frames, failed = list(v.shot.frames), set(v.plan.failed)
    for index, start in enumerate(range(0, len(frames), chunk_frames)):
        chunk = _chunk(v, frames[start : start + chunk_frames], failed, index)
        catalog.record_chunk(job_id, chunk)
    if failed:
        catalog.finish_job(job_id, "partial", f"{len(failed)} of {len(frames)} frames failed")
    else:
        catalog.finish_job(job_id, "complete")
    return job_id


def _resubmit(catalog: Catalog, v: _Version, redo: list[int], chunk_frames: int) -> int:
    """A resubmit of the version: the frames done are skipped, ``redo`` are made again."""
    job_id = _register(catalog, v)
    catalog.record_skipped(job_id, [f for f in v.shot.frames if f not in redo])
    for index, start in enumerate(range(0, len(redo), chunk_frames)):
        catalog.record_chunk(job_id, _chunk(v, redo[start : start + chunk_frames], set(), index))
    catalog.finish_job(job_id, "complete")
    return job_id


def _qc(catalog: Catalog, v: _Version, job_id: int, rng: random.Random) -> None:
    """Flicker scores of the version's dense passes on their EXR and Zarr rows: about 1, a
    few frames above the default threshold of 3."""
    dense = [name for name in v.shot.passes if BY_NAME[name].exr]
    done = [f for f in v.shot.frames if v.plan.fixed or f not in v.plan.failed]
    flicker = {name: {f: round(rng.lognormvariate(0.0, 0.45), 3) for f in done} for name in dense}
    uris = {f: [v.paths.exr(f), *(array_uri(v.paths.zarr, name) for name in dense)] for f in done}
    catalog.record_flicker(job_id, flicker, uris, QC_METHOD)


def _publish(catalog: Catalog, v: _Version, job_id: int, status: str, rng: random.Random) -> None:
    code = f"{v.shot.shot}_sapiens2_{v.plan.version}"
    if status == "pending":
        reason = "kitsu at https://kitsu.studio.example unreachable: connection refused"
        catalog.record_publish(job_id, "kitsu", code=code, reason=reason)
        return
    ids = {
        "project": sha(v.shot.show)[:8],
        "shot": sha(v.shot.path)[:8],
        "task": sha(f"{v.shot.path} sapiens")[:8],
        "version": f"{rng.randrange(10**7):07d}",
    }
    catalog.record_publish(job_id, "kitsu", code=code, entity_ids=ids)
