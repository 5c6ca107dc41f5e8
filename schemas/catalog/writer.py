"""The catalog's writer: the only API the flow uses to record jobs and what they made.

Every write is one transaction (``BEGIN IMMEDIATE`` on SQLite) and idempotent: rows are
upserted on their natural keys with the dialect's ``INSERT ... ON CONFLICT``, so recording a
chunk again after a Dask retry updates rows in place instead of adding new ones. Job counters
are recomputed from ``job_frames`` inside the same transaction, after the job row is locked
(``SELECT ... FOR UPDATE`` on PostgreSQL), so concurrent writers never lose a count.

Because every write is idempotent, a transaction that fails on a transient database error (a
PostgreSQL restart, a dropped connection, SQLite busy) is simply run again, with backoff,
within a bounded time (``CATALOG_RETRY``); then ``CatalogUnavailable`` names the catalog.
Registering a job is made idempotent too (a retried registration finds the row it may have
committed), and checks that no live job writes the same output folder (``JobConflict``),
closing jobs whose process is gone (``schemas.catalog.lease``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import (
    DatabaseError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from schemas.catalog import models as m
from schemas.catalog.engine import close_engine, describe
from schemas.catalog.errors import CatalogDamaged, CatalogUnavailable, JobConflict
from schemas.catalog.lease import LEASE_S, owner_alive
from schemas.catalog.queries.by_shot import with_shot
from schemas.catalog.queries.jobs import job as read_job
from schemas.catalog.queries.paging import reading
from schemas.catalog.uris import normalise_uri
from schemas.passes import OUTPUT_KINDS, PASSES, checkpoint_inputs
from storage.retry import RetriesExhausted, RetryPolicy, with_retries

if TYPE_CHECKING:
    from schemas.spec import ShotSpec
    from schemas.summaries import ChunkSummary, PlateInfo

# The passes whose checkpoints an output depends on (`schemas.passes.checkpoint_inputs`).
PASS_INPUTS = {p.name: checkpoint_inputs(p.name) for p in PASSES}
FINAL_STATUSES = ("complete", "partial", "failed")


def _table(model: type[m.Base]) -> Table:
    return cast(Table, model.__table__)


SHOWS, SEQUENCES, SHOTS = _table(m.Show), _table(m.Sequence), _table(m.Shot)
PLATES, PLATE_FRAMES = _table(m.Plate), _table(m.PlateFrame)
CHECKPOINTS, PROVENANCE = _table(m.Checkpoint), _table(m.Provenance)
JOBS, JOB_FRAMES = _table(m.Job), _table(m.JobFrame)
OUTPUTS, OUTPUT_CHECKPOINTS = _table(m.Output), _table(m.OutputCheckpoint)
_OUTPUT_KEY = ("uri", "part", "frame", "pass_name")
# Long enough for a database server to restart or fail over, short enough that a database
# that is really gone is reported while the user still watches.
CATALOG_RETRY = RetryPolicy(attempts=10_000, first_wait_s=0.25, max_wait_s=5.0, deadline_s=120.0)
# PostgreSQL error classes worth another try: connection exceptions, the server shutting
# down or starting up, too many connections, serialization failures and deadlocks.
_TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53", "40001", "40P01")
T = TypeVar("T")


class _GaveUp(RetriesExhausted):
    pass


def is_transient(exc: BaseException) -> bool:
    """Whether a database error may pass if the transaction is simply run again."""
    if isinstance(exc, DisconnectionError | PoolTimeout):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if type(orig).__module__.startswith("psycopg"):
        if sqlstate is None:  # no server answer at all: refused, reset, timed out
            return isinstance(exc, OperationalError)
        return str(sqlstate).startswith(_TRANSIENT_SQLSTATES)
    text = str(orig).lower()
    return isinstance(exc, OperationalError) and ("locked" in text or "busy" in text)


class Catalog:
    """Writer API over one engine (see ``schemas.catalog.opening.open_catalog``)."""

    def __init__(self, engine: Engine, retry: RetryPolicy = CATALOG_RETRY) -> None:
        self.engine = engine
        self.retry = retry
        self.where = describe(engine)

    def close(self) -> None:
        """Release the engine's connections; `open_catalog` then opens the catalog afresh."""
        close_engine(self.engine)

    def with_retry(self, policy: RetryPolicy) -> Catalog:
        """The same catalog (same engine) waiting at most as ``policy`` says on each write."""
        return Catalog(self.engine, policy)

    def _write(self, work: Callable[[Connection], T], what: str) -> T:
        """``work`` in one write transaction, run again on transient errors (see above)."""

        def attempt() -> T:
            with self.engine.begin() as connection:
                return work(connection)

        return self._retrying(attempt, what)

    def _read(self, work: Callable[[Connection], T], what: str) -> T:
        def attempt() -> T:
            with reading(self.engine) as connection:
                return work(cast(Connection, connection))

        return self._retrying(attempt, what)

    def _retrying(self, attempt: Callable[[], T], what: str) -> T:
        try:
            return cast(
                T,
                with_retries(attempt, what, self.retry, error=_GaveUp, retryable=is_transient),
            )
        except _GaveUp as exc:
            raise CatalogUnavailable(
                self.where,
                f"unreachable: {exc} (frames written meanwhile are on disk, with "
                "their frame records, and are recorded by the next run)",
            ) from None
        except OperationalError as exc:
            reason = str(exc.orig)
            if "no such table" in reason or "no such column" in reason:
                raise CatalogDamaged(
                    self.where, f"its tables are gone ({reason}); it was wiped or replaced"
                ) from None
            raise
        except DatabaseError as exc:
            if self.engine.dialect.name != "sqlite" or isinstance(exc, IntegrityError):
                raise
            raise CatalogDamaged(  # "file is not a database", "disk image is malformed"
                self.where, f"the file is damaged ({exc.orig}); restore it from a backup"
            ) from None

    # -- jobs ----------------------------------------------------------------------------
    def register_job(
        self,
        spec: ShotSpec,
        plate: PlateInfo,
        flow_run_id: str | None = None,
        *,
        uris: Mapping[int, str] | None = None,
        output_root: str | None = None,
        owner: str | None = None,
        lease_s: float = LEASE_S,
    ) -> int:
        """Upsert show, sequence, shot, plate and its frames, then add a 'running' job.

        Plate frame URIs are not in PlateInfo: pass ``uris`` (frame -> URI) if known, else
        they stay '' until a chunk records them. A frame whose fingerprint changed since the
        last registration loses its stored sha256 (the file was re-pulled).

        With ``output_root`` (the folder the job writes) and ``owner``
        (``lease.start_run()``), running jobs on the same folder are looked at first: one
        whose owner is alive raises JobConflict; one whose owner is gone is closed (partial or
        failed, with the reason). ``frames_total`` counts the range: present frames and holes.
        """
        frames = sorted(set(plate.frames))
        if not frames:
            raise ValueError(f"plate {plate.pattern} lists no frames; there is nothing to run")
        uris = uris or {}
        now = m.utcnow()
        span = sorted(set(frames) | set(plate.holes))
        root = normalise_uri(output_root) if output_root else None
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

        def work(conn: Connection) -> int:
            show_id = _get_id(conn, SHOWS, {"name": spec.show})
            sequence_id = _get_id(conn, SEQUENCES, {"show_id": show_id, "name": spec.sequence})
            shot_id = _get_id(
                conn, SHOTS, {"sequence_id": sequence_id, "name": spec.shot}, created_at=now
            )
            # one registration per shot at a time (SQLite: BEGIN IMMEDIATE already is)
            conn.execute(select(SHOTS.c.id).where(SHOTS.c.id == shot_id).with_for_update())
            mine = conn.execute(  # this very registration, committed by a failed attempt
                select(JOBS.c.id).where(
                    JOBS.c.shot_id == shot_id,
                    JOBS.c.created_at == now,
                    JOBS.c.submitter == spec.submitter,
                )
            ).scalar()
            if mine is not None:
                return int(mine)
            if root is not None:
                _settle_running_jobs(conn, spec, root, now, lease_s)
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
                frames_total=len(span),
                frames_done=0,
                frames_failed=0,
                frames_skipped=0,
                owner=owner,
                heartbeat_at=now if owner else None,
                output_root=root,
            )
            return int(conn.execute(job.returning(JOBS.c.id)).scalar_one())

        return self._write(work, f"registering a job for {spec.shot_path}")

    def heartbeat(self, job_id: int) -> None:
        """Say the job's owner is alive (once: no retries; the next beat tries again)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(JOBS)
                .where(JOBS.c.id == job_id, JOBS.c.status == "running")
                .values(heartbeat_at=m.utcnow())
            )

    def record_chunk(self, job_id: int, chunk: ChunkSummary) -> None:
        """Record a chunk's plate checksums, checkpoints, provenance, outputs and frame results
        in one transaction; safe to repeat (a Dask retry) and to run concurrently."""
        _check_chunk(chunk)
        now = m.utcnow()

        def work(conn: Connection) -> None:
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
            _forget_discarded(conn, shot_id, chunk)
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
            _lock_job(conn, job_id)
            _upsert_job_frames(conn, rows, replace=False)
            _refresh_counters(conn, job_id)

        self._write(work, f"recording the skipped frames of job {job_id}")

    def finish_job(self, job_id: int, status: str, message: str | None = None) -> None:
        if status not in m.JOB_STATUSES:
            raise ValueError(f"unknown job status {status!r}; known: {', '.join(m.JOB_STATUSES)}")
        finished = m.utcnow() if status in FINAL_STATUSES else None

        def work(conn: Connection) -> None:
            _lock_job(conn, job_id)
            conn.execute(
                update(JOBS)
                .where(JOBS.c.id == job_id)
                .values(status=status, message=message, finished_at=finished)
            )
            _refresh_counters(conn, job_id)

        self._write(work, f"closing job {job_id} as {status}")

    def record_flicker(
        self,
        job_id: int,
        flicker: Mapping[str, Mapping[int, float]],
        uris: Mapping[int, Iterable[str]],
    ) -> int:
        """Set the temporal QC score of each (pass, frame) on that frame's outputs among
        ``uris`` (its EXR and the shot's Zarr store) in the job's shot; returns the rows set."""
        rows = [
            {"p": name, "f": frame, "u": normalise_uri(uri), "score": float(score)}
            for name, scores in flicker.items()
            for frame, score in scores.items()
            for uri in uris.get(frame, ())
        ]

        def work(conn: Connection) -> int:
            shot_id, _plate_id = _lock_job(conn, job_id)
            if not rows:
                return 0
            stmt = (
                update(OUTPUTS)
                .where(
                    OUTPUTS.c.shot_id == shot_id,
                    OUTPUTS.c.pass_name == bindparam("p"),
                    OUTPUTS.c.frame == bindparam("f"),
                    OUTPUTS.c.uri == bindparam("u"),
                )
                .values(flicker=bindparam("score"))
            )
            return int(conn.execute(stmt, rows).rowcount or 0)

        return self._write(work, f"recording the flicker scores of job {job_id}")

    def set_flow_run(self, job_id: int, flow_run_id: str) -> None:
        def work(conn: Connection) -> None:
            result = conn.execute(
                update(JOBS).where(JOBS.c.id == job_id).values(flow_run_id=flow_run_id)
            )
            if result.rowcount == 0:
                raise LookupError(f"no job {job_id} in the catalog")

        self._write(work, f"setting the flow run of job {job_id}")

    def job(self, job_id: int) -> dict[str, Any]:
        """The job as ``queries.job`` shows it (with its failed frames)."""
        found = self._read(lambda conn: read_job(conn, job_id), f"reading job {job_id}")
        if found is None:
            raise LookupError(f"no job {job_id} in the catalog")
        return found

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
        return self._read(
            lambda conn: {
                r.frame: (r.size_bytes, r.fingerprint, r.sha256) for r in conn.execute(stmt)
            },
            f"reading the plate frames of {show}/{sequence}/{shot}",
        )

    def plate_frame_states(
        self, patterns: Iterable[str]
    ) -> dict[str, dict[int, tuple[int | None, str | None, bool]]]:
        """For the bucket scan, in one query per 500 plates: normalised pattern -> frame ->
        (size, fingerprint, read), where ``read`` says a worker has read the bytes with that
        fingerprint (its checksum is recorded; a changed fingerprint clears it)."""
        wanted = sorted({normalise_uri(p) for p in patterns})
        pf = PLATE_FRAMES.c
        states: dict[str, dict[int, tuple[int | None, str | None, bool]]] = {}

        def work(conn: Connection) -> None:
            for start in range(0, len(wanted), 500):
                stmt = (
                    select(PLATES.c.pattern, pf.frame, pf.size_bytes, pf.fingerprint, pf.sha256)
                    .select_from(PLATE_FRAMES.join(PLATES, PLATES.c.id == pf.plate_id))
                    .where(PLATES.c.pattern.in_(wanted[start : start + 500]))
                )
                for r in conn.execute(stmt):
                    frames = states.setdefault(r.pattern, {})
                    frames[r.frame] = (r.size_bytes, r.fingerprint, r.sha256 is not None)

        self._read(work, "comparing plates")
        return states

    def existing_outputs(
        self, show: str, sequence: str, shot: str, kind: str = "exr", uri_prefix: str = ""
    ) -> dict[tuple[int, str], str]:
        """(frame, pass) -> cache key of the newest output of that kind (under ``uri_prefix``,
        the output folder of one element and version, when given)."""
        newest = self.frame_outputs(show, sequence, shot, uri_prefix, kinds=(kind,))
        return {(frame, name): row["cache_key"] for (frame, _, name), row in newest.items()}

    def frame_outputs(
        self,
        show: str,
        sequence: str,
        shot: str,
        uri_prefix: str = "",
        kinds: tuple[str, ...] = OUTPUT_KINDS,
    ) -> dict[tuple[int, str, str], dict[str, Any]]:
        """(frame, kind, pass) -> the newest output row (uri, size_bytes, sha256, cache_key)
        under ``uri_prefix`` (one element's and version's folder, when given)."""
        o = OUTPUTS.c
        stmt = select(o.frame, o.kind, o.pass_name, o.uri, o.size_bytes, o.sha256, o.cache_key)
        stmt = with_shot(stmt.select_from(OUTPUTS), o.shot_id, show, sequence, shot)
        stmt = stmt.where(o.kind.in_(kinds)).order_by(o.created_at, o.id)
        if uri_prefix:
            prefix = normalise_uri(uri_prefix.rstrip("/")) + "/"
            stmt = stmt.where(o.uri.startswith(prefix, autoescape=True))

        def work(conn: Connection) -> dict[tuple[int, str, str], dict[str, Any]]:
            # ascending order: the newest row for a (frame, kind, pass) is written last and wins
            return {(r.frame, r.kind, r.pass_name): dict(r._mapping) for r in conn.execute(stmt)}

        return self._read(work, f"reading the outputs of {show}/{sequence}/{shot}")

    def running_jobs(self, output_root: str | None = None) -> list[dict[str, Any]]:
        """Jobs still 'running' (on ``output_root`` when given), with their owner and last
        heartbeat."""
        stmt = select(JOBS).where(JOBS.c.status == "running")
        if output_root is not None:
            stmt = stmt.where(JOBS.c.output_root == normalise_uri(output_root))
        return self._read(
            lambda conn: [dict(r._mapping) for r in conn.execute(stmt)],
            f"looking for running jobs on {output_root or 'any output folder'}",
        )


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


def _settle_running_jobs(
    conn: Connection, spec: ShotSpec, root: str, now: datetime, lease_s: float
) -> None:
    """Before a new job on ``root``: JobConflict if a live job runs there; close the running
    jobs whose owner is gone (their unrecorded frames are redone by the new job)."""
    running = conn.execute(
        select(JOBS).where(JOBS.c.output_root == root, JOBS.c.status == "running")
    ).all()
    for job in running:
        if job.owner is None:
            continue  # registered without a lease (an old version): the scan's reaper decides
        if owner_alive(job.owner, job.heartbeat_at, now, lease_s):
            found = dict(job._mapping)
            found.update(show=spec.show, sequence=spec.sequence, shot=spec.shot)
            raise JobConflict(found)
        recorded = job.frames_done + job.frames_skipped + job.frames_failed
        beat = job.heartbeat_at.isoformat() if job.heartbeat_at else "never"
        message = (
            f"its process ({job.owner}) ended without finishing, last heard of {beat}: "
            f"{recorded} of {job.frames_total} frames recorded; the rest are redone"
        )
        conn.execute(
            update(JOBS)
            .where(JOBS.c.id == job.id)
            .values(
                status="partial" if recorded else "failed",
                message=message,
                finished_at=now,
            )
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
                "family": str(info.get("family") or "sapiens2"),
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
                    "flicker": None,  # a remade output is unscored until the shot's QC
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
        passes = PASS_INPUTS.get(row["pass_name"], (row["pass_name"],))
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
            if out.kind not in OUTPUT_KINDS:
                raise ValueError(
                    f"frame {f.frame} pass {out.pass_name}: unknown output kind {out.kind!r}; "
                    f"known: {', '.join(OUTPUT_KINDS)}"
                )
