"""Images for the pages, never by a caller's path: a preview output by its catalog id, or a
pass's contact sheet at the place ShotLayout gives for the shot's newest job. Either must lie
under the allowed roots and be a JPEG or PNG; it is read through fsspec (local or s3://)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Response
from fsspec import AbstractFileSystem

from api.context import ApiContext, context
from api.params import OutputIdPath, PassPath, SequencePath, ShotPath, ShowPath
from schemas.catalog import queries
from schemas.settings import Settings
from schemas.spec import NAME, is_under
from storage.uri import filesystem_for
from tasks.layout import ShotLayout

router = APIRouter(prefix="/files", tags=["files"])
Ctx = Annotated[ApiContext, Depends(context)]
IMAGE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
SERVED_KINDS = ("preview",)
JOBS_SEARCHED = 20  # newest jobs looked at for one that made the pass
_VERSION = re.compile(r"^v\d{3,4}$")


def media_type(uri: str) -> str | None:
    """The image type of ``uri`` by its suffix, or None for anything that is not served."""
    name = uri.rsplit("/", 1)[-1].lower()
    return next((kind for ext, kind in IMAGE_TYPES.items() if name.endswith(ext)), None)


def servable(settings: Settings, uri: str) -> bool:
    """Whether ``uri`` is an image under the allowed roots (by name only: no file access)."""
    return media_type(uri) is not None and any(is_under(uri, root) for root in settings.roots)


def _servable(settings: Settings, uri: str) -> tuple[AbstractFileSystem, str] | None:
    """(filesystem, path) of an image under the allowed roots, else None."""
    if not servable(settings, uri):
        return None
    return filesystem_for(uri, settings.storage_options_for(uri))


def read_image(settings: Settings, uri: str) -> bytes | None:
    """The bytes of an image under the allowed roots, or None (missing, elsewhere, other)."""
    found = _servable(settings, uri)
    if found is None:
        return None
    fs, path = found
    try:
        return bytes(fs.cat_file(path))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def contact_sheet_uri(
    jobs: list[dict[str, Any]],
    settings: Settings,
    show: str,
    sequence: str,
    shot: str,
    pass_name: str,
) -> str | None:
    """Where the newest of ``jobs`` (newest first) that made ``pass_name`` wrote its contact
    sheet, by ShotLayout from the job's spec (None: no such job)."""
    for job in jobs:
        spec = job["spec"]
        version = str(spec.get("version") or "v001")
        if pass_name in (spec.get("passes") or ()) and _VERSION.match(version):
            root = str(spec.get("output_root") or settings.outputs)
            element = spec.get("element")
            if element is not None and not NAME.match(str(element)):
                continue  # never build a path from a name the spec would refuse
            layout = ShotLayout.for_shot(root, show, sequence, shot, version, element=element)
            return layout.contact_sheet(pass_name)
    return None


def image_exists(settings: Settings, uri: str) -> bool:
    found = _servable(settings, uri)
    return found is not None and bool(found[0].isfile(found[1]))


@router.get(
    "/outputs/{output_id}",
    summary="A preview image by its catalog id",
    response_class=Response,
    responses={200: {"content": {"image/jpeg": {}, "image/png": {}}}, 404: {}},
)
def output_image(
    ctx: Ctx,
    output_id: OutputIdPath,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    found = queries.output_file(ctx.engine, output_id)
    if found is None or found["kind"] not in SERVED_KINDS:
        raise HTTPException(404, f"no preview image with id {output_id}")
    etag = f'"{found["sha256"]}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if if_none_match == etag:
        return Response(status_code=304, headers=headers)
    data = read_image(ctx.settings, found["uri"])
    if data is None:
        raise HTTPException(404, f"preview {output_id} is not readable at {found['uri']}")
    return Response(data, media_type=media_type(found["uri"]), headers=headers)


@router.get(
    "/contact/{show}/{sequence}/{shot}/{pass_name}",
    summary="A pass's contact sheet (newest job that made it)",
    response_class=Response,
    responses={200: {"content": {"image/jpeg": {}}}, 404: {}},
)
def contact_sheet(
    ctx: Ctx, show: ShowPath, sequence: SequencePath, shot: ShotPath, pass_name: PassPath
) -> Response:
    jobs = queries.jobs(ctx.engine, show, sequence, shot, limit=JOBS_SEARCHED)
    uri = contact_sheet_uri(jobs, ctx.settings, show, sequence, shot, pass_name)
    data = read_image(ctx.settings, uri) if uri else None
    if data is None:
        raise HTTPException(404, f"no {pass_name} contact sheet for {show}/{sequence}/{shot}")
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    return Response(data, media_type=media_type(uri or ""), headers=headers)
