"""What a run refuses, and how a refusal looks: errors the user (or operator) can act on,
raised before or instead of work, each already naming the file, frame or service and the
reason. Commands print them in one line and exit 2; flows return them as a failed result,
never as a traceback."""

from __future__ import annotations

import json
from typing import Any

from schemas.catalog.errors import CatalogError, JobConflict
from schemas.spec import SpecError
from storage.errors import StorageError
from tasks.checkpoint_errors import CheckpointChoiceError, CheckpointError


class ClusterError(RuntimeError):
    """The Dask scheduler to use cannot be reached; the message names it."""


REFUSALS = (
    SpecError,
    StorageError,
    CheckpointChoiceError,
    CheckpointError,
    CatalogError,
    JobConflict,
    ClusterError,
)


def refusal(message: str, *, conflict: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run's result when nothing was run: status failed, the reason, no job of its own."""
    result: dict[str, Any] = {
        "job_id": None,
        "status": "failed",
        "error": message,
        "total": 0,
        "done": [],
        "skipped": [],
        "adopted": [],
        "failed": {},
        "exr_pattern": "",
        "zarr": "",
        "extras": {},
        "untrained": [],
    }
    if conflict is not None:  # JSON-safe: the result may be persisted by Prefect
        result["conflict"] = json.loads(json.dumps(conflict, default=str))
    return result
