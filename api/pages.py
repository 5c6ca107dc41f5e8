"""Server-rendered pages (Jinja2, inline CSS, no scripts, nothing fetched from elsewhere):
``/`` lists shows and shots with per-pass coverage, ``/shots/{show}/{seq}/{shot}`` shows one
shot's contact sheets, thumbnails, jobs, failed frames, provenance and what each version
occupies, ``/usage`` what each show (or each shot of one show) occupies."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates

from api import answers
from api.context import ApiContext, context
from api.files import contact_sheet_uri, image_exists, servable
from api.known_shot import KnownShot, UnknownShot
from api.params import Limit, Offset, ShowQuery
from api.qc_chart import flicker_chart
from schemas.catalog import queries
from schemas.catalog.queries.usage import human_bytes
from schemas.passes import PASS_NAMES

router = APIRouter(include_in_schema=False)
Ctx = Annotated[ApiContext, Depends(context)]
templates = Jinja2Templates(directory=Path(__file__).resolve().parent / "templates")
THUMBS_PER_PASS = 8
# Pages load images from this server only, run no scripts and post forms only here.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
}


def _when(value: str | None) -> str:
    return f"{value[:19].replace('T', ' ')} UTC" if value else ""


templates.env.filters["when"] = _when
templates.env.filters["bytes"] = human_bytes


def pass_order(names: set[str]) -> list[str]:
    """Known passes in pipeline order, then any others by name."""
    return [p for p in PASS_NAMES if p in names] + sorted(names - set(PASS_NAMES))


def _provenance_view(record: Mapping[str, Any]) -> dict[str, Any]:
    """Split a provenance record for display: environment values, checkpoints per pass, the
    colour transform and the tiling."""
    data = dict(record["data"])
    nested = {k: data.pop(k) for k in ("checkpoints", "colour", "tiling") if k in data}
    environment = {k: v for k, v in data.items() if not isinstance(v, dict | list)}
    return {"digest": record["digest"], "environment": environment, **nested}


@router.get("/", response_class=HTMLResponse)
def index(
    request: Request, ctx: Ctx, show: ShowQuery = None, limit: Limit = 100, offset: Offset = 0
) -> HTMLResponse:
    listing = answers.shot_list(ctx.engine, show, None, None, limit, offset)
    passes = pass_order({p for item in listing["items"] for p in item["passes"]})
    context = {
        "listing": listing,
        "passes": passes,
        "shows": queries.show_names(ctx.engine),
        "show": show,
    }
    return templates.TemplateResponse(request, "index.html", context, headers=HEADERS)


@router.get("/shots/{show}/{sequence}/{shot}", response_class=HTMLResponse)
def shot_page(request: Request, ctx: Ctx, shot: KnownShot) -> HTMLResponse:
    engine = ctx.engine
    threshold = ctx.settings.qc_flicker_threshold
    detail = answers.shot_detail(engine, shot, threshold)
    thumbs: dict[str, list[dict[str, Any]]] = {}
    for preview in queries.preview_outputs(engine, *shot, THUMBS_PER_PASS):
        if servable(ctx.settings, preview["uri"]):  # else /files would refuse it
            thumbs.setdefault(preview["pass_name"], []).append(preview)
    passes = pass_order(set(thumbs) | set(detail["coverage"]["passes"]))
    sheets = {}
    for name in passes:
        uri = contact_sheet_uri(detail["jobs"], ctx.settings, *shot, name)
        sheets[name] = uri is not None and image_exists(ctx.settings, uri)
    qc = answers.qc_report(engine, shot, threshold)
    for scores in [s for versions in qc["versions"].values() for s in versions.values()]:
        for score in scores:  # only flagged frames link, and only where /files would serve
            uri = score["preview_uri"] if score["flagged"] else None
            if uri is None or not servable(ctx.settings, uri):
                score["preview_id"] = None
    context = {
        "d": detail,
        "passes": passes,
        "thumbs": thumbs,
        "sheets": sheets,
        "provenance": [_provenance_view(p) for p in detail["provenance"]],
        "qc": qc,
        "usage": _versions(queries.usage(engine, *shot, level="version", passes=True)),
        "charts": {
            name: flicker_chart(name, versions, threshold)
            for name, versions in qc["versions"].items()
        },
    }
    return templates.TemplateResponse(request, "shot.html", context, headers=HEADERS)


def _versions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-pass usage rows of a shot grouped by version folder: folder, version, files,
    size_bytes and its rows (``passes``)."""
    versions: dict[str, dict[str, Any]] = {}
    for row in rows:
        folder = versions.setdefault(
            row["folder"],
            {"folder": row["folder"], "version": row["version"], "files": 0, "size_bytes": 0},
        )
        folder.setdefault("passes", []).append(row)
        folder["files"] += row["files"]
        folder["size_bytes"] += row["size_bytes"]
    return list(versions.values())


@router.get("/usage", response_class=HTMLResponse)
def usage_page(request: Request, ctx: Ctx, show: ShowQuery = None) -> HTMLResponse:
    """What the live outputs occupy: per show, or per shot of ``show``."""
    level = "shot" if show else "show"
    rows = queries.usage(ctx.engine, show, level=level)
    context = {
        "rows": rows,
        "show": show,
        "level": level,
        "total": sum(row["size_bytes"] for row in rows),
        "files": sum(row["files"] for row in rows),
    }
    return templates.TemplateResponse(request, "usage.html", context, headers=HEADERS)


async def unknown_shot(request: Request, exc: Exception) -> Response:
    """Exception handler for UnknownShot (KnownShot's refusal): on a page, the pages' own 404
    page; on any other route, the Problem FastAPI makes of it."""
    if not isinstance(exc, UnknownShot):
        raise exc
    endpoint = getattr(request.scope.get("route"), "endpoint", None)
    if endpoint not in {route.endpoint for route in router.routes if isinstance(route, APIRoute)}:
        return await http_exception_handler(request, exc)
    missing = {"what": f"shot {exc.key}"}
    return templates.TemplateResponse(
        request, "missing.html", missing, status_code=404, headers=HEADERS
    )
