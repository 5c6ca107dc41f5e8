"""The writer's part for what workers made: a chunk's plate checksums, checkpoints,
provenance, outputs and frame results, and the frames a job skipped. Rows are upserted on
their natural keys, so recording a chunk again after a Dask retry updates rows in place."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, and_, delete, func, or_, select

from schemas.catalog import models as m
from schemas.catalog.transactions import CatalogTransactions
from schemas.catalog.upserts import (
    CHECKPOINTS,
    OUTPUT_CHECKPOINTS,
    OUTPUT_SOURCES,
    OUTPUTS,
    PROVENANCE,
    dedupe,
    get_id,
    insert_for,
    lock_job,
    refresh_counters,
    upsert_job_frames,
    upsert_plate_frames,
)
from schemas.catalog.uris import normalise_uri
from schemas.passes import BY_NAME, OUTPUT_KINDS, checkpoint_inputs

if TYPE_CHECKING:
    from schemas.summaries import ChunkSummary

_OUTPUT_KEY = ("uri", "part", "frame", "pass_name")


class ChunkRecording(CatalogTransactions):
    """Record chunks and skipped frames (a part of ``schemas.catalog.writer.Catalog``)."""

    def record_chunk(self, job_id: int, chunk: ChunkSummary) -> None:
        """Record a chunk's plate checksums, checkpoints, provenance, outputs and frame results
        in one transaction; safe to repeat (a Dask retry) and to run concurrently."""
        _check_chunk(chunk)
        now = m.utcnow()

        def work(conn: Connection) -> None:
            shot_id, plate_id = lock_job(conn, job_id)
            upsert_plate_frames(
                conn,
                (
                    {
                        "plate_id": plate_id,
                        "frame": f.frame,
                        "uri": normalise_uri(f.plate_uri or ""),
                        "size_bytes": f.plate_size,
                        "fingerprint": f.plate_fingerprint,
                        "sha256": f.plate_sha256,
                        "updated_at": now,
                    }
                    for f in chunk.frames
                ),
            )
            _forget_discarded(conn, shot_id, chunk)
            checkpoint_ids = _upsert_checkpoints(conn, chunk.checkpoints, now)
            provenance_id = _provenance_id(conn, provenance_data(chunk))
            _upsert_outputs(conn, job_id, shot_id, chunk, checkpoint_ids, provenance_id, now)
            upsert_job_frames(
                conn,
                (
                    {
                        "job_id": job_id,
                        "frame": f.frame,
                        "status": f.status,
                        "error": f.error,
                        "timings": json_safe(f.timings),
                        "worker": chunk.worker,
                        "tiles_run": f.tiles.get("run"),
                        "tiles_skipped": f.tiles.get("skipped"),
                    }
                    for f in chunk.frames
                ),
                replace=True,
            )
            refresh_counters(conn, job_id)

        frames = [f.frame for f in chunk.frames]
        span = f"{min(frames)}-{max(frames)}" if frames else "no frames"
        self._write(work, f"recording frames {span} of job {job_id}")

    def record_skipped(self, job_id: int, frames: Iterable[int]) -> None:
        """Mark frames skipped (their outputs are already up to date); a frame this job has
        already recorded keeps its status."""
        rows = [
            {"job_id": job_id, "frame": int(f), "status": "skipped", "timings": {}, "worker": None}
            for f in frames
        ]

        def work(conn: Connection) -> None:
            lock_job(conn, job_id)
            upsert_job_frames(conn, rows, replace=False)
            refresh_counters(conn, job_id)

        self._write(work, f"recording the skipped frames of job {job_id}")


def _check_chunk(chunk: ChunkSummary) -> None:
    """Reject values the schema does not know before anything is written."""
    for f in chunk.frames:
        if f.status not in ("done", "failed"):
            raise ValueError(f"frame {f.frame}: unknown status {f.status!r} (done or failed)")
        for out in f.outputs:
            if out.kind not in OUTPUT_KINDS:
                raise ValueError(
                    f"frame {f.frame} pass {out.pass_name}: unknown output kind {out.kind!r}; "
                    f"known: {', '.join(OUTPUT_KINDS)}"
                )


def _forget_discarded(conn: Connection, shot_id: int, chunk: ChunkSummary) -> None:
    """A failed frame removed what its attempt wrote: drop the rows describing those files
    and Zarr regions, so the catalog says no more than the disk holds."""
    gone = [
        (f.frame, normalise_uri(uri))
        for f in chunk.frames
        if f.status == "failed"
        for uri in f.discarded
    ]
    if not gone:
        return
    o = OUTPUTS.c
    conn.execute(
        delete(OUTPUTS).where(
            o.shot_id == shot_id,
            or_(*(and_(o.frame == frame, o.uri == uri) for frame, uri in gone)),
        )
    )


def _upsert_checkpoints(
    conn: Connection, checkpoints: Mapping[str, Mapping[str, Any]], now: datetime
) -> dict[str, int]:
    """Upsert the chunk's checkpoints; returns pass -> checkpoint id."""
    rows = []
    for pass_name, info in checkpoints.items():
        sha = info.get("sha256")
        if not isinstance(sha, str) or not sha:
            raise ValueError(f"checkpoint of pass {pass_name!r} has no sha256: {dict(info)!r}")
        rows.append(
            {
                "sha256": sha,
                "arch": str(info.get("arch") or ""),
                "task": str(info.get("task") or pass_name),
                "family": str(info.get("family") or "sapiens2"),
                "path": str(info.get("path") or ""),
                "trained": bool(info.get("trained", True)),
                "size_bytes": info.get("size_bytes"),
                "created_at": now,
            }
        )
    rows = dedupe(rows, ("sha256",))
    if not rows:
        return {}
    ins = insert_for(conn, CHECKPOINTS)
    new = ins.excluded
    conn.execute(
        ins.on_conflict_do_update(
            index_elements=["sha256"],
            set_={
                "arch": new.arch,
                "task": new.task,
                "family": new.family,
                "path": new.path,
                "trained": new.trained,
                "size_bytes": func.coalesce(new.size_bytes, CHECKPOINTS.c.size_bytes),
            },
        ),
        rows,
    )
    found = conn.execute(
        select(CHECKPOINTS.c.sha256, CHECKPOINTS.c.id).where(
            CHECKPOINTS.c.sha256.in_([row["sha256"] for row in rows])
        )
    )
    ids = {sha: checkpoint_id for sha, checkpoint_id in found}
    return {pass_name: ids[info["sha256"]] for pass_name, info in checkpoints.items()}


def json_safe(value: Any) -> Any:
    """``value`` with tuples as lists, non-finite floats as None and unknown objects as str:
    PostgreSQL's JSONB rejects NaN and the digest needs one canonical form."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)


def provenance_data(chunk: ChunkSummary) -> dict[str, Any]:
    data = {
        **chunk.environment,
        "checkpoints": chunk.checkpoints,
        "colour": chunk.colour,
        "tiling": chunk.tiling,
    }
    return cast(dict[str, Any], json_safe(data))


def provenance_digest(data: Mapping[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _provenance_id(conn: Connection, data: dict[str, Any]) -> int:
    digest = provenance_digest(data)
    return get_id(conn, PROVENANCE, {"digest": digest}, data=data)


def _upsert_outputs(
    conn: Connection,
    job_id: int,
    shot_id: int,
    chunk: ChunkSummary,
    checkpoint_ids: dict[str, int],
    provenance_id: int,
    now: datetime,
) -> None:
    rows = []
    for f in chunk.frames:
        for out in f.outputs:
            rows.append(
                {
                    "shot_id": shot_id,
                    "job_id": job_id,
                    "pass_name": out.pass_name,
                    "frame": out.frame,
                    "kind": out.kind,
                    "uri": normalise_uri(out.uri),
                    "part": out.part or "",
                    "sha256": out.sha256,
                    "size_bytes": out.size_bytes,
                    "shape": list(out.shape),
                    "dtype": out.dtype,
                    "cache_key": out.cache_key or f.cache_key or "",
                    "plate_sha256": f.plate_sha256,
                    "checkpoint_id": checkpoint_ids.get(out.pass_name),
                    "provenance_id": provenance_id,
                    "created_at": now,
                    "flicker": None,  # a remade output is unscored until the shot's QC
                    "flicker_method": None,
                    "deletion_id": None,  # a deleted version made again is on disk again
                }
            )
    rows = dedupe(rows, _OUTPUT_KEY)
    if not rows:
        return
    ins = insert_for(conn, OUTPUTS)
    stmt = ins.on_conflict_do_update(
        index_elements=list(_OUTPUT_KEY),
        set_={key: ins.excluded[key] for key in rows[0] if key not in _OUTPUT_KEY},
    ).returning(OUTPUTS.c.id, *(OUTPUTS.c[key] for key in _OUTPUT_KEY))
    ids = {tuple(r[1:]): r[0] for r in conn.execute(stmt, rows)}
    # Rewrite each output's checkpoint list: a re-run with a new checkpoint replaces it.
    links = []
    for row in rows:
        output_id = ids[tuple(row[key] for key in _OUTPUT_KEY)]
        name = row["pass_name"]  # its model's and those it needs (pose: seg or matte)
        passes = checkpoint_inputs(name) if name in BY_NAME else (name,)
        used = {checkpoint_ids[p] for p in passes if p in checkpoint_ids}
        links += [{"output_id": output_id, "checkpoint_id": c} for c in sorted(used)]
    conn.execute(
        delete(OUTPUT_CHECKPOINTS).where(OUTPUT_CHECKPOINTS.c.output_id.in_(list(ids.values())))
    )
    if links:
        conn.execute(OUTPUT_CHECKPOINTS.insert(), links)
    _link_sources(conn, shot_id, chunk, ids)


def _link_sources(
    conn: Connection,
    shot_id: int,
    chunk: ChunkSummary,
    ids: Mapping[tuple[Any, ...], int],
) -> None:
    """Link each output of a frame made from outputs (``FrameSummary.sources``) to the rows
    of the same pass among them (rewritten, like the checkpoint links)."""
    made = [f for f in chunk.frames if f.sources and f.outputs]
    if not made:
        return
    o = OUTPUTS.c
    wanted = {(normalise_uri(uri), frame) for f in made for uri, frame in f.sources}
    found = conn.execute(
        select(o.id, o.uri, o.frame, o.pass_name).where(
            o.shot_id == shot_id,
            o.frame.in_(sorted({frame for _uri, frame in wanted})),
            o.uri.in_(sorted({uri for uri, _frame in wanted})),
        )
    ).all()
    links = []
    for f in made:
        sources = {(normalise_uri(uri), frame) for uri, frame in f.sources}
        for out in f.outputs:
            key = (normalise_uri(out.uri), out.part or "", out.frame, out.pass_name)
            output_id = ids.get(key)
            links += [
                {"output_id": output_id, "source_output_id": row.id}
                for row in found
                if output_id is not None
                and row.pass_name == out.pass_name
                and (row.uri, row.frame) in sources
            ]
    links = dedupe(links, ("output_id", "source_output_id"))
    conn.execute(delete(OUTPUT_SOURCES).where(OUTPUT_SOURCES.c.output_id.in_(list(ids.values()))))
    if links:
        conn.execute(OUTPUT_SOURCES.insert(), links)
