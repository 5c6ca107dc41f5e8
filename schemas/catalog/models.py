"""Catalog tables (SQLAlchemy 2 typed declarative), portable between SQLite and PostgreSQL.

Design notes:

* JSON columns use ``JSON().with_variant(JSONB(), "postgresql")``: JSONB on PostgreSQL, JSON
  text on SQLite.
* Timestamps are stored as UTC and always come back timezone-aware (``UTCDateTime``); they are
  set from Python with microseconds, so "newest first" is well defined on SQLite too.
* ``outputs.part`` is never NULL (``''`` for "no part") so the unique key
  ``(uri, part, frame, pass_name)`` holds on both dialects (NULLs never collide in a UNIQUE).
* Checkpoints of an output: ``outputs.checkpoint_id`` is the pass's own checkpoint, and the
  association table ``outputs_checkpoints`` lists *every* checkpoint the output depends on
  (its own plus, for pose, the seg/matte checkpoints that found the people). An association
  table rather than a JSON list keeps "what does this checkpoint invalidate" one indexed join
  on both dialects.
* ``provenance`` rows are deduplicated by the sha256 of their canonical JSON: the thousands of
  outputs of one job usually share one row.
* Status and kind columns are plain strings (validated in Python), so adding a value never
  needs a migration.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JSONType = JSON().with_variant(JSONB(), "postgresql")

JOB_STATUSES = ("queued", "running", "complete", "partial", "failed")
FRAME_STATUSES = ("done", "failed", "skipped")

# Named constraints keep later (batch) migrations on SQLite possible.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Stores UTC; returns aware UTC datetimes on both dialects (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 (SQLAlchemy reads it as a class attribute)
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
        datetime: UTCDateTime,
    }


class Show(Base):
    __tablename__ = "shows"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)


class Sequence(Base):
    __tablename__ = "sequences"
    __table_args__ = (UniqueConstraint("show_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    show_id: Mapped[int] = mapped_column(ForeignKey("shows.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))


class Shot(Base):
    __tablename__ = "shots"
    __table_args__ = (UniqueConstraint("sequence_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    sequence_id: Mapped[int] = mapped_column(ForeignKey("sequences.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Plate(Base):
    __tablename__ = "plates"
    __table_args__ = (UniqueConstraint("shot_id", "pattern"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    shot_id: Mapped[int] = mapped_column(ForeignKey("shots.id", ondelete="CASCADE"))
    pattern: Mapped[str] = mapped_column(String(1024))
    first_frame: Mapped[int] = mapped_column(Integer)
    last_frame: Mapped[int] = mapped_column(Integer)
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    data_window: Mapped[list[Any]]
    display_window: Mapped[list[Any]]
    pixel_aspect: Mapped[float] = mapped_column(Float)
    colorspace: Mapped[str] = mapped_column(String(128))
    colorspace_guessed: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class PlateFrame(Base):
    __tablename__ = "plate_frames"
    __table_args__ = (UniqueConstraint("plate_id", "frame"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    plate_id: Mapped[int] = mapped_column(ForeignKey("plates.id", ondelete="CASCADE"))
    frame: Mapped[int] = mapped_column(Integer)
    uri: Mapped[str] = mapped_column(String(2048), default="")  # '' until a worker reads it
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    fingerprint: Mapped[str | None] = mapped_column(String(256))  # size+mtime or S3 ETag
    sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    arch: Mapped[str] = mapped_column(String(128))
    task: Mapped[str] = mapped_column(String(64))
    family: Mapped[str] = mapped_column(String(16), default="sapiens2", server_default="sapiens2")
    path: Mapped[str] = mapped_column(String(2048))
    trained: Mapped[bool] = mapped_column(Boolean)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_shot_created", "shot_id", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    shot_id: Mapped[int] = mapped_column(ForeignKey("shots.id", ondelete="CASCADE"))
    plate_id: Mapped[int] = mapped_column(ForeignKey("plates.id"))
    spec: Mapped[dict[str, Any]]
    submitter: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), index=True)  # see JOB_STATUSES
    flow_run_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    frames_total: Mapped[int] = mapped_column(Integer, default=0)
    frames_done: Mapped[int] = mapped_column(Integer, default=0)
    frames_failed: Mapped[int] = mapped_column(Integer, default=0)
    frames_skipped: Mapped[int] = mapped_column(Integer, default=0)
    message: Mapped[str | None] = mapped_column(Text)
    # Who runs the job (host:pid:start) and when it last said it is alive: a running job
    # whose process is gone is closed by the next job on the same outputs.
    owner: Mapped[str | None] = mapped_column(String(256))
    heartbeat_at: Mapped[datetime | None]
    output_root: Mapped[str | None] = mapped_column(String(2048), index=True)


class JobFrame(Base):
    __tablename__ = "job_frames"
    __table_args__ = (UniqueConstraint("job_id", "frame"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    frame: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))  # see FRAME_STATUSES
    error: Mapped[str | None] = mapped_column(Text)
    timings: Mapped[dict[str, Any]]
    worker: Mapped[str | None] = mapped_column(String(256))
    # the tiles its tiled passes ran and the person gate skipped (NULL: recorded before the
    # gate, or a frame that ran no model)
    tiles_run: Mapped[int | None] = mapped_column(Integer)
    tiles_skipped: Mapped[int | None] = mapped_column(Integer)


class Provenance(Base):
    __tablename__ = "provenance"

    id: Mapped[int] = mapped_column(primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of canonical JSON
    data: Mapped[dict[str, Any]]


class Output(Base):
    __tablename__ = "outputs"
    __table_args__ = (
        UniqueConstraint("uri", "part", "frame", "pass_name"),
        Index("ix_outputs_shot_pass_frame", "shot_id", "pass_name", "frame"),
        # the newest outputs on disk first: the outputs pages, at a studio's size
        Index(
            "ix_outputs_live_newest",
            "created_at",
            "id",
            postgresql_where=text("deletion_id IS NULL"),
            sqlite_where=text("deletion_id IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    shot_id: Mapped[int] = mapped_column(ForeignKey("shots.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    pass_name: Mapped[str] = mapped_column(String(32))
    frame: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # schemas.passes.OUTPUT_KINDS
    uri: Mapped[str] = mapped_column(String(2048))
    part: Mapped[str] = mapped_column(String(128), default="")  # '' = no part, never NULL
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    shape: Mapped[list[Any]]
    dtype: Mapped[str] = mapped_column(String(32))
    cache_key: Mapped[str] = mapped_column(String(64))
    plate_sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    checkpoint_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.id"), index=True)
    provenance_id: Mapped[int] = mapped_column(ForeignKey("provenance.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Temporal QC (tasks/temporal_qc.py): the frame's flicker score for this pass, set on the
    # EXR and Zarr rows once the shot's frames are in; NULL until scored or when recomputed.
    flicker: Mapped[float | None] = mapped_column(Float)
    # how that score was made (tasks.temporal_qc.METHOD); NULL for scores recorded before
    # methods were, which compared each pass where the pixels are
    flicker_method: Mapped[str | None] = mapped_column(String(32))
    # the deletion that removed its file (NULL: on disk); the row stays for provenance
    deletion_id: Mapped[int | None] = mapped_column(ForeignKey("deletions.id"), index=True)


class OutputCheckpoint(Base):
    """Every checkpoint an output depends on (its pass's own one included)."""

    __tablename__ = "outputs_checkpoints"

    output_id: Mapped[int] = mapped_column(
        ForeignKey("outputs.id", ondelete="CASCADE"), primary_key=True
    )
    checkpoint_id: Mapped[int] = mapped_column(
        ForeignKey("checkpoints.id"), primary_key=True, index=True
    )


class OutputSource(Base):
    """The outputs an output was made from, when it was made from outputs rather than by a
    model: a stabilised frame's pass from the per-frame version's outputs of that pass in
    its window of frames (`tasks.stabilise.worker`)."""

    __tablename__ = "output_sources"

    output_id: Mapped[int] = mapped_column(
        ForeignKey("outputs.id", ondelete="CASCADE"), primary_key=True
    )
    source_output_id: Mapped[int] = mapped_column(
        ForeignKey("outputs.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class Deletion(Base):
    """A version of a shot deleted from disk (`tasks.deletion`): its folder, who asked and
    why, when it started and finished (NULL: a delete that was stopped half way, finished by
    running it again), and what it freed. The version's output rows stay, each pointing here,
    so provenance can still name what a later version was made from."""

    __tablename__ = "deletions"

    id: Mapped[int] = mapped_column(primary_key=True)
    shot_id: Mapped[int] = mapped_column(ForeignKey("shots.id", ondelete="CASCADE"), index=True)
    version: Mapped[str] = mapped_column(String(16))
    output_root: Mapped[str] = mapped_column(String(2048), index=True)
    requested_by: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(Text)
    outputs: Mapped[int] = mapped_column(Integer, default=0)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


PUBLISH_STATUSES = ("published", "pending")


class Publish(Base):
    """What a job's outputs became in a production tracker (`publish/`): the tracker's entity
    ids once published, or ``pending`` with the reason (tracker down, login refused) until
    ``svfx publish --pending`` gets it through. One row per job and tracker; the secrets that
    reached the tracker are never stored."""

    __tablename__ = "publishes"
    __table_args__ = (UniqueConstraint("job_id", "tracker"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    shot_id: Mapped[int] = mapped_column(ForeignKey("shots.id", ondelete="CASCADE"), index=True)
    tracker: Mapped[str] = mapped_column(String(16))  # kitsu, shotgrid
    status: Mapped[str] = mapped_column(String(16), index=True)  # see PUBLISH_STATUSES
    code: Mapped[str] = mapped_column(String(256))  # the version's name in the tracker
    entity_ids: Mapped[dict[str, Any]]  # the tracker's ids: project, shot, task, version...
    reason: Mapped[str | None] = mapped_column(Text)  # why it is pending
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    published_at: Mapped[datetime | None]
