"""What `svfx prune` reads beside the versions: the jobs whose outputs on disk were made from
something that has changed since (what ``--invalidated`` chooses from, for a whole scope in one
query). The bytes of the versions a plan lists are `versions.add_sizes`'s (only those:
sizing every version of a show means grouping all its outputs).

An output is stale when either holds:

- **its plate frame changed**: the output recorded the checksum of the plate frame it was
  made from (``outputs.plate_sha256``) and the catalog's current checksum of that frame of its
  job's plate (``plate_frames.sha256``, same plate id and frame) is another one, or is unknown
  because a registration saw the file's size or mtime (its ETag) change and forgot the old
  checksum (a re-pulled frame no worker has read yet);
- **its checkpoint was superseded**: one of the checkpoints it was made with (its pass's own
  or an input's, ``outputs_checkpoints``) has a non-empty path at which the catalog recorded
  another file (another sha256) after it (a greater checkpoint id): the file at that path was
  replaced, e.g. by a retrained or re-downloaded model.

Outputs already deleted are never stale. Neither rule looks at other versions: a version made
again from the new plate or checkpoint is simply not stale itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Select,
    String,
    and_,
    cast,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.orm import aliased

from schemas.catalog import models as m
from schemas.catalog.queries.by_shot import with_shot
from schemas.catalog.queries.paging import Bind, reading

PLATE, CHECKPOINT = "plate", "checkpoint"


@dataclass(frozen=True)
class Stale:
    """One cause of a job's staleness: how many of its frames, which, and (a checkpoint)
    the path whose file was replaced."""

    cause: str  # PLATE or CHECKPOINT
    frames: int
    first_frame: int
    last_frame: int
    path: str | None = None

    def describe(self) -> str:
        span = f"{self.first_frame}-{self.last_frame}"
        if self.first_frame == self.last_frame:
            span = str(self.first_frame)
        if self.cause == PLATE:
            return f"{self.frames} frame(s) ({span}) made from plate frames changed since"
        return f"{self.frames} frame(s) ({span}) made with {self.path}, replaced since"


def superseded_checkpoints() -> Select[Any]:
    """Ids of checkpoints whose path holds another file recorded after them."""
    newer = aliased(m.Checkpoint)
    replaced = exists().where(
        newer.path == m.Checkpoint.path,
        newer.id > m.Checkpoint.id,
        newer.sha256 != m.Checkpoint.sha256,
    )
    return select(m.Checkpoint.id).where(m.Checkpoint.path != "", replaced)


def _in_scope(
    stmt: Select[Any], show: str | None, sequence: str | None, shot: str | None
) -> Select[Any]:
    if (show, sequence, shot) == (None, None, None):
        return stmt
    return with_shot(stmt, m.Output.shot_id, show, sequence, shot)


def stale_jobs(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
) -> dict[int, list[Stale]]:
    """Job id -> why its live outputs are stale (see the module), for every job of the named
    shots (None: any) that has one; one query for the whole scope."""
    o, pf = m.Output, m.PlateFrame
    live = o.deletion_id.is_(None)
    frames = (func.count(o.frame.distinct()), func.min(o.frame), func.max(o.frame))
    plate = (
        select(o.job_id, literal_column(f"'{PLATE}'"), *frames, cast(null(), String))
        .join(m.Job, m.Job.id == o.job_id)
        .join(pf, and_(pf.plate_id == m.Job.plate_id, pf.frame == o.frame))
        .where(
            live,
            o.plate_sha256.is_not(None),
            or_(pf.sha256.is_(None), pf.sha256 != o.plate_sha256),
        )
        .group_by(o.job_id)
    )
    checkpoint = (
        select(o.job_id, literal_column(f"'{CHECKPOINT}'"), *frames, func.min(m.Checkpoint.path))
        .join(m.OutputCheckpoint, m.OutputCheckpoint.output_id == o.id)
        .join(m.Checkpoint, m.Checkpoint.id == m.OutputCheckpoint.checkpoint_id)
        .where(live, m.OutputCheckpoint.checkpoint_id.in_(superseded_checkpoints()))
        .group_by(o.job_id)
    )
    both = union_all(
        _in_scope(plate, show, sequence, shot), _in_scope(checkpoint, show, sequence, shot)
    )
    found: dict[int, list[Stale]] = {}
    with reading(bind) as conn:
        for job_id, cause, count, first, last, path in conn.execute(both):
            why = Stale(cause, int(count), int(first), int(last), path or None)
            found.setdefault(int(job_id), []).append(why)
    return found
