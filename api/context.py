"""What every request handler needs: settings, the catalog engine, the write token and the
submitter. Built once by ``create_app`` and kept on ``app.state``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request
from sqlalchemy import Engine

from core.errors import SvfxError
from schemas.settings import Settings

if TYPE_CHECKING:
    from flows.submission import Submitter
    from schemas.spec import ShotSpec

NO_ORCHESTRATOR = (
    "no Prefect API is configured, and the API server never starts an orchestrator of its "
    "own: set PREFECT_API_URL where the API server runs to the Prefect server that serves the "
    "process-shot deployment (`svfx serve`), e.g. http://prefect:4200/api, and restart it"
)


class NoOrchestrator(SvfxError, RuntimeError):
    """Submitting needs a configured Prefect API; the message says what to set."""


def prefect_api_url() -> str | None:
    """The Prefect API that submissions go to: PREFECT_API_URL from the environment, else
    Prefect's current settings (a profile). None: none configured, and Prefect would start an
    ephemeral server inside this process (and leave it behind) on the first submit."""
    url = os.environ.get("PREFECT_API_URL", "").strip()
    if url:
        return url
    from prefect.settings import get_current_settings

    configured = get_current_settings().api.url
    return str(configured) if configured else None


class PinnedSubmitter:
    """Runs of the process-shot deployment on the Prefect API at ``url``, whatever Prefect's
    own settings say (they are read once, when Prefect is imported: a PREFECT_API_URL seen
    here but not there would otherwise send the run to an ephemeral server)."""

    def __init__(self, url: str) -> None:
        from flows.submission import DeploymentSubmitter

        self.url = url
        self._runs = DeploymentSubmitter()

    @contextmanager
    def _pinned(self) -> Iterator[None]:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.url}):
            yield

    def in_flight(self) -> dict[str, str]:
        with self._pinned():
            return self._runs.in_flight()

    def submit(self, spec: ShotSpec, *, reason: str) -> str:
        with self._pinned():
            return self._runs.submit(spec, reason=reason)


@dataclass
class ApiContext:
    settings: Settings
    engine: Engine
    token: str | None  # None: write endpoints disabled
    _submitter: Submitter | None = field(default=None, repr=False)

    def submitter(self) -> Submitter:
        """The submitter given to create_app, else runs of the process-shot deployment on the
        configured Prefect API (made on first use, so a read-only server never imports
        Prefect). Raises NoOrchestrator when no Prefect API is configured."""
        if self._submitter is None:
            url = prefect_api_url()
            if not url:
                raise NoOrchestrator(NO_ORCHESTRATOR)
            self._submitter = PinnedSubmitter(url)
        return self._submitter


def context(request: Request) -> ApiContext:
    """FastAPI dependency: the application's ApiContext."""
    ctx: ApiContext = request.app.state.ctx
    return ctx
