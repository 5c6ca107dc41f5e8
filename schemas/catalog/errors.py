"""What can go wrong with the catalog that a user or operator can act on. Each names the
catalog (its file, or its URL without the password) and what to do."""

from __future__ import annotations

from typing import Any

from core.errors import SvfxError


class CatalogError(SvfxError):
    """The catalog cannot be used; ``where`` names it."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"catalog {where}: {reason}")


class CatalogUnavailable(CatalogError):
    """The database stayed unreachable (or locked) past the retry deadline."""


class CatalogDamaged(CatalogError):
    """The database is not a usable catalog: corrupt, truncated, wiped or replaced."""


class JobConflict(SvfxError):
    """Another live job is writing the same outputs; ``job`` is its catalog row."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        super().__init__(
            f"job {job['id']} is already running {job['show']}/{job['sequence']}/{job['shot']} "
            f"into {job['output_root']} (started {job['started_at']} by {job['submitter']} "
            f"on {job['owner']}); two jobs writing one output folder would undo each other"
        )


class VersionBeingDeleted(SvfxError):
    """A job was asked to write a folder whose deletion has not finished."""

    def __init__(self, folder: str, deletion_id: int) -> None:
        super().__init__(
            f"{folder} is being deleted (deletion {deletion_id} stopped before it finished): "
            "run the same `svfx delete` again to finish it, then submit"
        )


class VersionStillRunning(SvfxError):
    """A live job still writes the version that was to be deleted."""

    def __init__(self, folder: str, job_id: int) -> None:
        super().__init__(
            f"job {job_id} is still writing {folder}: wait for it to end (svfx status) "
            "before deleting the version"
        )
