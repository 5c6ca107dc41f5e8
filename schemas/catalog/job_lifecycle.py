"""The writer's part for a job's life: registering it (and its show, sequence, shot, plate and
plate frames), its heartbeat, its flow run, closing it, and reading it and the running jobs.

Registering is idempotent (a retried registration finds the row it may have committed), and
checks that no live job writes the same output folder (``JobConflict``), closing jobs whose
process is gone (``schemas.catalog.lease``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select, update

from schemas.catalog import models as m
from schemas.catalog.deletion_recording import unfinished_deletion
from schemas.catalog.errors import JobConflict, VersionBeingDeleted
from schemas.catalog.lease import LEASE_S, owner_alive
from schemas.catalog.queries.jobs import job as read_job
from schemas.catalog.transactions import CatalogTransactions
from schemas.catalog.upserts import (
    JOBS,
    PLATES,
    SEQUENCES,
    SHOTS,
    SHOWS,
    get_id,
    insert_for,
    lock_job,
    refresh_counters,
    upsert_plate_frames,
)
from schemas.catalog.uris import normalise_uri

if TYPE_CHECKING:
    from schemas.spec import ShotSpec
    from schemas.summaries import PlateInfo

FINAL_STATUSES = ("complete", "partial", "failed")


class JobLifecycle(CatalogTransactions):
    """Register, beat, close and read jobs (a part of ``schemas.catalog.writer.Catalog``)."""

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
        now = m.utcnow()
        span = sorted(set(frames) | set(plate.holes))
        root = normalise_uri(output_root) if output_root else None

        def work(conn: Connection) -> int:
            shot_id = _locked_shot(conn, spec, now)
            mine = _registered_before(conn, shot_id, spec.submitter, now)
            if mine is not None:
                return mine
            if root is not None:
                _refuse_unfinished_deletion(conn, root)
                _settle_running_jobs(conn, spec, root, now, lease_s)
            plate_id = _upsert_plate(conn, shot_id, plate, span, now)
            _upsert_frames(conn, plate_id, plate, frames, uris or {}, now)
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

    def finish_job(self, job_id: int, status: str, message: str | None = None) -> None:
        if status not in m.JOB_STATUSES:
            raise ValueError(f"unknown job status {status!r}; known: {', '.join(m.JOB_STATUSES)}")
        finished = m.utcnow() if status in FINAL_STATUSES else None

        def work(conn: Connection) -> None:
            lock_job(conn, job_id)
            conn.execute(
                update(JOBS)
                .where(JOBS.c.id == job_id)
                .values(status=status, message=message, finished_at=finished)
            )
            refresh_counters(conn, job_id)

        self._write(work, f"closing job {job_id} as {status}")

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


def _locked_shot(conn: Connection, spec: ShotSpec, now: datetime) -> int:
    """The spec's shot id (its show, sequence and shot added when new), the shot's row locked
    so that one registration per shot runs at a time (SQLite: BEGIN IMMEDIATE already is)."""
    show_id = get_id(conn, SHOWS, {"name": spec.show})
    sequence_id = get_id(conn, SEQUENCES, {"show_id": show_id, "name": spec.sequence})
    shot_id = get_id(conn, SHOTS, {"sequence_id": sequence_id, "name": spec.shot}, created_at=now)
    conn.execute(select(SHOTS.c.id).where(SHOTS.c.id == shot_id).with_for_update())
    return shot_id


def _registered_before(conn: Connection, shot_id: int, submitter: str, now: datetime) -> int | None:
    """The job this very registration added in an attempt that committed and then failed
    (same shot, submitter and time), so that a retry returns it rather than adding another."""
    mine = conn.execute(
        select(JOBS.c.id).where(
            JOBS.c.shot_id == shot_id,
            JOBS.c.created_at == now,
            JOBS.c.submitter == submitter,
        )
    ).scalar()
    return None if mine is None else int(mine)


def _upsert_plate(
    conn: Connection, shot_id: int, plate: PlateInfo, span: list[int], now: datetime
) -> int:
    """The plate's id, its row added or brought up to date (its range is ``span``: the
    frames and the holes between them)."""
    values = {
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
    ins = insert_for(conn, PLATES).values(
        shot_id=shot_id, pattern=normalise_uri(plate.pattern), created_at=now, **values
    )
    ins = ins.on_conflict_do_update(
        index_elements=["shot_id", "pattern"], set_={key: ins.excluded[key] for key in values}
    )
    return int(conn.execute(ins.returning(PLATES.c.id)).scalar_one())


def _upsert_frames(
    conn: Connection,
    plate_id: int,
    plate: PlateInfo,
    frames: list[int],
    uris: Mapping[int, str],
    now: datetime,
) -> None:
    """The plate's frames, each with its URI when known ('' until a chunk records it) and
    its size and fingerprint."""
    upsert_plate_frames(
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


def _refuse_unfinished_deletion(conn: Connection, root: str) -> None:
    """A job never writes a folder whose deletion has not finished: the delete would go on to
    remove the new job's files."""
    found = unfinished_deletion(conn, root)
    if found is not None:
        raise VersionBeingDeleted(root, found)


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
