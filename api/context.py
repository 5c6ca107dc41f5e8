"""What every request handler needs: settings, the catalog engine, the write token and the
submitter. Built once by ``create_app`` and kept on ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request
from sqlalchemy import Engine

from schemas.settings import Settings

if TYPE_CHECKING:
    from flows.submission import Submitter


@dataclass
class ApiContext:
    settings: Settings
    engine: Engine
    token: str | None  # None: write endpoints disabled
    _submitter: Submitter | None = field(default=None, repr=False)

    def submitter(self) -> Submitter:
        """The submitter given to create_app, else Prefect deployment runs (made on first use,
        so a read-only server never imports Prefect)."""
        if self._submitter is None:
            from flows.submission import DeploymentSubmitter

            self._submitter = DeploymentSubmitter()
        return self._submitter


def context(request: Request) -> ApiContext:
    """FastAPI dependency: the application's ApiContext."""
    ctx: ApiContext = request.app.state.ctx
    return ctx
