"""The JSON read API under ``/api``: shots and their coverage, outputs, jobs, provenance and
what a plate or checkpoint made. Every filter is a typed parameter that reaches the database
as a bound parameter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query

from api import answers
from api.context import ApiContext, context
from api.known_shot import KnownShot
from api.params import (
    FrameQuery,
    JobIdPath,
    KindQuery,
    Limit,
    Offset,
    PassQuery,
    PathQuery,
    PublishStatusQuery,
    SequenceQuery,
    Sha256Query,
    ShotQuery,
    ShowQuery,
    StatusQuery,
    ThresholdQuery,
)
from api.problems import INVALID
from api.responses import (
    Coverage,
    Job,
    Output,
    OutputProvenance,
    Page,
    Problem,
    Publish,
    QcReport,
    ShotDetail,
    Usage,
)
from schemas.catalog import queries

router = APIRouter(prefix="/api", responses=INVALID)
Ctx = Annotated[ApiContext, Depends(context)]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Problem, "description": "unknown"}}
Route = TypeVar("Route", bound=Callable[..., Any])
UsageBy = Annotated[
    Literal["show", "shot", "version", "pass"] | None,
    Query(
        description="one item per show, shot, version folder, or pass of a version folder "
        "(default: by what is named: show, then shot, then version)"
    ),
]


def _get(
    path: str, tag: str, summary: str, model: Any, responses: dict[int | str, Any] | None = None
) -> Callable[[Route], Route]:
    """A GET route of the API, in its OpenAPI tag, answering ``model``."""
    return router.get(path, tags=[tag], summary=summary, response_model=model, responses=responses)


def _about_a_shot(tail: str, tag: str, summary: str, model: Any) -> Callable[[Route], Route]:
    """A GET route under /shots/{show}/{sequence}/{shot}: its KnownShot answers 404."""
    return _get("/shots/{show}/{sequence}/{shot}" + tail, tag, summary, model, NOT_FOUND)


def _threshold(ctx: ApiContext) -> float:
    return ctx.settings.qc_flicker_threshold


@_get("/shots", "shots", "Shots with per-pass coverage", Page[Coverage])
def list_shots(
    ctx: Ctx,
    show: ShowQuery = None,
    sequence: SequenceQuery = None,
    shot: ShotQuery = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> dict[str, Any]:
    """Shots sorted by show, sequence and shot: the newest plate's frame count, per pass the
    frames that have an output, and the newest job's status."""
    return answers.shot_list(ctx.engine, show, sequence, shot, limit, offset)


@_about_a_shot("", "shots", "One shot: coverage, plates, jobs, provenance", ShotDetail)
def get_shot(ctx: Ctx, shot: KnownShot) -> dict[str, Any]:
    """The shot's coverage, its plates, its newest jobs with every failed frame and its
    reason, and the provenance of the newest job's outputs."""
    return answers.shot_detail(ctx.engine, shot, _threshold(ctx))


@_about_a_shot("/outputs", "shots", "A shot's outputs, newest first", Page[Output])
def list_outputs(
    ctx: Ctx,
    shot: KnownShot,
    pass_name: PassQuery = None,
    kind: KindQuery = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    return answers.output_list(ctx.engine, shot, pass_name, kind, limit, offset)


@_about_a_shot("/jobs", "jobs", "A shot's jobs, newest first", Page[Job])
def list_shot_jobs(
    ctx: Ctx,
    shot: KnownShot,
    status: StatusQuery = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> dict[str, Any]:
    return answers.job_list(ctx.engine, shot, status, limit, offset, _threshold(ctx))


@_about_a_shot(
    "/publishes", "shots", "A shot's publishes to production trackers, newest first", Page[Publish]
)
def list_publishes(
    ctx: Ctx,
    shot: KnownShot,
    status: PublishStatusQuery = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> dict[str, Any]:
    """What each job became in Kitsu or ShotGrid (the tracker's entity ids, when), or why
    its publish is pending."""
    return answers.publish_list(ctx.engine, shot, status, limit, offset)


@_about_a_shot(
    "/qc",
    "shots",
    "Temporal QC: flicker scores per pass and frame, and the flagged frames",
    QcReport,
)
def get_qc(ctx: Ctx, shot: KnownShot, threshold: ThresholdQuery = None) -> dict[str, Any]:
    """Per dense pass and frame, the flicker score (how much the pass changed next to its
    neighbouring frames relative to the plate, divided by what is usual for the shot: 1 is
    usual) and whether it is above the threshold (``threshold``, default the
    ``SVFX_QC_FLICKER_THRESHOLD`` setting); ``flagged`` lists the frames above it."""
    limit = threshold if threshold is not None else _threshold(ctx)
    return answers.qc_report(ctx.engine, shot, limit)


@_get("/jobs/{job_id}", "jobs", "One job with its failed frames", Job, NOT_FOUND)
def get_job(ctx: Ctx, job_id: JobIdPath) -> dict[str, Any]:
    job = answers.find_job(ctx.engine, job_id, _threshold(ctx))
    if job is None:
        raise HTTPException(404, f"the catalog has no job {job_id}")
    return job


@_get("/provenance", "provenance", "How an output file was made", OutputProvenance, NOT_FOUND)
def get_provenance(ctx: Ctx, path: PathQuery, frame: FrameQuery = None) -> dict[str, Any]:
    """The outputs stored at ``path`` (one per pass/part/frame) with their checkpoints,
    provenance (platform, torch, CUDA, device, precision, colour transform, tiling), jobs
    and plate frames. ``frame`` narrows a Zarr array to one frame."""
    found = queries.output_provenance(ctx.engine, path, frame)
    if found is None:
        where = f" frame {frame}" if frame is not None else ""
        raise HTTPException(404, f"the catalog knows no output at {path}{where}")
    return found


@_get(
    "/search",
    "provenance",
    "Outputs made from a plate frame or with a checkpoint (no checksum: all outputs)",
    Page[Output],
)
def search(
    ctx: Ctx,
    plate_sha256: Sha256Query = None,
    checkpoint_sha256: Sha256Query = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> dict[str, Any]:
    """What a re-pulled plate frame (its sha256) or a checkpoint (directly, or as an input
    such as seg for pose) made: the outputs it makes stale. Either or both checksums; with
    neither, every output in the catalog, newest first, a page at a time."""
    if plate_sha256 is None and checkpoint_sha256 is None:
        return answers.output_list(ctx.engine, None, None, None, limit, offset)
    plate = plate_sha256.lower() if plate_sha256 else None
    ckpt = checkpoint_sha256.lower() if checkpoint_sha256 else None
    found = queries.invalidated_page(ctx.engine, plate, ckpt, limit=limit, offset=offset)
    return answers.paged(found, limit, offset)


@_get(
    "/usage", "shots", "Bytes and files of the live outputs per show, shot, version, pass", Usage,
    NOT_FOUND,
)  # fmt: skip
def get_usage(
    ctx: Ctx,
    show: ShowQuery = None,
    sequence: SequenceQuery = None,
    shot: ShotQuery = None,
    by: UsageBy = None,
) -> dict[str, Any]:
    """What the outputs still on disk occupy (deleted versions' rows are not counted), from
    the catalog: each file once (a multi-part EXR is one file of all its passes, a Zarr
    array's frame one of its region's uncompressed bytes). Names left out match any; names
    the catalog has no shot under are a 404."""
    named = {"show": show, "sequence": sequence, "shot": shot}
    given = {key: value for key, value in named.items() if value is not None}
    if given and not queries.scope_exists(ctx.engine, show, sequence, shot):
        scope = ", ".join(f"{key} {value}" for key, value in given.items())
        raise HTTPException(404, f"the catalog has no shot with {scope}")
    if by is None:
        by = "version" if shot else "shot" if show else "show"
    level = "version" if by == "pass" else by
    items = queries.usage(ctx.engine, show, sequence, shot, level=level, passes=by == "pass")
    return {
        "by": by,
        "items": items,
        "files": sum(i["files"] for i in items),
        "size_bytes": sum(i["size_bytes"] for i in items),
    }
