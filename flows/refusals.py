"""How a refusal looks: a run refuses with an error the user (or operator) can act on
(`core.errors.SvfxError`), raised before or instead of work, already naming the file, frame or
service and the reason. Commands print it in one line and exit with its code; flows return it
as a failed result (`refusal`), never as a traceback."""

from __future__ import annotations

import json
from typing import Any

from core.errors import SvfxError


class ClusterError(SvfxError, RuntimeError):
    """The Dask scheduler to use cannot be reached; the message names it."""


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
