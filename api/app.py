"""The catalog's web application: ``create_app`` wires settings, the catalog engine, the write
token and the submitter into the JSON API, the file routes and the pages; ``run_api`` serves
it with uvicorn (``svfx api --host H --port P``).

The OpenAPI description is at ``/openapi.json``. Swagger UI and ReDoc are off: they load
their scripts from a CDN, and nothing here may reach the internet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI
from sqlalchemy import Engine

from api import files, pages, read, write
from api.context import ApiContext
from schemas.settings import Settings, load_settings

if TYPE_CHECKING:
    from flows.submission import Submitter

TAGS = [
    {"name": "shots", "description": "Shots, their coverage per pass and their outputs."},
    {"name": "jobs", "description": "Jobs with their status and failed frames (and why)."},
    {"name": "provenance", "description": "How a file was made; what a plate or model made."},
    {"name": "submit", "description": "Submit shots and retry failed frames (bearer token)."},
    {"name": "files", "description": "Preview images and contact sheets, by catalog id."},
]


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    submitter: Submitter | None = None,
    token: str | None = None,
) -> FastAPI:
    """The application over the catalog in ``settings`` (or ``engine``).

    ``token`` (default: ``settings.api_token``, i.e. SVFX_API_TOKEN) guards the write
    endpoints; without one they answer 403. ``submitter`` (default: runs of the served
    process-shot deployment) receives submitted and retried shots.
    """
    from tasks import platform_version

    settings = settings or load_settings()
    if engine is None:
        from schemas.catalog import open_catalog

        engine = open_catalog(settings.catalog).engine
    app = FastAPI(
        title="svfx catalog",
        version=platform_version(),
        description="What was made for each shot, from what, and whether it is complete.",
        openapi_tags=TAGS,
        docs_url=None,
        redoc_url=None,
    )
    secret = token if token is not None else settings.api_token
    app.state.ctx = ApiContext(settings, engine, secret or None, submitter)
    for module in (read, write, files, pages):
        app.include_router(module.router)
    write.document_spec_body(app)
    return app


def run_api(host: str = "127.0.0.1", port: int = 8000, settings: Settings | None = None) -> None:
    """Serve the API and pages with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
