"""The catalog stays the truth of the disk when its database misbehaves mid-shot, with real
components: a PostgreSQL server of the test's own stopped and started with pg_ctl, a SQLite
file deleted or truncated under a run. Shots run through `run_planned_shot` on a LocalCluster
of two processes with tiny UNTRAINED models.

- PostgreSQL restarted mid-shot: the run goes on, every frame ends in the catalog, the job
  closes `complete`.
- PostgreSQL away for good: the run ends naming the catalog and how many frames are not
  recorded; once it is back, the next run records those frames from disk (nothing is
  recomputed) and the first job is closed with the reason.
- a SQLite catalog deleted mid-shot is named and refused, never recreated empty; a truncated
  one is refused by name.
- job leases: a job whose process is gone is closed by the next job on its outputs; a live
  one refuses the second job (JobConflict).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import func, select

from flows import job_recording
from flows.planning import plan_shot
from flows.shot_runner import run_planned_shot
from schemas.catalog import open_catalog, queries
from schemas.catalog.errors import CatalogDamaged, CatalogUnavailable, JobConflict
from schemas.catalog.models import JobFrame, Output
from schemas.catalog.transactions import is_transient
from schemas.spec import parse_spec
from storage.retry import RetryPolicy
from tests.pg_server import PgServer
from tests.shot_helpers import local_client, make_plate, settings_for, spec_data

pytestmark = pytest.mark.timeout(400)
FRAMES = list(range(1001, 1009))


client = pytest.fixture(scope="module")(local_client)


@pytest.fixture(scope="module")
def pg():
    server = PgServer()
    server.start()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def quick_during_shot(monkeypatch):
    """Keep chunk summaries for later after half a second (instead of 10 s)."""
    policy = RetryPolicy(attempts=1000, first_wait_s=0.1, max_wait_s=0.2, deadline_s=0.5)
    monkeypatch.setattr(job_recording, "DURING_SHOT_RETRY", policy)


def _plan(home: Path, settings):
    pattern = make_plate(home / "plates", frames=len(FRAMES))
    spec = parse_spec(spec_data(pattern, home / "out", passes="matte", chunk_frames=2))
    return plan_shot(spec, settings)


def _exr_rows_per_frame(catalog) -> dict[int, int]:
    with catalog.engine.connect() as conn:
        rows = conn.execute(
            select(Output.frame, func.count()).where(Output.kind == "exr").group_by(Output.frame)
        ).all()
    return dict(rows)


def _fresh_database(pg: PgServer, name: str) -> str:
    import psycopg

    admin = f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/{name}"


@pytest.mark.slow
def test_a_postgres_restart_mid_shot_loses_no_frame(home, client, pg, quick_during_shot):
    url = _fresh_database(pg, "restart_mid_shot")
    settings = settings_for(home, catalog_url=url)
    catalog = open_catalog(url, retry_s=90)
    plan = _plan(home, settings)
    restarted = threading.Event()

    def restart_after_first_chunk(_summary) -> None:
        if restarted.is_set():
            return
        restarted.set()
        pg.stop()
        threading.Timer(4.0, pg.start).start()  # chunks keep landing while it is down

    result = run_planned_shot(plan, catalog, client, window=2, on_chunk=restart_after_first_chunk)
    assert restarted.is_set()
    assert result.status == "complete", result.failed
    assert sorted(result.done) == FRAMES
    assert _exr_rows_per_frame(catalog) == dict.fromkeys(FRAMES, 1)
    job = queries.job(catalog.engine, result.job_id)
    assert (job["status"], job["frames_done"], job["frames_total"]) == ("complete", 8, 8)


def test_a_database_away_for_good_is_named_then_its_frames_are_adopted(
    home, client, pg, quick_during_shot
):
    url = _fresh_database(pg, "away_for_good")
    settings = settings_for(home, catalog_url=url)
    plan = _plan(home, settings)
    stopped = threading.Event()

    def stop_after_first_chunk(_summary) -> None:
        if not stopped.is_set():
            stopped.set()
            pg.stop()

    catalog = open_catalog(url, retry_s=3)
    try:
        with pytest.raises(CatalogUnavailable) as raised:
            run_planned_shot(plan, catalog, client, window=2, on_chunk=stop_after_first_chunk)
    finally:
        pg.start()
    message = str(raised.value)
    assert f"127.0.0.1:{pg.port}" in message and "frames are not recorded" in message
    first_job = queries.jobs_page(catalog.engine, limit=1)[0][0]
    recorded = first_job["frames_done"]
    assert first_job["status"] == "running" and 0 < recorded < len(FRAMES)

    again = run_planned_shot(plan_shot(plan.spec, settings), catalog, client)
    assert again.status == "complete"
    assert again.done == [], "frames on disk with valid records must not be recomputed"
    assert len(again.skipped) == recorded
    assert sorted(again.skipped + again.adopted) == FRAMES
    assert _exr_rows_per_frame(catalog) == dict.fromkeys(FRAMES, 1)
    closed = queries.job(catalog.engine, first_job["id"])
    assert closed["status"] == "partial"
    assert "ended without finishing" in closed["message"]


def test_a_sqlite_catalog_deleted_mid_shot_is_refused_by_name(home, client):
    settings = settings_for(home)
    catalog = open_catalog(settings.catalog)
    plan = _plan(home, settings)
    path = home / "catalog.db"

    def delete_the_catalog(_summary) -> None:
        for name in ("catalog.db", "catalog.db-wal", "catalog.db-shm"):
            (home / name).unlink(missing_ok=True)

    with pytest.raises(CatalogDamaged) as raised:
        run_planned_shot(plan, catalog, client, window=1, on_chunk=delete_the_catalog)
    assert str(path) in str(raised.value) and "deleted while in use" in str(raised.value)
    assert not path.exists(), "an empty catalog must not be created mid-job"

    # a new run starts a new catalog: the frames written before the refusal are found on
    # disk and recorded, only the others are computed
    written = sorted(int(p.name.split(".")[-2]) for p in Path(plan.paths.frame_records).iterdir())
    assert written and len(written) < len(FRAMES)
    fresh = open_catalog(settings.catalog)
    again = run_planned_shot(plan_shot(plan.spec, settings), fresh, client)
    assert again.status == "complete"
    assert sorted(again.adopted) == written
    assert sorted(again.done) == sorted(set(FRAMES) - set(written))
    assert _exr_rows_per_frame(fresh) == dict.fromkeys(FRAMES, 1)


def test_a_truncated_sqlite_catalog_is_refused_by_name(tmp_path):
    url = f"sqlite:///{tmp_path / 'cut.db'}"
    open_catalog(url).close()
    data = (tmp_path / "cut.db").read_bytes()
    (tmp_path / "cut.db").write_bytes(data[: len(data) // 3])
    for leftover in ("cut.db-wal", "cut.db-shm"):
        (tmp_path / leftover).unlink(missing_ok=True)
    with pytest.raises(CatalogDamaged) as raised:
        open_catalog(url)
    assert str(tmp_path / "cut.db") in str(raised.value)


def test_a_job_whose_process_is_gone_is_closed_by_the_next(home, client):
    settings = settings_for(home)
    catalog = open_catalog(settings.catalog)
    plan = _plan(home, settings)
    dead = "somehost-that-is-gone:4242:1:abc"  # another host, silent for longer than the lease
    job_id = catalog.register_job(
        plan.spec, plan.plate, None, output_root=plan.paths.root, owner=dead
    )
    with catalog.engine.begin() as conn:
        conn.execute(JobFrame.__table__.insert().values(
            job_id=job_id, frame=1001, status="done", timings={}, worker=None))  # fmt: skip
    new_id = catalog.register_job(
        plan.spec, plan.plate, None, output_root=plan.paths.root, owner="x:1:1:y", lease_s=0
    )
    assert new_id != job_id
    closed = queries.job(catalog.engine, job_id)
    assert closed["status"] == "failed" and "ended without finishing" in closed["message"]


def test_a_live_job_refuses_a_second_on_the_same_outputs(home):
    from schemas.catalog.lease import end_run, start_run

    settings = settings_for(home)
    catalog = open_catalog(settings.catalog)
    plan = _plan(home, settings)
    owner = start_run()  # a run in progress in this process
    try:
        job_id = catalog.register_job(
            plan.spec, plan.plate, None, output_root=plan.paths.root, owner=owner
        )
        with pytest.raises(JobConflict) as raised:
            catalog.register_job(
                plan.spec, plan.plate, None, output_root=plan.paths.root, owner=start_run()
            )
        assert raised.value.job["id"] == job_id
        assert f"job {job_id} is already running demo/sq010/sh010" in str(raised.value)
    finally:
        end_run(owner)


def test_which_database_errors_are_worth_another_try():
    import sqlite3

    from sqlalchemy.exc import IntegrityError, OperationalError

    def wrapped(exc: Exception, kind=OperationalError):
        return kind("SELECT 1", {}, exc)

    class PgError(Exception):
        __module__ = "psycopg"

        def __init__(self, sqlstate):
            super().__init__(f"sqlstate {sqlstate}")
            self.sqlstate = sqlstate

    assert is_transient(wrapped(sqlite3.OperationalError("database is locked")))
    assert not is_transient(wrapped(sqlite3.OperationalError("no such table: jobs")))
    assert is_transient(wrapped(PgError(None)))  # connection refused: no server answer
    assert is_transient(wrapped(PgError("57P01")))  # admin shutdown
    assert is_transient(wrapped(PgError("08006")))  # connection failure
    assert not is_transient(wrapped(PgError("3D000")))  # the database does not exist
    assert not is_transient(wrapped(PgError("23505"), IntegrityError))


def test_a_jobs_frame_counts_add_up_with_a_hole(home, client):
    settings = settings_for(home)
    pattern = make_plate(home / "plates", frames=5)
    (home / "plates" / "astronaut.1003.exr").unlink()
    spec = parse_spec(spec_data(pattern, home / "out", passes="matte", frames="1001-1005"))
    catalog = open_catalog(settings.catalog)
    result = run_planned_shot(plan_shot(spec, settings), catalog, client)
    assert result.status == "partial" and list(result.failed) == [1003]
    job = queries.job(catalog.engine, result.job_id)
    counts = (job["frames_total"], job["frames_done"], job["frames_failed"])
    assert counts == (5, 4, 1)
