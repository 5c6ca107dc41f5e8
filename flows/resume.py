"""Which frames of a planned shot are really done, decided per frame and per output from the
catalog and the disk together, never from either alone.

A frame is skipped only when every output it must have (the EXR with each pass's part, the
pose fragment, the previews, and its region of each Zarr array) is recorded in the catalog
with the cache key expected now, every recorded file is on disk with its recorded size, and
the Zarr store's commit mark for the frame holds that key with the frame's shards present
(`storage.zarr_store.committed_frames`). So a store that was recreated or lost its metadata, a
deleted or truncated EXR, a missing preview, or an endpoint that lost objects all make the
frame be redone.

A frame whose outputs are on disk but not in the catalog (the flow died, or its database was
away, after a worker finished the frame) is adopted rather than recomputed: its frame record
(`tasks.frame_records`) is read, every file it lists is checked for size and sha256, the
plate fingerprint and cache key must be the ones expected now, and the Zarr mark must agree;
then the run writes the record into the catalog like a chunk's summary. Deciding writes
nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from schemas.catalog.uris import normalise_uri
from schemas.catalog.writer import Catalog
from schemas.passes import OUTPUT_KINDS, expected_outputs
from schemas.summaries import ChunkSummary, FrameSummary
from storage.checksum import sha256_file
from storage.errors import StorageError
from storage.location import Location
from storage.zarr_store import committed_frames
from tasks.frame_records import FrameRecordError, read_frame_record

from .shot_plan import ShotPlan, Work

log = logging.getLogger("svfx.resume")

FILE_KINDS = tuple(kind for kind in OUTPUT_KINDS if kind != "zarr")  # one file each
ADOPTED_CHUNK = -2  # chunk index of frames recorded from their frame records


def decide_work(plan: ShotPlan, catalog: Catalog, *, adopt: bool = True) -> Work:
    """Split the plate's present frames into to do, skipped and adopted (see the module).
    ``adopt=False`` leaves frames only their frame records prove in ``todo``, unread (proving
    one hashes its outputs): for a caller that only asks whether everything is done."""
    spec, paths = plan.spec, plan.paths
    known = catalog.known_plate_frames(spec.show, spec.sequence, spec.shot, spec.plate)
    recorded = catalog.frame_outputs(spec.show, spec.sequence, spec.shot, paths.root + "/")
    on_disk = files_under(paths.location)
    committed = committed_frames(paths.at(paths.zarr))
    wanted = expected_outputs(plan.spec.passes, plan.spec.previews)
    todo: list[int] = []
    skipped: list[int] = []
    adopted: dict[int, ChunkSummary] = {}
    redone: dict[int, str] = {}
    for frame in plan.sequence.frames:
        fingerprint = plan.plate.fingerprints.get(frame, (None, None))[1]
        _size, known_fingerprint, plate_sha = known.get(frame, (None, None, None))
        outputs = {(kind, name): row for (f, kind, name), row in recorded.items() if f == frame}
        if plate_sha and fingerprint and known_fingerprint == fingerprint:
            key = plan.expected_key(plate_sha)
            missing = _missing(outputs, wanted, key, on_disk, committed.get(frame))
            if not missing:
                skipped.append(frame)
                continue
            if outputs:
                redone[frame] = missing
        record = paths.frame_record(frame)
        if adopt and normalise_uri(record) in on_disk:
            summary = _adoptable(plan, record, fingerprint, wanted, on_disk, committed.get(frame))
            if summary is not None:
                adopted[frame] = summary
                continue
        todo.append(frame)
    for frame, why in sorted(redone.items())[:20]:
        log.info("frame %d is redone: %s", frame, why)
    return Work(tuple(todo), tuple(skipped), adopted, redone)


def files_under(root: Location) -> dict[str, int]:
    """Normalised URI -> size of every file under ``root`` (one listing; nothing when the
    folder does not exist)."""
    fs, path = root.fs_and_path()
    try:
        fs.invalidate_cache(path)
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        return {}
    return {
        normalise_uri(fs.unstrip_protocol(name)): int(info.get("size") or 0)
        for name, info in found.items()
        if info.get("type") != "directory"
    }


def _missing(
    outputs: dict[tuple[str, str], dict[str, Any]],
    wanted: set[tuple[str, str]],
    key: str,
    on_disk: dict[str, int],
    committed_key: str | None,
) -> str:
    """Why the frame's recorded outputs do not make it done ('' when they do)."""
    for kind, name in sorted(wanted):
        row = outputs.get((kind, name))
        if row is None:
            return f"no {kind} output of {name} in the catalog"
        if row["cache_key"] != key:
            return f"its {name} {kind} was made from other inputs or settings"
        if kind in FILE_KINDS:
            size = on_disk.get(normalise_uri(row["uri"]))
            if size is None:
                return f"{row['uri']} is missing"
            if size != row["size_bytes"]:
                return f"{row['uri']} has {size} bytes, the catalog recorded {row['size_bytes']}"
    if any(kind == "zarr" for kind, _ in wanted) and committed_key != key:
        return "its region of the Zarr store is not there (store recreated or objects lost)"
    return ""


def _adoptable(
    plan: ShotPlan,
    record: str,
    fingerprint: str | None,
    wanted: set[tuple[str, str]],
    on_disk: dict[str, int],
    committed_key: str | None,
) -> ChunkSummary | None:
    """The frame's record as a one-frame chunk summary when every output it lists is on disk
    as it says (size and sha256) with the key expected now; None otherwise (with the reason
    logged)."""
    try:
        summary, context = read_frame_record(plan.paths.at(record))
        problem = _record_problem(plan, summary, fingerprint, wanted, on_disk, committed_key)
    except (FrameRecordError, StorageError, OSError) as exc:
        problem = str(exc)
    else:
        if not problem:
            return context.summary([summary], ADOPTED_CHUNK)
    log.info("frame record %s not adopted: %s", record, problem)
    return None


def _record_problem(
    plan: ShotPlan,
    summary: FrameSummary,
    fingerprint: str | None,
    wanted: set[tuple[str, str]],
    on_disk: dict[str, int],
    committed_key: str | None,
) -> str:
    if summary.status != "done" or not summary.plate_sha256 or not summary.cache_key:
        return "the frame did not finish"
    if fingerprint is None or summary.plate_fingerprint != fingerprint:
        return "the plate frame changed since"
    key = plan.expected_key(summary.plate_sha256)
    if summary.cache_key != key:
        return "made with other checkpoints or settings"
    outputs = {(out.kind, out.pass_name): out for out in summary.outputs}
    absent = sorted(wanted - set(outputs))
    if absent:
        return f"it lists no {', '.join(f'{k} of {n}' for k, n in absent)}"
    if committed_key != key and any(kind == "zarr" for kind, _ in wanted):
        return "the Zarr store does not hold the frame"
    for out in summary.outputs:
        if out.kind not in FILE_KINDS:
            continue
        if on_disk.get(normalise_uri(out.uri)) != out.size_bytes:
            return f"{out.uri} is missing or has another size"
    files = {out.uri: out.sha256 for out in summary.outputs if out.kind in FILE_KINDS}
    for uri, sha in files.items():
        if sha256_file(plan.paths.at(uri)) != sha:
            return f"{uri} does not match its recorded sha256"
    return ""
