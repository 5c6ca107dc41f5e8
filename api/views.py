"""The answers the JSON routes and the pages share, assembled from ``schemas.catalog.queries``:
pages of shots and jobs with their totals, a shot's detail, which jobs used untrained models."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from schemas.catalog import queries

JOBS_ON_SHOT = 20  # newest jobs shown with a shot (all of them: the shot's /jobs route)


def page(items: list[dict[str, Any]], total: int, limit: int, offset: int) -> dict[str, Any]:
    return {"items": items, "total": total, "limit": limit, "offset": offset}


def _total(items: list[Any], limit: int, offset: int, count: Any) -> int:
    """The total behind a page; a short first page is the whole list (no COUNT needed)."""
    if offset == 0 and len(items) < limit:
        return len(items)
    return int(count())


def mark_untrained(engine: Engine, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set each job's ``untrained`` flag (outputs from random-weight checkpoints)."""
    untrained = queries.untrained_jobs(engine, [j["id"] for j in jobs])
    for job in jobs:
        job["untrained"] = job["id"] in untrained
    return jobs


def shot_list(
    engine: Engine,
    show: str | None,
    sequence: str | None,
    shot: str | None,
    limit: int,
    offset: int,
) -> dict[str, Any]:
    """A page of shots with per-pass coverage, the newest job's status and untrained flag."""
    items = queries.shot_coverage(engine, show, sequence, shot, limit=limit, offset=offset)
    total = _total(items, limit, offset, lambda: queries.count_shots(engine, show, sequence, shot))
    untrained = queries.untrained_jobs(engine, [i["job_id"] for i in items if i["job_id"]])
    for item in items:
        item["untrained"] = item["job_id"] in untrained
    return page(items, total, limit, offset)


def job_list(
    engine: Engine,
    show: str | None,
    sequence: str | None,
    shot: str | None,
    status: str | None,
    limit: int,
    offset: int,
    threshold: float = queries.DEFAULT_FLICKER_THRESHOLD,
) -> dict[str, Any]:
    """A page of jobs, newest first, with failed and flagged frames and untrained flags."""
    items = queries.jobs(
        engine,
        show,
        sequence,
        shot,
        status=status,
        limit=limit,
        offset=offset,
        flicker_threshold=threshold,
    )
    total = _total(
        items, limit, offset, lambda: queries.count_jobs(engine, show, sequence, shot, status)
    )
    return page(mark_untrained(engine, items), total, limit, offset)


def all_outputs(engine: Engine, limit: int, offset: int) -> dict[str, Any]:
    """A page of every output in the catalog, newest first (the shot query with no shot)."""
    anywhere: Any = None  # the shot filters take None for "any" (queries.filter_shot)
    items = queries.shot_outputs(engine, anywhere, anywhere, anywhere, limit=limit, offset=offset)
    total = _total(
        items, limit, offset, lambda: queries.count_outputs(engine, anywhere, anywhere, anywhere)
    )
    return page(items, total, limit, offset)


def find_job(
    engine: Engine, job_id: int, threshold: float = queries.DEFAULT_FLICKER_THRESHOLD
) -> dict[str, Any] | None:
    found = queries.jobs(engine, job_id=job_id, limit=1, flicker_threshold=threshold)
    return mark_untrained(engine, found)[0] if found else None


def shot_exists(engine: Engine, show: str, sequence: str, shot: str) -> bool:
    return queries.count_shots(engine, show, sequence, shot) > 0


def shot_detail(
    engine: Engine,
    show: str,
    sequence: str,
    shot: str,
    threshold: float = queries.DEFAULT_FLICKER_THRESHOLD,
) -> dict[str, Any] | None:
    """Coverage, plates, the newest jobs (failed and flagged frames and reasons) and the
    newest job's provenance; None when the catalog has no such shot."""
    listed = shot_list(engine, show, sequence, shot, limit=1, offset=0)["items"]
    if not listed:
        return None
    coverage = listed[0]
    jobs = job_list(engine, show, sequence, shot, None, JOBS_ON_SHOT, 0, threshold)
    job_id = coverage["job_id"]
    return {
        "show": show,
        "sequence": sequence,
        "shot": shot,
        "coverage": coverage,
        "plates": queries.shot_plates(engine, show, sequence, shot),
        "jobs": jobs["items"],
        "jobs_total": jobs["total"],
        "provenance": queries.job_provenance(engine, job_id) if job_id else [],
        "untrained": coverage["untrained"],
    }


def qc_report(
    engine: Engine, show: str, sequence: str, shot: str, threshold: float
) -> dict[str, Any]:
    """The shot's flicker scores per pass, each marked flagged or not, and the flagged list."""
    passes: dict[str, list[dict[str, Any]]] = {}
    flagged = []
    for row in queries.flicker_scores(engine, show, sequence, shot):
        above = row["flicker"] > threshold
        passes.setdefault(row["pass_name"], []).append(
            {
                "frame": row["frame"],
                "flicker": row["flicker"],
                "flagged": above,
                "preview_id": row["preview_id"],
                "preview_uri": row["preview_uri"],
            }
        )
        if above:
            flagged.append(
                {"pass_name": row["pass_name"], "frame": row["frame"], "flicker": row["flicker"]}
            )
    return {
        "show": show,
        "sequence": sequence,
        "shot": shot,
        "threshold": threshold,
        "passes": passes,
        "flagged": flagged,
    }
