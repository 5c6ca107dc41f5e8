"""The catalog's writer: the only API the flow uses to record jobs and what they made.

Every write is one transaction (``BEGIN IMMEDIATE`` on SQLite) and idempotent: rows are
upserted on their natural keys with the dialect's ``INSERT ... ON CONFLICT``, so recording a
chunk again after a Dask retry updates rows in place instead of adding new ones. Job counters
are recomputed from ``job_frames`` inside the same transaction, after the job row is locked
(``SELECT ... FOR UPDATE`` on PostgreSQL), so concurrent writers never lose a count.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Engine, Table, and_, case, delete, func, null, select, update
from sqlalchemy.dialects import postgresql, sqlite

from schemas.catalog import models as m
from schemas.catalog.queries import jobs, reading, with_shot
from schemas.catalog.uris import normalise_uri

if TYPE_CHECKING:
    from schemas.spec import ShotSpec
    from schemas.summaries import ChunkSummary, PlateInfo

# Passes whose checkpoints an output depends on besides its own: pose finds people with the
# seg or matte model. Conservative: a new seg *or* matte checkpoint invalidates pose outputs.
PASS_INPUTS: dict[str, tuple[str, ...]] = {"pose": ("seg", "matte")}
FINAL_STATUSES = ("complete", "partial", "failed")


def _table(model: type[m.Base]) -> Table:
    return cast(Table, model.__table__)


SHOWS, SEQUENCES, SHOTS = _table(m.Show), _table(m.Sequence), _table(m.Shot)
PLATES, PLATE_FRAMES = _table(m.Plate), _table(m.PlateFrame)
CHECKPOINTS, PROVENANCE = _table(m.Checkpoint), _table(m.Provenance)
JOBS, JOB_FRAMES = _table(m.Job), _table(m.JobFrame)
OUTPUTS, OUTPUT_CHECKPOINTS = _table(m.Output), _table(m.OutputCheckpoint)
_OUTPUT_KEY = ("uri", "part", "frame", "pass_name")


class Catalog:
    """Writer API over one engine (see ``schemas.catalog.db.open_catalog``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self.engine.begin() as connection:
            yield connection

    # -- jobs ----------------------------------------------------------------------------
    def register_job(
        self,
        spec: ShotSpec,
        plate: PlateInfo,
        flow_run_id: str | None = None,
        *,
        uris: Mapping[int, str] | None = None,
    ) -> int:
        """Upsert show, sequence, shot, plate and its frames, then add a 'running' job.

        Plate frame URIs are not in PlateInfo: pass ``uris`` (frame -> URI) if known, else
        they stay '' until a chunk records them. A frame whose fingerprint changed since the
        last registration loses its stored sha256 (the file was re-pulled).
        """
        frames = sorted(set(plate.frames))
        if not frames:
            raise ValueError(f"plate {plate.pattern} lists no frames; there is nothing to run")
        uris = uris or {}
        now = m.utcnow()
        span = frames + list(plate.holes)
        plate_values = {
            "first_frame": min(span),
            "last_frame": max(span),
            "width": plate.width,
            "height": plate.height,
            "data_window": list(plate.data_window),
            "display_window": list(plate.display_window),
            "pixel_aspect": float(plate.pixel_aspect),
            "colorspace": plate.colorspace,
            "colorspace_guessed": bool(plate.colorspace_guessed),
            "updated_at": now,
        }
        with self._write() as conn:
            show_id = _get_id(conn, SHOWS, {"name": spec.show})
            sequence_id = _get_id(conn, SEQUENCES, {"show_id": show_id, "name": spec.sequence})
            shot_id = _get_id(
                conn, SHOTS, {"sequence_id": sequence_id, "name": spec.shot}, created_at=now
            )
            ins = _insert(conn, PLATES).values(
                shot_id=shot_id,
                pattern=normalise_uri(plate.pattern),
                created_at=now,
                **plate_values,
            )
            ins = ins.on_conflict_do_update(
                index_elements=["shot_id", "pattern"],
                set_={key: ins.excluded[key] for key in plate_values},
            )
            plate_id = conn.execute(ins.returning(PLATES.c.id)).scalar_one()
            _upsert_plate_frames(
                conn,
                (
                    {
                        "plate_id": plate_id,
                        "frame": frame,
                        "uri": normalise_uri(uris.get(frame, "")),
                        "size_bytes": plate.fingerprints.get(frame, (None, None))[0],
                        "fingerprint": plate.fingerprints.get(frame, (None, None))[1],
                        "sha256": None,
                        "updated_at": now,
                    }
                    for frame in frames
                ),
            )
            job = JOBS.insert().values(
                shot_id=shot_id,
                plate_id=plate_id,
                spec=spec.model_dump(mode="json"),
                submitter=spec.submitter,
                status="running",
                flow_run_id=flow_run_id,
                created_at=now,
                started_at=now,
                frames_total=len(frames),
                frames_done=0,
                frames_failed=0,
                frames_skipped=0,
            )
            return int(conn.execute(job.returning(JOBS.c.id)).scalar_one())

    def record_chunk(self, job_id: int, chunk: ChunkSummary) -> None:
        """Record a chunk's plate checksums, checkpoints, provenance, outputs and frame results
        in one transaction; safe to repeat (a Dask retry) and to run concurrently."""
        _check_chunk(chunk)
        now = m.utcnow()
        with self._write() as conn:
            shot_id, plate_id = _lock_job(conn, job_id)
            _upsert_plate_frames(
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
            checkpoint_ids = _upsert_checkpoints(conn, chunk.checkpoints, now)
            provenance_id = _provenance_id(conn, provenance_data(chunk))
            _upsert_outputs(conn, job_id, shot_id, chunk, checkpoint_ids, provenance_id, now)
            _upsert_job_frames(
                conn,
                (
                    {
                        "job_id": job_id,
                        "frame": f.frame,
                        "status": f.status,
                        "error": f.error,
                        "timings": json_safe(f.timings),
                        "worker": chunk.worker,
                    }
                    for f in chunk.frames
                ),
                replace=True,
            )
            _refresh_counters(conn, job_id)

    def record_skipped(self, job_id: int, frames: Iterable[int]) -> None:
        """Mark frames skipped (their outputs are already up to date); a frame this job has
        already recorded keeps its status."""
        rows = [
            {"job_id": job_id, "frame": int(f), "status": "skipped", "timings": {}, "worker": None}
            for f in frames
        ]
        with self._write() as conn:
            _lock_job(conn, job_id)
            _upsert_job_frames(conn, rows, replace=False)
            _refresh_counters(conn, job_id)

    def finish_job(self, job_id: int, status: str, message: str | None = None) -> None:
        if status not in m.JOB_STATUSES:
            raise ValueError(f"unknown job status {status!r}; known: {', '.join(m.JOB_STATUSES)}")
        finished = m.utcnow() if status in FINAL_STATUSES else None
        with self._write() as conn:
            _lock_job(conn, job_id)
            conn.execute(
                update(JOBS)
                .where(JOBS.c.id == job_id)
                .values(status=status, message=message, finished_at=finished)
            )
            _refresh_counters(conn, job_id)

    def set_flow_run(self, job_id: int, flow_run_id: str) -> None:
        with self._write() as conn:
            result = conn.execute(
                update(JOBS).where(JOBS.c.id == job_id).values(flow_run_id=flow_run_id)
            )
            if result.rowcount == 0:
                raise LookupError(f"no job {job_id} in the catalog")

    def job(self, job_id: int) -> dict[str, Any]:
        """The job as ``queries.jobs`` shows it (with its failed frames)."""
        found = jobs(self.engine, job_id=job_id, limit=1)
        if not found:
            raise LookupError(f"no job {job_id} in the catalog")
        return found[0]

    # -- what the planner asks -----------------------------------------------------------
    def known_plate_frames(
        self, show: str, sequence: str, shot: str, pattern: str
    ) -> dict[int, tuple[int | None, str | None, str | None]]:
        """frame -> (size, fingerprint, sha256) as last recorded for this plate: frames whose
        fingerprint still matches need no re-hashing."""
        pf = PLATE_FRAMES.c
        stmt = select(pf.frame, pf.size_bytes, pf.fingerprint, pf.sha256).select_from(
            PLATE_FRAMES.join(PLATES, PLATES.c.id == pf.plate_id)
        )
        stmt = with_shot(stmt, PLATES.c.shot_id, show, sequence, shot)
        stmt = stmt.where(PLATES.c.pattern == normalise_uri(pattern))
        with reading(self.engine) as conn:
            return {r.frame: (r.size_bytes, r.fingerprint, r.sha256) for r in conn.execute(stmt)}

    def plate_frame_states(
        self, patterns: Iterable[str]
    ) -> dict[str, dict[int, tuple[int | None, str | None, bool]]]:
        """For the bucket scan, in one query per 500 plates: normalised pattern -> frame ->
        (size, fingerprint, read), where ``read`` says a worker has read the bytes with that
        fingerprint (its checksum is recorded; a changed fingerprint clears it)."""
        wanted = sorted({normalise_uri(p) for p in patterns})
        pf = PLATE_FRAMES.c
        states: dict[str, dict[int, tuple[int | None, str | None, bool]]] = {}
        with reading(self.engine) as conn:
            for start in range(0, len(wanted), 500):
                stmt = (
                    select(PLATES.c.pattern, pf.frame, pf.size_bytes, pf.fingerprint, pf.sha256)
                    .select_from(PLATE_FRAMES.join(PLATES, PLATES.c.id == pf.plate_id))
                    .where(PLATES.c.pattern.in_(wanted[start : start + 500]))
                )
                for r in conn.execute(stmt):
                    frames = states.setdefault(r.pattern, {})
                    frames[r.frame] = (r.size_bytes, r.fingerprint, r.sha256 is not None)
        return states

    def existing_outputs(
        self, show: str, sequence: str, shot: str, kind: str = "exr", uri_prefix: str = ""
    ) -> dict[tuple[int, str], str]:
        """(frame, pass) -> cache key of the newest output of that kind (under ``uri_prefix``,
        the output folder of one element and version, when given)."""
        o = OUTPUTS.c
        stmt = select(o.frame, o.pass_name, o.cache_key).select_from(OUTPUTS)
        stmt = with_shot(stmt, o.shot_id, show, sequence, shot)
        stmt = stmt.where(o.kind == kind).order_by(o.created_at, o.id)
        if uri_prefix:
            prefix = normalise_uri(uri_prefix.rstrip("/")) + "/"
            stmt = stmt.where(o.uri.startswith(prefix, autoescape=True))
        with reading(self.engine) as conn:
            # ascending order: the newest row for a (frame, pass) is written last and wins
            return {(r.frame, r.pass_name): r.cache_key for r in conn.execute(stmt)}


# -- helpers -------------------------------------------------------------------------------
def _insert(conn: Connection, table: Table) -> sqlite.Insert | postgresql.Insert:
    """INSERT with ON CONFLICT support for the connection's dialect."""
    name = conn.dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise ValueError(f"the catalog runs on SQLite or PostgreSQL, not {name}")


def _get_id(conn: Connection, table: Table, key: dict[str, Any], **extra: Any) -> int:
    """Id of the row with ``key`` (its unique columns), inserting it first if missing."""
    conn.execute(
        _insert(conn, table).values(**key, **extra).on_conflict_do_nothing(index_elements=list(key))
    )
    where = [table.c[name] == value for name, value in key.items()]
    return int(conn.execute(select(table.c.id).where(*where)).scalar_one())


def _lock_job(conn: Connection, job_id: int) -> tuple[int, int]:
    """(shot_id, plate_id) of the job, row-locked until commit (SQLite: the whole db is)."""
    row = conn.execute(
        select(JOBS.c.shot_id, JOBS.c.plate_id).where(JOBS.c.id == job_id).with_for_update()
    ).one_or_none()
    if row is None:
        raise LookupError(f"no job {job_id} in the catalog; register_job first")
    return int(row.shot_id), int(row.plate_id)


def _dedupe(rows: Iterable[dict[str, Any]], key: tuple[str, ...]) -> list[dict[str, Any]]:
    """Last row per key (ON CONFLICT DO UPDATE may not touch one row twice in a statement),
    sorted by key so concurrent writers lock shared rows in the same order (no deadlocks)."""
    latest = {tuple(row[k] for k in key): row for row in rows}
    return [latest[k] for k in sorted(latest)]


def _upsert_plate_frames(conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
    rows = _dedupe(rows, ("plate_id", "frame"))
    if not rows:
        return
    ins = _insert(conn, PLATE_FRAMES)
    new, old = ins.excluded, PLATE_FRAMES.c
    refetched = and_(
        new.fingerprint.is_not(None),
        old.fingerprint.is_not(None),
        new.fingerprint != old.fingerprint,
    )
    conn.execute(
        ins.on_conflict_do_update(
            index_elements=["plate_id", "frame"],
            set_={
                "uri": case((new.uri != "", new.uri), else_=old.uri),
                "size_bytes": func.coalesce(new.size_bytes, old.size_bytes),
                "fingerprint": func.coalesce(new.fingerprint, old.fingerprint),
                # a new checksum wins; a changed file without one forgets the old checksum
                "sha256": case(
                    (new.sha256.is_not(None), new.sha256), (refetched, null()), else_=old.sha256
                ),
                "updated_at": new.updated_at,
            },
        ),
        rows,
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
                "path": str(info.get("path") or ""),
                "trained": bool(info.get("trained", True)),
                "size_bytes": info.get("size_bytes"),
                "created_at": now,
            }
        )
    rows = _dedupe(rows, ("sha256",))
    if not rows:
        return {}
    ins = _insert(conn, CHECKPOINTS)
    new = ins.excluded
    conn.execute(
        ins.on_conflict_do_update(
            index_elements=["sha256"],
            set_={
                "arch": new.arch,
                "task": new.task,
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
    return _get_id(conn, PROVENANCE, {"digest": digest}, data=data)


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
                }
            )
    rows = _dedupe(rows, _OUTPUT_KEY)
    if not rows:
        return
    ins = _insert(conn, OUTPUTS)
    stmt = ins.on_conflict_do_update(
        index_elements=list(_OUTPUT_KEY),
        set_={key: ins.excluded[key] for key in rows[0] if key not in _OUTPUT_KEY},
    ).returning(OUTPUTS.c.id, *(OUTPUTS.c[key] for key in _OUTPUT_KEY))
    ids = {tuple(r[1:]): r[0] for r in conn.execute(stmt, rows)}
    # Rewrite each output's checkpoint list: a re-run with a new checkpoint replaces it.
    links = []
    for row in rows:
        output_id = ids[tuple(row[key] for key in _OUTPUT_KEY)]
        passes = (row["pass_name"], *PASS_INPUTS.get(row["pass_name"], ()))
        used = {checkpoint_ids[p] for p in passes if p in checkpoint_ids}
        links += [{"output_id": output_id, "checkpoint_id": c} for c in sorted(used)]
    conn.execute(
        delete(OUTPUT_CHECKPOINTS).where(OUTPUT_CHECKPOINTS.c.output_id.in_(list(ids.values())))
    )
    if links:
        conn.execute(OUTPUT_CHECKPOINTS.insert(), links)


def _upsert_job_frames(conn: Connection, rows: Iterable[dict[str, Any]], *, replace: bool) -> None:
    rows = _dedupe(rows, ("job_id", "frame"))
    if not rows:
        return
    ins = _insert(conn, JOB_FRAMES)
    if replace:
        stmt = ins.on_conflict_do_update(
            index_elements=["job_id", "frame"],
            set_={key: ins.excluded[key] for key in ("status", "error", "timings", "worker")},
        )
    else:
        stmt = ins.on_conflict_do_nothing(index_elements=["job_id", "frame"])
    conn.execute(stmt, rows)


def _refresh_counters(conn: Connection, job_id: int) -> None:
    """Recount the job's frames from job_frames (idempotent, unlike n = n + k on a retry)."""

    def count(status: str) -> Any:
        return (
            select(func.count())
            .select_from(JOB_FRAMES)
            .where(JOB_FRAMES.c.job_id == job_id, JOB_FRAMES.c.status == status)
            .scalar_subquery()
        )

    conn.execute(
        update(JOBS)
        .where(JOBS.c.id == job_id)
        .values(
            frames_done=count("done"),
            frames_failed=count("failed"),
            frames_skipped=count("skipped"),
        )
    )


def _check_chunk(chunk: ChunkSummary) -> None:
    """Reject values the schema does not know before anything is written."""
    for f in chunk.frames:
        if f.status not in ("done", "failed"):
            raise ValueError(f"frame {f.frame}: unknown status {f.status!r} (done or failed)")
        for out in f.outputs:
            if out.kind not in m.OUTPUT_KINDS:
                raise ValueError(
                    f"frame {f.frame} pass {out.pass_name}: unknown output kind {out.kind!r}; "
                    f"known: {', '.join(m.OUTPUT_KINDS)}"
                )
