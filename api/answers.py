"""The answers the JSON routes and the pages share, assembled from ``schemas.catalog.queries``:
pages of shots, jobs and outputs with their totals, a shot's detail and QC report, which jobs
used untrained models."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from api.known_shot import ShotKey
from schemas.catalog import queries

JOBS_ON_SHOT = 20  # newest jobs shown with a shot (all of them: the shot's /jobs route)
Found = tuple[list[dict[str, Any]], int]  # a page's items and the total, as queries give them


def paged(found: Found, limit: int, offset: int) -> dict[str, Any]:
    """A page as the routes answer it (``Page``): items, total, limit and offset."""
    items, total = found
    return {"items": items, "total": total, "limit": limit, "offset": offset}


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
    items, total = queries.shots_page(engine, show, sequence, shot, limit=limit, offset=offset)
    untrained = queries.untrained_jobs(engine, [i["job_id"] for i in items if i["job_id"]])
    for item in items:
        item["untrained"] = item["job_id"] in untrained
    return paged((items, total), limit, offset)


def job_list(
    engine: Engine,
    shot: ShotKey,
    status: str | None,
    limit: int,
    offset: int,
    threshold: float = queries.DEFAULT_FLICKER_THRESHOLD,
) -> dict[str, Any]:
    """A page of the shot's jobs, newest first, with failed and flagged frames and untrained
    flags."""
    items, total = queries.jobs_page(
        engine, *shot, status, limit, offset, flicker_threshold=threshold
    )
    return paged((mark_untrained(engine, items), total), limit, offset)


def output_list(
    engine: Engine,
    shot: ShotKey | None,
    pass_name: str | None,
    kind: str | None,
    limit: int,
    offset: int,
) -> dict[str, Any]:
    """A page of the shot's outputs (no shot: every output in the catalog), newest first."""
    names = shot if shot is not None else (None, None, None)
    found = queries.outputs_page(engine, *names, pass_name, kind, limit=limit, offset=offset)
    return paged(found, limit, offset)


def publish_list(
    engine: Engine, shot: ShotKey, status: str | None, limit: int, offset: int
) -> dict[str, Any]:
    """A page of the shot's publishes to trackers, newest first."""
    found = queries.publishes_page(engine, *shot, status=status, limit=limit, offset=offset)
    return paged(found, limit, offset)


def find_job(
    engine: Engine, job_id: int, threshold: float = queries.DEFAULT_FLICKER_THRESHOLD
) -> dict[str, Any] | None:
    found = queries.job(engine, job_id, flicker_threshold=threshold)
    return mark_untrained(engine, [found])[0] if found is not None else None


def shot_detail(
    engine: Engine, shot: ShotKey, threshold: float = queries.DEFAULT_FLICKER_THRESHOLD
) -> dict[str, Any]:
    """Coverage, plates, the newest jobs (failed and flagged frames and reasons) and the
    newest job's provenance of a shot the catalog has (KnownShot; shots are never removed)."""
    (coverage,) = shot_list(engine, *shot, limit=1, offset=0)["items"]
    jobs = job_list(engine, shot, None, JOBS_ON_SHOT, 0, threshold)
    job_id = coverage["job_id"]
    return {
        "show": shot.show,
        "sequence": shot.sequence,
        "shot": shot.shot,
        "coverage": coverage,
        "plates": queries.shot_plates(engine, *shot),
        "jobs": jobs["items"],
        "jobs_total": jobs["total"],
        "provenance": queries.job_provenance(engine, job_id) if job_id else [],
        "untrained": coverage["untrained"],
        "publishes": queries.publishes_page(engine, *shot, limit=JOBS_ON_SHOT)[0],
    }


def qc_report(engine: Engine, shot: ShotKey, threshold: float) -> dict[str, Any]:
    """The shot's flicker scores per pass, each marked flagged or not, and the flagged list:
    ``passes`` holds the newest version's scores of each pass, ``versions`` every scored
    version's (pass -> version -> scores; a version is its output folder's name, e.g.
    ``sapiens2_v002``), so a stabilised version is seen beside the one it came from;
    ``methods`` how each version's scores of each pass were made (pass -> version -> the QC
    method, None for scores from before methods were recorded, "mixed" where its frames
    differ), and ``unlike`` the passes whose versions were scored by different methods."""
    versions: dict[str, dict[str, list[dict[str, Any]]]] = {}
    methods: dict[str, dict[str, str | None]] = {}
    newest: dict[str, tuple[int, str]] = {}
    for row in queries.flicker_scores(engine, *shot):
        name, version = row["pass_name"], version_name(row["output_root"])
        versions.setdefault(name, {}).setdefault(version, []).append(
            {
                "frame": row["frame"],
                "flicker": row["flicker"],
                "flagged": row["flicker"] > threshold,
                "preview_id": row["preview_id"],
                "preview_uri": row["preview_uri"],
            }
        )
        newest[name] = max(newest.get(name, (-1, "")), (row["job_id"], version))
        seen = methods.setdefault(name, {})
        method = row["flicker_method"]
        seen[version] = method if seen.get(version, method) == method else "mixed"
    passes = {name: versions[name][version] for name, (_job, version) in newest.items()}
    flagged = [
        {"pass_name": name, "frame": s["frame"], "flicker": s["flicker"]}
        for name, scores in passes.items()
        for s in scores
        if s["flagged"]
    ]
    return {
        "show": shot.show,
        "sequence": shot.sequence,
        "shot": shot.shot,
        "threshold": threshold,
        "passes": passes,
        "versions": versions,
        "methods": methods,
        "unlike": sorted(n for n, by in methods.items() if len(set(by.values())) > 1),
        "flagged": flagged,
    }


def version_name(output_root: str | None) -> str:
    """A version as people name it: its output folder's name (``sapiens2_v002``)."""
    return (output_root or "").rstrip("/").rsplit("/", 1)[-1] or "unknown"
