"""Deleting a version through the API (behind the bearer token) and from the shot page (a
form that carries the token; the pages run no script). Both do what `svfx delete` does
(`tasks.deletion`): the same plan, the same refusals, the same record."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from api.auth import check_token, require_writer
from api.context import ApiContext, context
from api.known_shot import KnownShot, ShotKey
from api.pages import HEADERS, templates
from api.responses import Problem
from core.errors import SvfxError
from schemas.catalog.errors import VersionStillRunning
from schemas.catalog.writer import Catalog
from schemas.spec import VERSION_PATTERN
from tasks.deletion import (
    DeletionStopped,
    NothingToDelete,
    OutsideRoots,
    VersionBusy,
    VersionKept,
    delete,
    files_of,
    plan_delete,
)

router = APIRouter()
Ctx = Annotated[ApiContext, Depends(context)]
VersionPath = Annotated[
    str, Path(pattern=f"^{VERSION_PATTERN}$", description="the output version, e.g. v002")
]
# A refusal's HTTP status by its kind; any other refusal is a 422.
STATUS = {
    NothingToDelete: 404,
    OutsideRoots: 403,
    VersionBusy: 409,
    VersionKept: 409,
    DeletionStopped: 503,
}


class DeletedFolder(BaseModel):
    folder: str = Field(description="the version's folder inside the shot's, e.g. sapiens2_v002")
    uri: str
    files: int = Field(description="files removed (or that would be, on a dry run)")
    size_bytes: int = Field(description="their bytes on disk")
    outputs: int = Field(description="catalog outputs marked deleted (kept for provenance)")
    status: str = Field(description="deleted, or 'would be deleted' on a dry run")


class Deletion(BaseModel):
    shot: str
    version: str
    dry_run: bool
    folders: list[DeletedFolder]
    forced: list[str] = Field(description="what --force let through (published, a source)")
    already_deleted: list[str] = Field(description="folders of the version deleted before")


def delete_version(
    ctx: ApiContext, shot: ShotKey, version: str, *, dry_run: bool, force: bool, who: str
) -> Deletion:
    """The version deleted (or its plan, on a dry run); HTTPException naming a refusal."""
    try:
        plan = plan_delete(ctx.engine, ctx.settings, str(shot), version, force=force)
        folders = []
        for found in plan.versions:
            if dry_run:
                files = files_of(found, ctx.settings)
                size = sum(f.size_bytes for f in files)
                done = (len(files), size, found.outputs, "would be deleted")
            else:
                why = "delete --force" if force else "delete"
                gone = delete(
                    Catalog(ctx.engine), ctx.settings, found, requested_by=who, reason=why
                )
                done = (gone.files, gone.size_bytes, gone.outputs, "deleted")
            folders.append(DeletedFolder(folder=found.label, uri=found.folder, **_named(done)))
    except VersionStillRunning as exc:
        raise HTTPException(409, str(exc)) from None
    except SvfxError as exc:
        raise HTTPException(STATUS.get(type(exc), 422), str(exc)) from None
    already = [v.label for v in plan.already_deleted]
    return Deletion(
        shot=str(shot),
        version=version,
        dry_run=dry_run,
        folders=folders,
        forced=plan.forced,
        already_deleted=already,
    )


def _named(done: tuple[int, int, int, str]) -> dict[str, Any]:
    return dict(zip(("files", "size_bytes", "outputs", "status"), done, strict=True))


def _who(request: Request, through: str) -> str:
    client = request.client.host if request.client else "unknown"
    return f"{through} from {client}"


@router.delete(
    "/api/shots/{show}/{sequence}/{shot}/versions/{version}",
    tags=["shots"],
    summary="Delete a version of a shot",
    response_model=Deletion,
    dependencies=[Depends(require_writer)],
    responses={
        401: {"model": Problem, "description": "no bearer token"},
        403: {"model": Problem, "description": "wrong token, or a folder outside the roots"},
        404: {"model": Problem, "description": "no such shot or version"},
        422: {"model": Problem, "description": "a path or query parameter is invalid (named)"},
        503: {"model": Problem, "description": "the storage refused a file; run it again"},
        409: {
            "model": Problem,
            "description": "a job still runs it; or it was published, or "
            "another version was made from it (force deletes those)",
        },
    },
)
def delete_route(
    request: Request,
    ctx: Ctx,
    shot: KnownShot,
    version: VersionPath,
    dry_run: Annotated[bool, Query(description="list what would go; delete nothing")] = False,
    force: Annotated[bool, Query(description="delete a published version or a source")] = False,
) -> Deletion:
    """Remove the version's files (EXRs, Zarr store, previews, review clips, pose JSON, Nuke
    script) and mark its outputs deleted in the catalog, as `svfx delete` does."""
    return delete_version(
        ctx, shot, version, dry_run=dry_run, force=force, who=_who(request, "API token")
    )


@router.post(
    "/shots/{show}/{sequence}/{shot}/delete",
    response_class=HTMLResponse,
    include_in_schema=False,
)
def delete_form(
    request: Request,
    ctx: Ctx,
    shot: KnownShot,
    version: Annotated[str, Form(pattern=f"^{VERSION_PATTERN}$")],
    token: Annotated[str, Form()] = "",
    dry_run: Annotated[bool, Form()] = False,
    force: Annotated[bool, Form()] = False,
) -> HTMLResponse:
    """The shot page's delete form: the API's answer, as a page."""
    context: dict[str, Any] = {"shot": str(shot), "version": version}
    status = 200
    try:
        check_token(ctx, token)
        context["result"] = delete_version(
            ctx, shot, version, dry_run=dry_run, force=force, who=_who(request, "shot page")
        )
    except HTTPException as exc:
        context["refused"], status = exc.detail, exc.status_code
    return templates.TemplateResponse(
        request, "deleted.html", context, status_code=status, headers=HEADERS
    )
