"""What the catalog bench times over a filled catalog: every read route of the API (the table
``ROUTES``), served by uvicorn in a process of its own and asked by concurrent httpx clients;
the CLI's ``svfx catalog shots`` and ``svfx catalog outputs`` as subprocesses; and the
planning of a resubmit of the largest shot (`flows.planning.work_to_do`: the catalog's plate
frames and outputs of the version, then the disk, decided per frame).

To time another route, add a row to ``ROUTES``: its name and its path, with ``{name}`` for a
value of `Targets` (URL-quoted). `uncovered` names the app's GET routes no row asks."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from sqlalchemy import Connection, Engine, func, select

from schemas.catalog import models as m

# (name, path): one row per timed request; {target} is filled from Targets
ROUTES: tuple[tuple[str, str], ...] = (
    ("shots, first page", "/api/shots?limit=50"),
    ("shots, deep page", "/api/shots?limit=50&offset={shots_deep}"),
    ("index page (HTML), first page", "/?limit=100"),
    ("index page (HTML), deep page", "/?limit=100&offset={shots_deep}"),
    ("shot (JSON)", "/api/shots/{shot}"),
    ("shot page (HTML)", "/shots/{shot}"),
    ("shot's jobs, first page", "/api/shots/{shot}/jobs?limit=50"),
    ("shot's jobs, deep page", "/api/shots/{shot}/jobs?limit=2&offset={jobs_deep}"),
    ("job", "/api/jobs/{job}"),
    ("shot's outputs, first page", "/api/shots/{shot}/outputs?limit=100"),
    ("shot's outputs, deep page", "/api/shots/{shot}/outputs?limit=100&offset={shot_deep}"),
    ("all outputs, first page", "/api/search?limit=100"),
    ("all outputs, deep page", "/api/search?limit=100&offset={outputs_deep}"),
    ("provenance of an EXR", "/api/provenance?path={exr}"),
    ("provenance of a stabilised EXR", "/api/provenance?path={stabilised_exr}"),
    ("provenance of a Zarr frame", "/api/provenance?path={zarr}&frame={frame}"),
    ("QC (flicker)", "/api/shots/{shot}/qc"),
    ("publishes", "/api/shots/{shot}/publishes"),
    ("invalidated by a plate frame", "/api/search?plate_sha256={plate_sha}"),
    ("invalidated by a checkpoint", "/api/search?checkpoint_sha256={checkpoint_sha}"),
    (
        "invalidated by a checkpoint, deep page",
        "/api/search?checkpoint_sha256={checkpoint_sha}&offset={invalidated_deep}",
    ),
    ("usage per show", "/api/usage"),
    ("usage of a show per shot", "/api/usage?show={show}&by=shot"),
    ("usage of a shot per version and pass", "/api/usage?{shot_query}&by=pass"),
    ("usage page (HTML), a show per shot", "/usage?show={show}"),
    ("preview file (catalog read; not on disk: 404)", "/files/outputs/{preview_id}"),
    ("contact sheet (catalog read; not on disk: 404)", "/files/contact/{shot}/normal"),
)


@dataclass(frozen=True)
class Targets:
    """The values the routes ask about, read from the filled catalog."""

    shot: str  # the shot with the most outputs, SHOW/SEQ/SHOT
    show: str
    shot_query: str  # show=..&sequence=..&shot=.. of that shot
    shots_deep: int
    jobs_deep: int
    job: int
    shot_deep: int
    outputs_deep: int
    exr: str
    stabilised_exr: str
    zarr: str
    frame: int
    plate_sha: str
    checkpoint_sha: str
    invalidated_deep: int
    preview_id: int

    def path(self, template: str) -> str:
        values = {k: quote(str(v), safe="/=&") for k, v in asdict(self).items()}
        return template.format(**values)


def _deep(total: int, limit: int) -> int:
    """The offset of the page nine tenths of the way through ``total`` rows."""
    return max(0, (total * 9 // 10) // limit * limit)


def _most_used_checkpoint(conn: Connection) -> tuple[str, int]:
    """The sha256 of the checkpoint the most outputs depend on, and how many."""
    sha256, made = conn.execute(
        select(m.Checkpoint.sha256, func.count())
        .join(m.OutputCheckpoint, m.OutputCheckpoint.checkpoint_id == m.Checkpoint.id)
        .group_by(m.Checkpoint.sha256)
        .order_by(func.count().desc())
        .limit(1)
    ).one()
    return str(sha256), int(made)


def targets(engine: Engine) -> Targets:
    """The largest shot (by outputs) and what the routes ask about it."""
    o, j = m.Output, m.Job
    with engine.connect() as conn:
        shot_id, shot_outputs = conn.execute(
            select(o.shot_id, func.count()).group_by(o.shot_id).order_by(func.count().desc())
        ).first()  # type: ignore[misc]
        names = conn.execute(
            select(m.Show.name, m.Sequence.name, m.Shot.name)
            .join(m.Sequence, m.Sequence.show_id == m.Show.id)
            .join(m.Shot, m.Shot.sequence_id == m.Sequence.id)
            .where(m.Shot.id == shot_id)
        ).one()
        shots = conn.execute(select(func.count()).select_from(m.Shot)).scalar_one()
        jobs = conn.execute(select(func.count()).where(j.shot_id == shot_id)).scalar_one()
        job_id = conn.execute(select(func.max(j.id)).where(j.shot_id == shot_id)).scalar_one()
        outputs = conn.execute(select(func.max(o.id))).scalar_one()
        exr = conn.execute(
            select(o.uri, o.frame, o.plate_sha256, o.checkpoint_id)
            .where(o.shot_id == shot_id, o.kind == "exr", o.pass_name == "normal")
            .order_by(o.id.desc())
            .limit(1)
        ).one()
        stabilised = conn.execute(
            select(o.uri)
            .join(m.OutputSource, m.OutputSource.output_id == o.id)
            .where(o.kind == "exr")
            .order_by((o.shot_id == shot_id).desc(), o.id.desc())
            .limit(1)
        ).scalar()
        zarr = conn.execute(
            select(o.uri).where(o.shot_id == shot_id, o.kind == "zarr").limit(1)
        ).scalar_one()
        preview = conn.execute(
            select(func.max(o.id)).where(o.shot_id == shot_id, o.kind == "preview")
        ).scalar_one()
        checkpoint_sha, made = _most_used_checkpoint(conn)
    return Targets(
        shot="/".join(names),
        show=names[0],
        shot_query=f"show={names[0]}&sequence={names[1]}&shot={names[2]}",
        shots_deep=_deep(shots, 50),
        jobs_deep=_deep(jobs, 2),
        job=job_id,
        shot_deep=_deep(shot_outputs, 100),
        outputs_deep=_deep(outputs, 100),
        exr=exr.uri,
        stabilised_exr=stabilised or exr.uri,
        zarr=zarr,
        frame=exr.frame,
        plate_sha=exr.plate_sha256,
        checkpoint_sha=checkpoint_sha,
        invalidated_deep=_deep(made, 1000),
        preview_id=preview,
    )


def uncovered(app: Any, found: Targets) -> list[str]:
    """The app's GET routes (but the OpenAPI document) that no row of ROUTES asks."""
    from starlette.routing import Route

    paths = [found.path(template).split("?", 1)[0] for _name, template in ROUTES]
    missing = []
    for route in app.routes:
        if not isinstance(route, Route) or "GET" not in (route.methods or ()):
            continue
        if route.path == "/openapi.json":
            continue
        if not any(route.path_regex.match(path) for path in paths):
            missing.append(route.path)
    return missing


def percentiles(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": statistics.median(ordered), "p95": p95, "max": ordered[-1]}


def time_routes(
    base: str, found: Targets, requests: int, clients: int, routes: tuple[tuple[str, str], ...]
) -> list[dict[str, Any]]:
    """Per route: ``requests`` requests, ``clients`` at a time, each client with its own
    connection; milliseconds per request (p50, p95, max) and the statuses answered."""
    local = threading.local()

    def get(path: str) -> tuple[float, int]:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=base, timeout=300)
        start = time.perf_counter()
        status = client.get(path).status_code
        return (time.perf_counter() - start) * 1000, status

    rows = []
    with ThreadPoolExecutor(clients) as pool:
        for name, template in routes:
            path = found.path(template)
            list(pool.map(get, [path] * clients))  # each client connected and warm
            answers = list(pool.map(get, [path] * requests))
            statuses = sorted({status for _ms, status in answers})
            timing = percentiles([ms for ms, _status in answers])
            rows.append({"what": name, "path": path, "n": requests, "status": statuses, **timing})
    return rows


def time_cli(url: str, shot: str, repeats: int) -> list[dict[str, Any]]:
    """``svfx catalog shots`` and ``svfx catalog outputs SHOT`` as a user runs them: a new
    process each time, its settings from the environment (``SVFX_CATALOG_URL``)."""
    commands = {
        "svfx catalog shots": ["catalog", "shots"],
        "svfx catalog outputs SHOT": ["catalog", "outputs", shot],
    }
    rows = []
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "SVFX_CATALOG_URL": url, "SVFX_HOME": home, "COLUMNS": "200"}
        env.pop("SVFX_CONFIG", None)
        svfx = Path(sys.executable).with_name("svfx")
        for name, args in commands.items():
            ms = []
            for _ in range(repeats):
                start = time.perf_counter()
                subprocess.run([str(svfx), *args], env=env, check=True, capture_output=True)
                ms.append((time.perf_counter() - start) * 1000)
            rows.append({"what": name, "path": " ".join(args), "n": repeats, "status": [0],
                         **percentiles(ms)})  # fmt: skip
    return rows
