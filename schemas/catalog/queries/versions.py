"""The versions of shots: each output folder the shot's jobs wrote, with its jobs, what it was
made from and what was made from it, its publishes, its deletion and its bytes on disk. What
`svfx delete` checks before it removes a version and what `svfx prune` chooses from."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from schemas.catalog import models as m
from schemas.catalog.queries.by_shot import SHOT_NAMES, with_shot
from schemas.catalog.queries.paging import Bind, Reader, reading

# Job statuses of a job that may still write its folder.
ACTIVE_STATUSES = ("queued", "running")


@dataclass(frozen=True)
class VersionJob:
    id: int
    status: str
    created_at: datetime
    finished_at: datetime | None
    owner: str | None
    heartbeat_at: datetime | None


@dataclass(frozen=True)
class VersionDeletion:
    id: int
    requested_by: str
    reason: str
    started_at: datetime
    finished_at: datetime | None  # None: stopped half way; running the delete again ends it
    size_bytes: int


@dataclass
class Version:
    """One output folder of a shot (``<family>_<version>``, under an element's folder for a
    plate element) and what the catalog knows of it."""

    show: str
    sequence: str
    shot: str
    shot_id: int
    version: str  # the spec's, e.g. v002
    folder: str  # the output folder, normalised as the catalog stores URIs
    source_version: str | None = None  # a stabilised version: the one it was made from
    jobs: list[VersionJob] = field(default_factory=list)  # oldest first
    publishes: list[tuple[str, str, str]] = field(default_factory=list)  # tracker, status, code
    deletion: VersionDeletion | None = None
    outputs: int = 0  # live output rows
    size_bytes: int = 0  # of its live files, each file once

    @property
    def name(self) -> str:
        return f"{self.show}/{self.sequence}/{self.shot}"

    @property
    def label(self) -> str:
        """The folder inside the shot's: ``sapiens2_v002`` or ``bg01/sapiens2_v002``."""
        return folder_label(self.folder, self.show, self.sequence, self.shot)

    @property
    def newest_job(self) -> VersionJob:
        return self.jobs[-1]

    @property
    def complete(self) -> bool:
        """Its newest job completed every frame, and it is not deleted."""
        return self.deletion is None and self.newest_job.status == "complete"

    @property
    def made_at(self) -> datetime:
        """When it was last written: its newest job's end (or start, while it runs)."""
        job = self.newest_job
        return job.finished_at or job.created_at


def folder_label(folder: str, show: str, sequence: str, shot: str) -> str:
    """A version folder relative to its shot's folder (``<show>/<seq>/<shot>/``); the
    folder's last name when it does not lie in that path."""
    marker = f"/{show}/{sequence}/{shot}/"
    at = folder.rfind(marker)
    return folder[at + len(marker) :] if at >= 0 else folder.rstrip("/").rsplit("/", 1)[-1]


def shot_versions(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    *,
    with_sizes: bool = True,
) -> list[Version]:
    """Every version of the named shots (None: any), by shot and then oldest first; a job
    without a recorded folder (before folders were recorded) belongs to none."""
    version = m.Job.spec["version"].as_string()
    source = m.Job.spec["source_version"].as_string()
    columns = (*SHOT_NAMES, m.Job.shot_id, version.label("version"), source.label("source"))
    stmt = with_shot(
        select(
            *columns,
            m.Job.id,
            m.Job.output_root,
            m.Job.status,
            m.Job.created_at,
            m.Job.finished_at,
            m.Job.owner,
            m.Job.heartbeat_at,
        ),
        m.Job.shot_id,
        show,
        sequence,
        shot,
    ).where(m.Job.output_root.is_not(None))
    stmt = stmt.order_by(m.Show.name, m.Sequence.name, m.Shot.name, m.Job.created_at, m.Job.id)
    with reading(bind) as conn:
        versions = _group_jobs(conn.execute(stmt))
        shot_ids = sorted({v.shot_id for v in versions.values()})
        _add_publishes(conn, versions, shot_ids)
        _add_deletions(conn, versions, shot_ids)
    if with_sizes:
        add_sizes(bind, versions.values())
    return list(versions.values())


def _group_jobs(rows: Iterable[Any]) -> dict[str, Version]:
    versions: dict[str, Version] = {}
    for r in rows:
        found = versions.get(r.output_root)
        if found is None:
            found = versions[r.output_root] = Version(
                r.show, r.sequence, r.shot, r.shot_id, r.version or "v001", r.output_root
            )
        found.source_version = r.source or found.source_version
        job = VersionJob(r.id, r.status, r.created_at, r.finished_at, r.owner, r.heartbeat_at)
        found.jobs.append(job)
    return versions


def _add_publishes(conn: Reader, versions: dict[str, Version], shot_ids: list[int]) -> None:
    if not shot_ids:
        return
    by_job = {job.id: v for v in versions.values() for job in v.jobs}
    stmt = select(m.Publish.job_id, m.Publish.tracker, m.Publish.status, m.Publish.code).where(
        m.Publish.shot_id.in_(shot_ids)
    )
    for job_id, tracker, status, code in conn.execute(stmt.order_by(m.Publish.id)):
        if job_id in by_job:
            by_job[job_id].publishes.append((tracker, status, code))


def _add_deletions(conn: Reader, versions: dict[str, Version], shot_ids: list[int]) -> None:
    """Each folder's newest deletion, if it was deleted since its newest job was made: a
    version made again after its deletion is on disk again."""
    if not shot_ids:
        return
    d = m.Deletion
    stmt = select(m.Deletion.__table__).where(d.shot_id.in_(shot_ids))
    for row in conn.execute(stmt.order_by(d.started_at, d.id)):
        found = versions.get(row.output_root)
        if found is None or row.started_at < found.newest_job.created_at:
            continue
        found.deletion = VersionDeletion(
            row.id, row.requested_by, row.reason, row.started_at, row.finished_at, row.size_bytes
        )


def add_sizes(bind: Bind, versions: Iterable[Version]) -> None:
    """Add to each version its live outputs and the bytes of their files (a multi-part EXR's
    parts are one file: its size counted once; a Zarr array's frame, the bytes of its
    region), reading the outputs of these versions' jobs only, a thousand jobs a query."""
    of_job = {job.id: v for v in versions for job in v.jobs}
    ids = sorted(of_job)
    o = m.Output
    with reading(bind) as conn:
        for start in range(0, len(ids), 1000):
            per_file = (
                select(o.job_id, func.count().label("rows"), func.max(o.size_bytes).label("size"))
                .where(o.job_id.in_(ids[start : start + 1000]), o.deletion_id.is_(None))
                .group_by(o.job_id, o.uri, o.frame)
                .subquery()
            )
            rows, size = func.sum(per_file.c.rows), func.sum(per_file.c.size)
            stmt = select(per_file.c.job_id, rows, size).group_by(per_file.c.job_id)
            for job_id, count, total in conn.execute(stmt):
                of_job[job_id].outputs += int(count or 0)
                of_job[job_id].size_bytes += int(total or 0)
