"""What the live outputs occupy: bytes and files per show, shot, version folder and pass,
aggregated in the database.

A file is counted once, however many rows describe it: a multi-part EXR has one row per part,
each with the whole file's size, so rows are first grouped by ``(uri, frame)`` (the largest
size of the group: every part records the same). A Zarr array has one row per frame, each
with the bytes of that frame's region as stored uncompressed, so a frame of an array counts as
one "file" of its region's bytes (what Blosc makes of them on disk is ``--verify``'s to say).
An output's version folder is its job's ``output_root`` (resubmits of one folder add up);
outputs of jobs recorded before folders were are grouped by job.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import Select, and_, case, func, select

from schemas.catalog import models as m
from schemas.catalog.queries.by_shot import SHOT_NAMES, filter_shot, join_shot
from schemas.catalog.queries.outputs import LIVE
from schemas.catalog.queries.paging import Bind, Item, reading
from schemas.catalog.queries.versions import folder_label

Level = Literal["show", "shot", "version"]
LEVELS: tuple[Level, ...] = ("show", "shot", "version")
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(size: int) -> str:
    """``size`` in binary units, about three figures: '512 B', '1.50 GiB', '1000 KiB'."""
    value, steps = float(size), 0
    while abs(value) >= 1024 and steps < len(_UNITS) - 1:
        value, steps = value / 1024, steps + 1
    unit = _UNITS[steps]
    decimals = 0 if unit == "B" or abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{decimals}f} {unit}"


def _shot_ids(show: str | None, sequence: str | None, shot: str | None) -> Select[Any]:
    """The ids of the shots with these names (None: any)."""
    stmt = (
        select(m.Shot.id)
        .join(m.Sequence, m.Sequence.id == m.Shot.sequence_id)
        .join(m.Show, m.Show.id == m.Sequence.show_id)
    )
    return filter_shot(stmt, show, sequence, shot)


def scope_exists(
    bind: Bind, show: str | None, sequence: str | None = None, shot: str | None = None
) -> bool:
    """Whether the catalog has a shot with these names (None: any)."""
    with reading(bind) as conn:
        return conn.execute(_shot_ids(show, sequence, shot).limit(1)).first() is not None


def _files(show: str | None, sequence: str | None, shot: str | None) -> Any:
    """One row per live file (a Zarr array: per frame) of the scope: its shot, newest job,
    size, kind, and its pass (None when the file holds several, a multi-part EXR)."""
    out = m.Output
    passes = func.count(out.pass_name.distinct())
    stmt = select(
        out.shot_id,
        func.max(out.job_id).label("job_id"),
        func.max(out.size_bytes).label("size_bytes"),
        func.min(out.kind).label("kind"),
        case((passes == 1, func.min(out.pass_name)), else_=None).label("pass_name"),
    ).where(LIVE)
    if (show, sequence, shot) != (None, None, None):
        stmt = stmt.where(out.shot_id.in_(_shot_ids(show, sequence, shot)))
    return stmt.group_by(out.shot_id, out.uri, out.frame).subquery("files")


def usage(
    bind: Bind,
    show: str | None = None,
    sequence: str | None = None,
    shot: str | None = None,
    level: Level = "version",
    passes: bool = False,
) -> list[Item]:
    """Bytes and files of the live outputs of the named show/sequence/shot (None: any), one
    item per show, shot or version folder (``level``), each split per pass and kind with
    ``passes``. Keys: show, and by level sequence, shot, output_root, folder (relative to the
    shot's folder: ``sapiens2_v001``, ``bg01/sapiens2_v001``), version (the spec's), job_id
    (the folder's newest job); pass_name (None: files holding several passes) and kind;
    files, size_bytes. Sorted by those names."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    files = _files(show, sequence, shot)
    keys: list[Any] = [SHOT_NAMES[0]] if level == "show" else [*SHOT_NAMES]
    stmt = select().select_from(files)
    stmt = join_shot(stmt, files.c.shot_id)
    if level == "version":
        stmt, version_keys = _by_folder(stmt, files)
        keys += version_keys
    if passes:
        keys += [files.c.pass_name, files.c.kind]
    totals = (func.count().label("files"), func.sum(files.c.size_bytes).label("size_bytes"))
    stmt = stmt.add_columns(*keys, *totals).group_by(*keys).order_by(*keys)
    with reading(bind) as conn:
        rows = [dict(r._mapping) for r in conn.execute(stmt)]
    if level == "version":
        return _with_versions(bind, rows)
    return [{**row, "size_bytes": int(row["size_bytes"] or 0)} for row in rows]


def _by_folder(stmt: Select[Any], files: Any) -> tuple[Select[Any], list[Any]]:
    """``stmt`` joined to each file's job, and the keys of its version folder: the job's
    output root, or the job itself when it recorded none."""
    job = m.Job
    stmt = stmt.join(job, job.id == files.c.job_id)
    no_folder = case((job.output_root.is_(None), job.id), else_=None).label("folderless_job")
    return stmt, [job.output_root, no_folder]


def _with_versions(bind: Bind, rows: list[Item]) -> list[Item]:
    """Version rows with each folder's newest job, its spec's version and the folder's name
    relative to its shot's (one query for all the folders)."""
    roots = sorted({row["output_root"] for row in rows if row["output_root"] is not None})
    newest = _newest_jobs(bind, roots)
    folderless = [row["folderless_job"] for row in rows if row["folderless_job"] is not None]
    versions = _spec_versions(bind, [*newest.values(), *folderless])
    items = []
    for row in rows:
        root, job_id = row.pop("output_root"), row.pop("folderless_job")
        job_id = newest[root] if root is not None else job_id
        items.append(
            {
                **row,
                "output_root": root,
                "folder": (
                    folder_label(root, row["show"], row["sequence"], row["shot"])
                    if root
                    else f"(job {job_id})"
                ),
                "version": versions.get(job_id),
                "job_id": job_id,
                "size_bytes": int(row["size_bytes"] or 0),
            }
        )
    return items


def _newest_jobs(bind: Bind, roots: list[str]) -> dict[str, int]:
    """Output root -> the newest job that wrote it."""
    if not roots:
        return {}
    stmt = (
        select(m.Job.output_root, func.max(m.Job.id))
        .where(m.Job.output_root.in_(roots))
        .group_by(m.Job.output_root)
    )
    with reading(bind) as conn:
        return {root: int(job_id) for root, job_id in conn.execute(stmt)}


def _spec_versions(bind: Bind, job_ids: list[int]) -> dict[int, str | None]:
    """Job id -> its spec's version."""
    if not job_ids:
        return {}
    version = m.Job.spec["version"].as_string()
    stmt = select(m.Job.id, version).where(m.Job.id.in_(sorted(set(job_ids))))
    with reading(bind) as conn:
        return {int(job_id): value for job_id, value in conn.execute(stmt)}


def version_files(bind: Bind, output_root: str) -> list[Item]:
    """The live files the catalog knows in a version folder (outputs of the jobs that wrote
    it), one item per URI: kind, frames (a Zarr array: the frames it holds), size_bytes (a
    Zarr array: its frames' regions uncompressed). Sorted by URI."""
    out = m.Output
    per_frame = (
        select(
            out.uri,
            out.frame,
            func.min(out.kind).label("kind"),
            func.max(out.size_bytes).label("size_bytes"),
        )
        .join(m.Job, m.Job.id == out.job_id)
        .where(and_(m.Job.output_root == output_root, LIVE))
        .group_by(out.uri, out.frame)
        .subquery()
    )
    stmt = (
        select(
            per_frame.c.uri,
            func.min(per_frame.c.kind).label("kind"),
            func.count().label("frames"),
            func.sum(per_frame.c.size_bytes).label("size_bytes"),
        )
        .group_by(per_frame.c.uri)
        .order_by(per_frame.c.uri)
    )
    with reading(bind) as conn:
        return [
            {**dict(r._mapping), "size_bytes": int(r.size_bytes or 0)} for r in conn.execute(stmt)
        ]
