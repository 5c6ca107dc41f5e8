"""Deleting a version of a shot: its folder (EXRs, Zarr store, previews, review clips, pose
JSON, Nuke script, frame records) removed from local disk or S3, and the catalog told first.

`plan_delete` checks what the catalog knows and refuses, one line each: an unknown shot or
version, a folder outside the allowed roots, a version a live job still writes, and, unless
forced, a version published to a tracker or one another version was made from. `delete`
then marks the version's outputs deleted (one transaction), removes its files and finishes
the deletion's record. Killed at any point, running it again finishes it: the marked outputs
stay marked, the files left are removed, and until then no job may write the folder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from core.errors import SvfxError
from schemas.catalog import queries
from schemas.catalog.lease import owner_alive
from schemas.catalog.models import utcnow
from schemas.catalog.queries.paging import Bind
from schemas.catalog.queries.versions import ACTIVE_STATUSES, Version
from schemas.catalog.writer import Catalog
from schemas.settings import Settings
from schemas.spec import NAME, is_really_under

Progress = Callable[[int, int], None]  # files removed so far, files in all


class DeleteRefused(SvfxError):
    """A delete (or prune) that would remove what it must not, or names nothing."""


class NothingToDelete(DeleteRefused):
    """The shot or version is not in the catalog."""


class OutsideRoots(DeleteRefused):
    """The version's folder lies outside the allowed roots: never deleted."""


class VersionBusy(DeleteRefused):
    """A live job still writes the version."""


class VersionKept(DeleteRefused):
    """Published, or the source of another version: deleted only when forced."""


class DeletionStopped(DeleteRefused):
    """The storage refused to remove a file; running the delete again finishes it."""


@dataclass(frozen=True)
class FileOnDisk:
    uri: str
    size_bytes: int


@dataclass
class DeletionPlan:
    """The folders a delete removes (one per element and family of the version), and what
    ``--force`` let through."""

    versions: list[Version]
    forced: list[str] = field(default_factory=list)  # why each would have been refused
    already_deleted: list[Version] = field(default_factory=list)


@dataclass(frozen=True)
class Deleted:
    version: Version
    files: int
    size_bytes: int  # on disk, as found before removing
    outputs: int  # catalog rows marked deleted


def split_shot_path(shot: str) -> tuple[str, str, str]:
    """SHOW/SEQ/SHOT as three names, each a plain name (no ``..``, no slash)."""
    parts = shot.strip("/").split("/")
    if len(parts) != 3 or not all(NAME.match(p) and p not in (".", "..") for p in parts):
        raise DeleteRefused(f"shot must be SHOW/SEQ/SHOT with plain names, got {shot!r}")
    return parts[0], parts[1], parts[2]


def plan_delete(
    bind: Bind, settings: Settings, shot: str, version: str, *, force: bool = False
) -> DeletionPlan:
    """What deleting ``version`` of ``shot`` removes, or DeleteRefused naming why not."""
    show, sequence, name = split_shot_path(shot)
    versions = queries.shot_versions(bind, show, sequence, name)
    if not versions:
        if not queries.shot_exists(bind, show, sequence, name):
            raise NothingToDelete(f"the catalog has no shot {shot}")
        raise NothingToDelete(f"{shot} has no version in the catalog")
    chosen = [v for v in versions if v.version == version]
    if not chosen:
        known = ", ".join(sorted({v.version for v in versions}))
        raise NothingToDelete(f"{shot} has no version {version} (it has {known})")
    plan = DeletionPlan([v for v in chosen if not _finished(v)])
    plan.already_deleted = [v for v in chosen if _finished(v)]
    for found in plan.versions:
        refuse_unsafe(found, settings)
        if found.deletion is not None:
            continue  # stopped half way: what it was refused for was decided then
        reasons = keep_reasons(found, versions)
        if reasons and not force:
            raise VersionKept(f"{found.name} {found.label}: {reasons[0]}; --force deletes it")
        plan.forced += [f"{found.name} {found.label}: {why}" for why in reasons]
    return plan


def _finished(version: Version) -> bool:
    return version.deletion is not None and version.deletion.finished_at is not None


def refuse_unsafe(version: Version, settings: Settings) -> None:
    """What no ``--force`` lets through: a folder outside the allowed roots, a live job."""
    if not is_really_under(version.folder, settings.roots):
        raise OutsideRoots(
            f"{version.folder} lies outside the allowed roots ({', '.join(settings.roots)}); "
            "nothing outside them is deleted"
        )
    now = utcnow()
    for job in version.jobs:
        alive = job.owner is None or owner_alive(job.owner, job.heartbeat_at, now)
        if job.status in ACTIVE_STATUSES and alive:
            raise VersionBusy(
                f"{version.name} {version.label}: job {job.id} is still {job.status} "
                "(svfx status); wait for it to end"
            )


def keep_reasons(version: Version, shot_versions: list[Version]) -> list[str]:
    """Why the version is worth keeping: published to a tracker, or the source of another
    version still on disk (each a refusal unless forced)."""
    reasons = [
        f"was published to {tracker} as {code!r}" + (" (pending)" if status == "pending" else "")
        for tracker, status, code in version.publishes
    ]
    made = sorted(
        other.label
        for other in shot_versions
        if other.source_version == version.version
        and other.folder != version.folder
        and other.deletion is None
    )
    if made:
        reasons.append(f"{', '.join(made)} was made from it (stabilised)")
    return reasons


def files_of(version: Version, settings: Settings) -> list[FileOnDisk]:
    """Every file under the version's folder now, with its size (none: the folder is gone)."""
    fs, path = settings.location(version.folder).fs_and_path()
    if not fs.exists(path):
        return []
    found = fs.find(path, detail=True)
    return [FileOnDisk(p, int(info.get("size") or 0)) for p, info in sorted(found.items())]


def delete(
    catalog: Catalog,
    settings: Settings,
    version: Version,
    *,
    requested_by: str,
    reason: str,
    progress: Progress | None = None,
) -> Deleted:
    """Mark the version's outputs deleted, remove its folder, finish the record (see the
    module: safe to stop at any point and run again)."""
    files = files_of(version, settings)
    deletion_id, outputs, _bytes = catalog.mark_version_deleted(
        version.shot_id, version.version, version.folder, requested_by, reason
    )
    fs, path = settings.location(version.folder).fs_and_path()
    batch = 500
    try:
        for start in range(0, len(files), batch):
            fs.rm([f.uri for f in files[start : start + batch]])
            if progress is not None:
                progress(min(start + batch, len(files)), len(files))
        if fs.exists(path):
            fs.rm(path, recursive=True)  # what was added meanwhile, and the folders themselves
    except OSError as exc:  # permissions, a storage endpoint away: named, finished by a rerun
        raise DeletionStopped(
            f"{version.folder}: {exc.strerror or exc}; its outputs are marked deleted, the "
            "files left stay until the same `svfx delete` runs again"
        ) from None
    catalog.finish_deletion(deletion_id)
    return Deleted(version, len(files), sum(f.size_bytes for f in files), outputs)
