"""Write endpoints (behind the bearer token): submit a shot, retry a job's failed frames.
Both validate a ShotSpec as ``svfx submit`` does (names, passes, frames, paths under the
allowed roots) and hand it to the submitter (Prefect deployment runs by default)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import fileseq
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api import answers
from api.auth import require_writer
from api.body import MAX_BODY_BYTES, parse_json, read_bounded
from api.context import ApiContext, NoOrchestrator, context
from api.params import JobIdPath
from api.problems import reason
from api.responses import Problem, Submitted
from api.spec_body import SpecBody, schema_problems
from schemas.spec import ShotSpec, SpecError, check_paths, parse_spec

router = APIRouter(prefix="/api", dependencies=[Depends(require_writer)])
Ctx = Annotated[ApiContext, Depends(context)]
REFUSALS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "no bearer token"},
    403: {
        "model": Problem,
        "description": "wrong token, writes disabled, or a path outside the allowed roots",
    },
    422: {"model": Problem, "description": "the spec or a parameter is invalid (each named)"},
    503: {"model": Problem, "description": "no orchestrator to submit to (and why)"},
}
SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ShotSpec"}}},
    }
}
Route = TypeVar("Route", bound=Callable[..., Any])


def _starts_a_run(
    path: str, summary: str, responses: dict[int | str, Any], **more: Any
) -> Callable[[Route], Route]:
    """A POST route that starts a run: 202 with what was submitted, else one of the refusals
    (and ``responses``)."""
    return router.post(
        path,
        tags=["submit"],
        summary=summary,
        status_code=202,
        response_model=Submitted,
        responses={**REFUSALS, **responses},
        **more,
    )


def _checked(ctx: ApiContext, data: dict[str, Any], *, published: bool = False) -> ShotSpec:
    """The spec validated (422 naming every problem) and its paths checked against the allowed
    roots (403: a deployment's policy, not a malformed spec). ``published``: also hold the
    body to the rules the OpenAPI document states (SpecBody)."""
    try:
        if published:
            data = SpecBody.model_validate(data).model_dump(mode="json")
        spec = parse_spec(data)
    except SpecError as exc:
        raise HTTPException(422, str(exc)) from None
    except ValidationError as exc:
        raise HTTPException(422, schema_problems(exc)) from None
    settings = ctx.settings
    problems = check_paths(spec, settings.roots, settings.outputs)
    if problems:
        raise HTTPException(403, "refused:\n  " + "\n  ".join(problems))
    return spec


def _submit(ctx: ApiContext, spec: ShotSpec, why: str) -> str:
    try:
        submitter = ctx.submitter()
    except NoOrchestrator as exc:
        raise HTTPException(503, f"could not submit {spec.shot_path}: {exc}") from None
    try:
        return submitter.submit(spec, reason=why)
    except Exception as exc:  # Prefect unreachable, deployment missing, ...
        raise HTTPException(503, f"could not submit {spec.shot_path}: {reason(exc)}") from exc


@_starts_a_run(
    "/shots",
    "Submit a shot",
    {413: {"model": Problem, "description": f"the body is over {MAX_BODY_BYTES} bytes"}},
    openapi_extra=SPEC_BODY,
)
async def submit_shot(request: Request, ctx: Ctx) -> Submitted:
    """Validate a ShotSpec (JSON body, at most 1 MiB, nested at most 32 deep) and start a run
    of process-shot; 202 with its run id."""
    data = parse_json(await read_bounded(request))
    if not isinstance(data, dict):
        raise HTTPException(422, "the body must be a JSON object (a ShotSpec)")
    spec = _checked(ctx, data, published=True)
    run_id = await run_in_threadpool(_submit, ctx, spec, "submitted through the API")
    return Submitted(run_id=run_id, shot=spec.shot_path, frames=spec.frames)


@_starts_a_run(
    "/jobs/{job_id}/retry",
    "Retry a job's failed frames",
    {
        404: {"model": Problem, "description": "no such job"},
        409: {"model": Problem, "description": "the job has no failed frames"},
    },
)
def retry_job(ctx: Ctx, job_id: JobIdPath) -> Submitted:
    """Submit the job's spec again, restricted to the frames that failed."""
    job = answers.find_job(ctx.engine, job_id, ctx.settings.qc_flicker_threshold)
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
    """Publish the body's JSON schema (SpecBody: ShotSpec with its rules stated) as the
    ShotSpec component (the submit route reads its body itself, with bounds, so that a bad spec
    gets parse_spec's readable 422)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        spec = SpecBody.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(spec.pop("$defs", {}))
        components["ShotSpec"] = {**spec, "title": "ShotSpec"}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
