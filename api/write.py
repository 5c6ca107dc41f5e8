"""Write endpoints (behind the bearer token): submit a shot, retry a job's failed frames.
Both validate a ShotSpec as ``svfx submit`` does (names, passes, frames, paths under the
allowed roots) and hand it to the submitter (Prefect deployment runs by default)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import fileseq
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from api import views
from api.auth import require_writer
from api.context import ApiContext, context
from api.params import JobIdPath
from api.responses import Problem, Submitted
from schemas.spec import ShotSpec, SpecError, check_paths, parse_spec

router = APIRouter(prefix="/api", dependencies=[Depends(require_writer)])
Ctx = Annotated[ApiContext, Depends(context)]
REFUSALS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "no bearer token"},
    403: {"model": Problem, "description": "wrong token, or writes disabled"},
    422: {"model": Problem, "description": "the spec is invalid (every problem listed)"},
}
SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ShotSpec"}}},
    }
}


def _checked(ctx: ApiContext, data: dict[str, Any]) -> ShotSpec:
    """The spec validated and its paths checked against the allowed roots; 422 otherwise."""
    try:
        spec = parse_spec(data)
    except SpecError as exc:
        raise HTTPException(422, str(exc)) from None
    settings = ctx.settings
    problems = check_paths(spec, settings.roots, settings.outputs)
    if problems:
        raise HTTPException(422, "refused:\n  " + "\n  ".join(problems))
    return spec


def _submit(ctx: ApiContext, spec: ShotSpec, reason: str) -> str:
    try:
        return ctx.submitter().submit(spec, reason=reason)
    except Exception as exc:  # Prefect unreachable, deployment missing, ...
        raise HTTPException(503, f"could not submit {spec.shot_path}: {exc}") from exc


@router.post(
    "/shots",
    tags=["submit"],
    summary="Submit a shot",
    status_code=202,
    response_model=Submitted,
    responses=REFUSALS,
    openapi_extra=SPEC_BODY,
)
async def submit_shot(request: Request, ctx: Ctx) -> Submitted:
    """Validate a ShotSpec (JSON body) and start a run of process-shot; 202 with its run id."""
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HTTPException(422, "the body is not JSON: send a ShotSpec object") from None
    if not isinstance(data, dict):
        raise HTTPException(422, "the body must be a JSON object (a ShotSpec)")
    spec = _checked(ctx, data)
    run_id = await run_in_threadpool(_submit, ctx, spec, "submitted through the API")
    return Submitted(run_id=run_id, shot=spec.shot_path, frames=spec.frames)


@router.post(
    "/jobs/{job_id}/retry",
    tags=["submit"],
    summary="Retry a job's failed frames",
    status_code=202,
    response_model=Submitted,
    responses={
        **REFUSALS,
        404: {"model": Problem, "description": "no such job"},
        409: {"model": Problem, "description": "the job has no failed frames"},
    },
)
def retry_job(ctx: Ctx, job_id: JobIdPath) -> Submitted:
    """Submit the job's spec again, restricted to the frames that failed."""
    job = views.find_job(ctx.engine, job_id)
    if job is None:
        raise HTTPException(404, f"the catalog has no job {job_id}")
    failed = sorted({f["frame"] for f in job["failed_frames"]})
    if not failed:
        raise HTTPException(409, f"job {job_id} has no failed frames to retry")
    frames = fileseq.framesToFrameRange(failed, sort=True, compress=False)
    spec = _checked(ctx, {**job["spec"], "frames": frames})
    run_id = _submit(ctx, spec, f"retry of job {job_id}, frames {frames}")
    return Submitted(run_id=run_id, shot=spec.shot_path, frames=spec.frames, retry_of=job_id)


def document_spec_body(app: FastAPI) -> None:
    """Publish ShotSpec's JSON schema in the OpenAPI components (the submit route reads its
    body itself, so that a bad spec gets parse_spec's readable 422)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        spec = ShotSpec.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(spec.pop("$defs", {}))
        components["ShotSpec"] = spec
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
