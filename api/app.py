"""The catalog's web application: ``create_app`` wires settings, the catalog engine, the write
token and the submitter into the JSON API, the file routes and the pages; ``run_api`` serves
it with uvicorn (``svfx api --host H --port P --workers N``).

The OpenAPI description is at ``/openapi.json``. Swagger UI and ReDoc are off: they load
their scripts from a CDN, and nothing here may reach the internet.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from sqlalchemy import Engine
from starlette.routing import Route

from api import deletion, files, pages, read, write
from api.context import ApiContext
from api.known_shot import UnknownShot
from api.methods import MethodsPerPath
from api.problems import validation_problem
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
# run_api hands its settings to uvicorn's worker processes as JSON in this variable.
WORKER_SETTINGS = "SVFX_API_WORKER_SETTINGS"


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
    from tasks.provenance import platform_version

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
    routers = [module.router for module in (read, write, deletion, files, pages)]
    for router in routers:
        app.include_router(router)
    app.add_exception_handler(RequestValidationError, validation_problem)
    app.add_exception_handler(UnknownShot, pages.unknown_shot)
    own_routes = [route for route in app.routes if isinstance(route, Route)]  # /openapi.json
    app.add_middleware(
        MethodsPerPath, routes=[*own_routes, *(r for router in routers for r in router.routes)]
    )
    write.document_spec_body(app)
    return app


def app_from_environment() -> FastAPI:
    """uvicorn's factory in each worker process (``api.app:app_from_environment``): the app
    over the settings run_api was given, else over the environment and svfx.toml."""
    given = os.environ.get(WORKER_SETTINGS)
    return create_app(Settings.model_validate_json(given) if given else load_settings())


def run_api(
    host: str = "127.0.0.1",
    port: int = 8000,
    settings: Settings | None = None,
    workers: int = 1,
) -> None:
    """Serve the API and pages with uvicorn until interrupted, in ``workers`` processes.

    uvicorn starts worker processes from an import string: each builds its own app with
    ``app_from_environment``. The catalog is opened (and migrated) here first, once, so that
    the workers do not race to migrate it."""
    import uvicorn

    if workers < 1:
        raise ValueError(f"workers must be 1 or more, not {workers}")
    if workers == 1:
        uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
        return
    from schemas.catalog import open_catalog

    settings = settings or load_settings()
    open_catalog(settings.catalog).close()
    os.environ[WORKER_SETTINGS] = settings.model_dump_json()
    uvicorn.run(
        f"{__name__}:{app_from_environment.__name__}",
        factory=True,
        workers=workers,
        host=host,
        port=port,
        log_level="info",
    )
