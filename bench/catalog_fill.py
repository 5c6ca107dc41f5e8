"""The catalog bench's database: made fresh and filled through the catalog's writer, or an
earlier fill of the same studio reused.

The fill's parameters (the studio layout, ``outputs``, ``seed``) and whether it finished are
kept in the database's comment (``COMMENT ON DATABASE``), outside the catalog's tables, so a
rerun with ``--keep`` reuses a complete fill of the same studio and refills anything else.

The shots are shared out between ``workers`` processes, each with its own ``Catalog``
(``open_catalog``) and its own connections; a shot's versions and jobs are recorded by one
process in order, as the flow would record them."""

from __future__ import annotations

import json
import multiprocessing
import queue
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.catalog_studio import ShotHistory, studio

LAYOUT = 1  # bump when the studio or its records change: a kept database is then refilled


@dataclass(frozen=True)
class FillResult:
    url: str
    reused: bool
    outputs: int
    jobs: int
    shots: int
    seconds: float
    workers: int

    @property
    def outputs_per_s(self) -> float:
        return self.outputs / self.seconds if self.seconds else 0.0

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


def admin_user(admin: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(admin).get("user") or "postgres")


def database_url(admin: str, database: str) -> str:
    """The SQLAlchemy URL of ``database`` on the server of ``admin`` (a libpq URL)."""
    host = admin.split("@", 1)[-1].split("/", 1)[0]
    return f"postgresql+psycopg://{admin_user(admin)}@{host}/{database}"


def _comment(admin: str, database: str) -> dict[str, Any] | None:
    """The fill's parameters kept on the database, None when it does not exist."""
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            (database,),
        ).fetchone()
    if row is None:
        return None
    try:
        return dict(json.loads(row[0] or "{}"))
    except ValueError:
        return {}


def _set_comment(admin: str, database: str, facts: dict[str, Any]) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(database), sql.Literal(json.dumps(facts, sort_keys=True))
            )
        )


def drop_database(admin: str, database: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(drop.format(sql.Identifier(database)))


def reusable(admin: str, database: str, outputs: int, seed: int) -> dict[str, Any] | None:
    """The kept fill's facts when ``database`` holds a complete fill of this studio."""
    facts = _comment(admin, database)
    wanted = {"layout": LAYOUT, "outputs": outputs, "seed": seed, "complete": True}
    if facts and all(facts.get(k) == v for k, v in wanted.items()):
        return facts
    return None


def fill(
    admin: str, database: str, outputs: int, seed: int, workers: int, chunk_frames: int
) -> FillResult:
    """A fresh ``database`` filled with the studio of ``outputs`` outputs (or the kept one)."""
    url = database_url(admin, database)
    kept = reusable(admin, database, outputs, seed)
    if kept is not None:
        return FillResult(url, True, kept["outputs_recorded"], kept["jobs"], kept["shots"],
                          kept["seconds"], kept["workers"])  # fmt: skip
    drop_database(admin, database)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    facts: dict[str, Any] = {"layout": LAYOUT, "outputs": outputs, "seed": seed}
    _set_comment(admin, database, {**facts, "complete": False})
    from schemas.catalog import open_catalog

    open_catalog(url).close()  # migrated once, before the processes start
    shots = studio(outputs, seed)
    start = time.perf_counter()
    recorded, jobs = _record(url, shots, workers, chunk_frames)
    seconds = time.perf_counter() - start
    done = {"outputs_recorded": recorded, "jobs": jobs, "shots": len(shots)}
    done.update(seconds=round(seconds, 1), workers=workers, chunk_frames=chunk_frames)
    _set_comment(admin, database, {**facts, **done, "complete": True})
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")  # the planner's statistics, as autovacuum would make
    return FillResult(url, False, recorded, jobs, len(shots), seconds, workers)


def _record(url: str, shots: list[ShotHistory], workers: int, chunk_frames: int) -> tuple[int, int]:
    """Record ``shots`` in ``workers`` processes (in this one for 1), with a progress bar."""
    total = sum(s.outputs for s in shots)
    columns = (TextColumn("filling"), BarColumn(), MofNCompleteColumn(), TextColumn("outputs"),
               TextColumn("{task.fields[jobs]} jobs"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns) as progress:
        task = progress.add_task("fill", total=total, jobs=0)
        if workers <= 1:
            return _record_here(url, shots, chunk_frames, progress, task)
        return _record_apart(url, shots, workers, chunk_frames, progress, task)


def _record_here(
    url: str, shots: list[ShotHistory], chunk_frames: int, progress: Progress, task: Any
) -> tuple[int, int]:
    from bench.catalog_record import record_shot
    from schemas.catalog import open_catalog

    catalog = open_catalog(url)
    outputs = jobs = 0
    for shot in shots:
        recorded = record_shot(catalog, shot, chunk_frames)
        outputs, jobs = outputs + recorded.outputs, jobs + recorded.jobs
        progress.update(task, advance=recorded.outputs, jobs=jobs)
    catalog.close()
    return outputs, jobs


def _worker(url: str, shots: list[ShotHistory], chunk_frames: int, out: Any) -> None:
    from bench.catalog_record import record_shot
    from schemas.catalog import open_catalog

    catalog = open_catalog(url)
    for shot in shots:
        recorded = record_shot(catalog, shot, chunk_frames)
        out.put((recorded.outputs, recorded.jobs))
    catalog.close()
    out.put(None)


def _record_apart(
    url: str,
    shots: list[ShotHistory],
    workers: int,
    chunk_frames: int,
    progress: Progress,
    task: Any,
) -> tuple[int, int]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    processes = [
        context.Process(target=_worker, args=(url, shots[w::workers], chunk_frames, out))
        for w in range(workers)
    ]
    for process in processes:
        process.start()
    outputs = jobs = 0
    running = workers
    while running:
        try:
            item = out.get(timeout=5)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a fill process failed (its traceback is above)") from None
            continue
        if item is None:
            running -= 1
            continue
        outputs, jobs = outputs + item[0], jobs + item[1]
        progress.update(task, advance=item[0], jobs=jobs)
    for process in processes:
        process.join()
    return outputs, jobs
