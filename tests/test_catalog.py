"""The catalog on SQLite and PostgreSQL: migrations, idempotent writes, job counters and the
read queries. Every test that touches a database runs once per dialect."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, event, func, inspect, select, text
from sqlalchemy.orm import Session

from schemas.catalog import Catalog, make_engine, migrate, models, open_catalog, queries
from schemas.catalog import engine as catalog_engine
from schemas.catalog import opening as catalog_opening
from tests import catalog_fixtures
from tests.catalog_fixtures import (
    CHECKPOINTS,
    checkpoint,
    exr_uri,
    make_chunk,
    make_plate,
    make_spec,
    plate_sha,
)

# Fixtures (pytest finds them by name): a fresh catalog on SQLite and on PostgreSQL.
catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url

TABLES = {
    "shows",
    "sequences",
    "shots",
    "plates",
    "plate_frames",
    "checkpoints",
    "jobs",
    "job_frames",
    "provenance",
    "outputs",
    "outputs_checkpoints",
}
SHOT = ("demo", "sq010", "sh0010")
# Per done frame: normal (EXR part, preview, Zarr), seg (EXR part, preview), pose (JSON, preview).
OUTPUTS_PER_FRAME = 7


def row_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            name: conn.execute(select(func.count()).select_from(text(name))).scalar_one()
            for name in sorted(TABLES)
        }


def registered(catalog: Catalog, root: Path, frames: range = range(1001, 1009), **spec: Any):
    spec_ = make_spec(root, **spec)
    job_id = catalog.register_job(spec_, make_plate(spec_, frames), "flow-run-1")
    return spec_, job_id


# -- engine and migrations -------------------------------------------------------------------
def test_each_migration_file_is_named_by_its_revision() -> None:
    """`head_revision` reads the newest revision off the file names, without Alembic."""
    scripts = ScriptDirectory.from_config(catalog_engine.alembic_config())
    for script in scripts.walk_revisions():
        assert Path(script.path).name.startswith(f"{script.revision}_"), script.path


def test_migrations_apply_once_and_match_the_models(catalog_url: str) -> None:
    engine = make_engine(catalog_url)
    try:
        migrate(engine)
        assert set(inspect(engine).get_table_names()) >= TABLES | {catalog_engine.VERSION_TABLE}
        head = ScriptDirectory.from_config(catalog_engine.alembic_config()).get_current_head()
        statements: list[str] = []
        event.listen(
            engine, "before_cursor_execute", lambda _c, _cur, stmt, *_: statements.append(stmt)
        )
        migrate(engine)
        writes = [
            s for s in statements if re.match(r"\s*(CREATE|ALTER|DROP|INSERT|UPDATE)", s, re.I)
        ]
        assert writes == [], "a second migrate must change nothing"
        assert catalog_engine.head_revision() == head  # what migrate's quick check compares
        assert catalog_engine.at_head(engine)
        with engine.connect() as conn:
            version = f"SELECT version_num FROM {catalog_engine.VERSION_TABLE}"
            assert conn.execute(text(version)).scalars().all() == [head]
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "version_table": catalog_engine.VERSION_TABLE}
            )
            assert compare_metadata(context, models.Base.metadata) == []
    finally:
        engine.dispose()


def test_sqlite_engine_settings(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/new/dir/catalog.db")
    try:
        assert (tmp_path / "new" / "dir").is_dir()
        with engine.connect() as conn:
            pragma = {
                name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("journal_mode", "busy_timeout", "synchronous", "foreign_keys")
            }
        assert pragma == {
            "journal_mode": "wal",
            "busy_timeout": 30000,
            "synchronous": 1,
            "foreign_keys": 1,
        }
        begins: list[str] = []
        event.listen(
            engine,
            "before_cursor_execute",
            lambda _c, _cur, stmt, *_: begins.append(stmt) if stmt.startswith("BEGIN") else None,
        )
        with engine.begin() as conn:
            conn.execute(text("SELECT 1"))
        with engine.connect() as conn:
            conn.execution_options(**{catalog_engine.READ_OPTION: True}).execute(text("SELECT 1"))
        assert begins == ["BEGIN IMMEDIATE", "BEGIN"]
    finally:
        engine.dispose()


def test_catalog_urls() -> None:
    assert catalog_engine.parse_url("postgresql://u@db:5432/cat").drivername == "postgresql+psycopg"
    assert catalog_engine.parse_url("postgres://u@db/cat").drivername == "postgresql+psycopg"
    assert catalog_engine.parse_url("sqlite:///x.db").drivername == "sqlite"
    with pytest.raises(ValueError, match="unsupported catalog URL") as info:
        make_engine("postgresql+psycopg2://u:hunter2@db/cat")
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match="not a database URL"):
        make_engine("/just/a/path.db")


def test_open_catalog_migrates_once_per_url(
    catalog_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Engine] = []
    real = catalog_opening.migrate
    monkeypatch.setattr(
        catalog_opening, "migrate", lambda engine: calls.append(engine) or real(engine)
    )
    first = open_catalog(catalog_url)
    try:
        assert open_catalog(catalog_url) is first
        assert len(calls) == 1
    finally:
        first.close()


# -- writing ---------------------------------------------------------------------------------
def test_register_and_record_round_trip(catalog: Catalog, tmp_path: Path) -> None:
    spec, job_id = registered(catalog, tmp_path)
    known = catalog.known_plate_frames(*SHOT, spec.plate)
    assert sorted(known) == list(range(1001, 1009))
    assert known[1001] == (50_001_001, "50001001:1700000001", None)

    chunk = make_chunk(spec, range(1001, 1005))
    catalog.record_chunk(job_id, chunk)

    job = catalog.job(job_id)
    assert (job["status"], job["submitter"], job["flow_run_id"]) == (
        "running",
        "alice",
        "flow-run-1",
    )
    assert (job["frames_total"], job["frames_done"], job["frames_failed"]) == (8, 4, 0)
    assert job["spec"] == spec.model_dump(mode="json")
    assert datetime.fromisoformat(job["started_at"]).utcoffset() is not None
    assert job["failed_frames"] == []

    known = catalog.known_plate_frames(*SHOT, spec.plate)
    assert known[1002][2] == plate_sha("sh0010", 1002)
    assert known[1005][2] is None
    keys = {
        (f.frame, out.pass_name): out.cache_key
        for f in chunk.frames
        for out in f.outputs
        if out.kind == "exr"
    }
    assert catalog.existing_outputs(*SHOT) == keys
    assert set(catalog.existing_outputs(*SHOT, kind="pose_json")) == {
        (f, "pose") for f in range(1001, 1005)
    }
    counts = row_counts(catalog.engine)
    assert counts["outputs"] == 4 * OUTPUTS_PER_FRAME
    assert (counts["provenance"], counts["checkpoints"], counts["job_frames"]) == (1, 3, 4)


def test_rerecording_a_chunk_duplicates_nothing(catalog: Catalog, tmp_path: Path) -> None:
    spec, job_id = registered(catalog, tmp_path)
    first = make_chunk(spec, range(1001, 1005))
    catalog.record_chunk(job_id, first)
    catalog.record_chunk(job_id, make_chunk(spec, range(1005, 1009), chunk_index=1))
    before = row_counts(catalog.engine)
    old = queries.outputs_page(catalog.engine, *SHOT, limit=1000)[0]

    catalog.record_chunk(job_id, first)  # a Dask retry of the same chunk
    catalog.record_chunk(job_id, make_chunk(spec, range(1001, 1005), output_sha_salt="rewritten"))

    assert row_counts(catalog.engine) == before
    assert before["outputs"] == 8 * OUTPUTS_PER_FRAME
    assert before["outputs_checkpoints"] == 8 * (3 + 2 + 2 * 2)  # pose depends on pose + seg
    job = catalog.job(job_id)
    assert (job["frames_done"], job["frames_failed"], job["frames_skipped"]) == (8, 0, 0)
    new = {
        (o["uri"], o["part"], o["frame"]): o
        for o in queries.outputs_page(catalog.engine, *SHOT, limit=1000)[0]
    }
    for o in old:
        updated = new[(o["uri"], o["part"], o["frame"])]
        assert updated["id"] == o["id"]
        if o["frame"] <= 1004:
            assert updated["sha256"] != o["sha256"]
            assert updated["created_at"] > o["created_at"]
        else:
            assert updated == o


def test_failed_frame_is_recorded_and_listed(catalog: Catalog, tmp_path: Path) -> None:
    spec, job_id = registered(catalog, tmp_path)
    error = "FrameError: sh0010_plate.1003.exr: truncated EXR (read 1.2 MB of 50 MB)"
    catalog.record_chunk(job_id, make_chunk(spec, range(1001, 1005), failed={1003: error}))

    (job,) = queries.jobs_page(catalog.engine, *SHOT, status="running")[0]
    assert json.loads(json.dumps(job)) == job
    assert job["id"] == job_id
    assert job["failed_frames"] == [{"frame": 1003, "error": error}]
    assert (job["frames_done"], job["frames_failed"]) == (3, 1)
    assert (1003, "normal") not in catalog.existing_outputs(*SHOT)

    catalog.record_chunk(job_id, make_chunk(spec, range(1003, 1004)))  # the retry succeeds
    catalog.finish_job(job_id, "partial", message="4 of 8 frames")
    assert queries.jobs_page(catalog.engine, status="running")[0] == []
    (job,) = queries.jobs_page(catalog.engine, status="partial")[0]
    assert (job["frames_done"], job["frames_failed"], job["failed_frames"]) == (4, 0, [])
    assert job["message"] == "4 of 8 frames"
    assert job["finished_at"] >= job["started_at"]


def test_skipped_frames_and_job_updates(catalog: Catalog, tmp_path: Path) -> None:
    spec, job_id = registered(catalog, tmp_path)
    catalog.record_chunk(job_id, make_chunk(spec, range(1001, 1003)))
    catalog.record_skipped(job_id, [1002, 1003, 1004])
    catalog.record_skipped(job_id, [1003, 1004])
    job = catalog.job(job_id)
    assert (job["frames_done"], job["frames_skipped"]) == (2, 2)  # 1002 stays done
    catalog.set_flow_run(job_id, "flow-run-2")
    assert catalog.job(job_id)["flow_run_id"] == "flow-run-2"

    with pytest.raises(ValueError, match="unknown job status 'done'"):
        catalog.finish_job(job_id, "done")
    with pytest.raises(LookupError, match="no job 999999"):
        catalog.finish_job(999999, "complete")
    with pytest.raises(LookupError, match="no job 999999"):
        catalog.record_chunk(999999, make_chunk(spec, [1001]))
    with pytest.raises(LookupError):
        catalog.job(999999)
    with pytest.raises(ValueError, match="lists no frames"):
        catalog.register_job(spec, make_plate(spec, []), None)
    bad = make_chunk(spec, [1005])
    bad.frames[0].status = "exploded"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="frame 1005: unknown status 'exploded'"):
        catalog.record_chunk(job_id, bad)
    assert catalog.job(job_id)["frames_done"] == 2


def test_reregistered_plate_forgets_checksums_of_changed_frames(
    catalog: Catalog, tmp_path: Path
) -> None:
    spec, job_id = registered(catalog, tmp_path, frames=range(1001, 1003))
    catalog.record_chunk(job_id, make_chunk(spec, range(1001, 1003)))
    plate = make_plate(spec, range(1001, 1003))
    catalog.register_job(spec, plate, None)  # same files: checksums kept
    assert {f: v[2] for f, v in catalog.known_plate_frames(*SHOT, spec.plate).items()} == {
        1001: plate_sha("sh0010", 1001),
        1002: plate_sha("sh0010", 1002),
    }
    repulled = dataclasses.replace(
        plate, fingerprints={**plate.fingerprints, 1001: (50_001_001, "50001001:1800000000")}
    )
    catalog.register_job(spec, repulled, None)
    known = catalog.known_plate_frames(*SHOT, spec.plate)
    assert known[1001] == (50_001_001, "50001001:1800000000", None)
    assert known[1002][2] == plate_sha("sh0010", 1002)


def test_concurrent_writers_lose_no_updates(catalog: Catalog, tmp_path: Path) -> None:
    spec, job_id = registered(catalog, tmp_path, frames=range(1001, 1041))
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        try:
            start.wait()
            frames = range(1001 + index * 10, 1011 + index * 10)
            for n in range(0, 10, 2):
                chunk = make_chunk(
                    spec, frames[n : n + 2], chunk_index=index * 5 + n, failed={frames[-1]: "OOM"}
                )
                catalog.record_chunk(job_id, chunk)
                catalog.record_chunk(job_id, chunk)  # retried
            # a second job for the same new shot, registered by every thread at once
            other = make_spec(tmp_path, shot="sh0990")
            catalog.register_job(other, make_plate(other, range(1, 4)), None)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    job = catalog.job(job_id)
    assert (job["frames_done"], job["frames_failed"]) == (36, 4)
    assert sorted(f["frame"] for f in job["failed_frames"]) == [1010, 1020, 1030, 1040]
    counts = row_counts(catalog.engine)
    assert counts["outputs"] == 36 * OUTPUTS_PER_FRAME
    assert (counts["shots"], counts["plates"], counts["jobs"], counts["provenance"]) == (2, 2, 5, 1)
    assert counts["job_frames"] == 40


def test_writer_stalled_before_commit_does_not_stale_counters(
    catalog: Catalog, tmp_path: Path
) -> None:
    """The race behind lost counts, made certain: writer A has updated the job row but not
    committed when writer B records its chunk. B must wait for A (job row lock on PostgreSQL,
    BEGIN IMMEDIATE on SQLite) rather than count from a snapshot without A's frames."""
    spec, job_id = registered(catalog, tmp_path)
    stalled = threading.Event()

    def stall(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if threading.current_thread().name == "writer-a" and statement.startswith("UPDATE jobs"):
            stalled.set()
            time.sleep(0.4)

    event.listen(catalog.engine, "after_cursor_execute", stall)
    writer_a = threading.Thread(
        target=catalog.record_chunk,
        args=(job_id, make_chunk(spec, range(1001, 1005))),
        name="writer-a",
    )
    writer_a.start()
    assert stalled.wait(10)
    # no checkpoint rows in common with A, so nothing but the job lock makes B wait
    chunk_b = dataclasses.replace(
        make_chunk(spec, range(1005, 1009), chunk_index=1), checkpoints={}
    )
    catalog.record_chunk(job_id, chunk_b)
    writer_a.join(10)
    event.remove(catalog.engine, "after_cursor_execute", stall)
    assert catalog.job(job_id)["frames_done"] == 8


# -- reading ---------------------------------------------------------------------------------
def test_shot_coverage(catalog: Catalog, tmp_path: Path) -> None:
    spec, job_id = registered(catalog, tmp_path)
    catalog.record_chunk(job_id, make_chunk(spec, range(1001, 1006), failed={1005: "OOM"}))
    _, other_job = registered(catalog, tmp_path, frames=range(1, 4), shot="sh0020")
    catalog.finish_job(other_job, "failed", "no GPU")

    coverage = queries.shots_page(catalog.engine, show="demo")[0]
    assert json.loads(json.dumps(coverage)) == coverage
    assert [c["shot"] for c in coverage] == ["sh0010", "sh0020"]
    assert coverage[0]["plate_frames"] == 8
    assert coverage[0]["passes"] == {"normal": 4, "pose": 4, "seg": 4}  # pose: its JSON record
    assert (coverage[0]["job_id"], coverage[0]["job_status"]) == (job_id, "running")
    assert coverage[1] | {"plate": None} == {
        "show": "demo",
        "sequence": "sq010",
        "shot": "sh0020",
        "plate": None,
        "plate_frames": 3,
        "passes": {},
        "job_id": other_job,
        "job_status": "failed",
    }

    # a new plate for the first shot becomes the one counted; passes count across versions
    plate2 = make_spec(tmp_path, plate=f"{tmp_path}/plates/sh0010/v2/sh0010_plate.####.exr")
    catalog.register_job(plate2, make_plate(plate2, range(1001, 1011)), None)
    (first,) = queries.shots_page(catalog.engine, shot="sh0010")[0]
    assert first["plate"] == plate2.plate
    assert (first["plate_frames"], first["job_status"]) == (10, "running")
    assert first["passes"] == {"normal": 4, "pose": 4, "seg": 4}
    assert len(queries.shots_page(catalog.engine, limit=1, offset=1)[0]) == 1


def test_shot_outputs_newest_first(catalog: Catalog, tmp_path: Path) -> None:
    spec, job1 = registered(catalog, tmp_path)
    catalog.record_chunk(job1, make_chunk(spec, range(1001, 1003)))
    spec2 = make_spec(tmp_path, version="v002")
    job2 = catalog.register_job(spec2, make_plate(spec2, range(1001, 1009)), None)
    new_normal = {**CHECKPOINTS, "normal": checkpoint("normal", version=2)}
    catalog.record_chunk(job2, make_chunk(spec2, [1001], checkpoints=new_normal))

    outputs = queries.outputs_page(catalog.engine, *SHOT, limit=1000)[0]
    assert len(outputs) == 3 * OUTPUTS_PER_FRAME
    stamps = [o["created_at"] for o in outputs]
    assert stamps == sorted(stamps, reverse=True)
    assert {o["job_id"] for o in outputs[:OUTPUTS_PER_FRAME]} == {job2}

    normal = queries.outputs_page(catalog.engine, *SHOT, pass_name="normal", kind="exr")[0]
    assert [(o["frame"], o["job_id"], o["part"]) for o in normal] == [
        (1001, job2, "N"),
        (1002, job1, "N"),
        (1001, job1, "N"),
    ]
    assert normal[0]["checkpoint_sha256"] == new_normal["normal"]["sha256"]
    page = queries.outputs_page(catalog.engine, *SHOT, limit=5, offset=5)[0]
    assert page == outputs[5:10]
    newest = catalog.existing_outputs(*SHOT)
    assert newest[(1001, "normal")] == normal[0]["cache_key"] != normal[-1]["cache_key"]


def test_pages_give_their_total_and_count_only_when_the_page_cannot_tell(
    catalog: Catalog, tmp_path: Path
) -> None:
    spec, job_id = registered(catalog, tmp_path)
    catalog.record_chunk(job_id, make_chunk(spec, range(1001, 1004)))
    all_outputs = 3 * OUTPUTS_PER_FRAME
    counted: list[str] = []
    event.listen(
        catalog.engine,
        "before_cursor_execute",
        lambda _c, _cur, stmt, *_: counted.append(stmt) if "count(*)" in stmt else None,
    )
    items, total = queries.outputs_page(catalog.engine, *SHOT, limit=1000)
    assert (len(items), total, counted) == (all_outputs, all_outputs, [])  # a short first page
    exrs, total = queries.outputs_page(catalog.engine, *SHOT, kind="exr")
    assert (total, counted) == (len(exrs), [])
    items, total = queries.outputs_page(catalog.engine, *SHOT, kind="exr", limit=2, offset=1)
    assert (items, total, len(counted)) == (exrs[1:3], len(exrs), 1)
    assert queries.jobs_page(catalog.engine, limit=1)[1] == 1
    assert queries.shots_page(catalog.engine, "demo", limit=1, offset=1) == ([], 1)
    assert queries.invalidated_page(catalog.engine, plate_sha("sh0010", 1002), limit=1)[1] == 7
    with pytest.raises(ValueError, match="must not be negative"):
        queries.jobs_page(catalog.engine, limit=-1)


def test_output_provenance_by_path(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, job_id = registered(catalog, tmp_path)
    catalog.record_chunk(job_id, make_chunk(spec, range(1001, 1004)))
    path = exr_uri(spec, 1002)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    spellings = [
        path,
        os.path.relpath(path),  # ../out/...
        f"file://{path}",
        path.replace("/out/", "/out/./sh0010/../"),
    ]
    results = [queries.output_provenance(catalog.engine, p) for p in spellings]
    assert all(r == results[0] for r in results)
    found = results[0]
    assert found is not None
    assert json.loads(json.dumps(found)) == found  # JSON-friendly as it is
    assert found["uri"] == path
    assert [(o["pass_name"], o["part"], o["frame"]) for o in found["outputs"]] == [
        ("normal", "N", 1002),
        ("seg", "seg", 1002),
    ]
    assert {c["sha256"] for c in found["checkpoints"]} == {
        CHECKPOINTS["normal"]["sha256"],
        CHECKPOINTS["seg"]["sha256"],
    }
    (prov,) = found["provenance"]
    assert prov["data"]["torch"] == "2.13.0"
    assert prov["data"]["colour"]["source"] == "ARRI LogC3 (EI800)"
    assert prov["data"]["checkpoints"]["pose"]["sha256"] == CHECKPOINTS["pose"]["sha256"]
    (job,) = found["jobs"]
    assert (job["id"], job["submitter"], job["flow_run_id"]) == (job_id, "alice", "flow-run-1")
    assert job["spec"]["shot"] == "sh0010"
    assert found["plate_frames"] == [
        {
            "frame": 1002,
            "uri": spec.plate.replace("####", "1002"),
            "sha256": plate_sha("sh0010", 1002),
            "size_bytes": 50_001_002,
            "fingerprint": "50001002:1700000001",
        }
    ]

    pose = queries.output_provenance(
        catalog.engine, f"{spec.output_root}/sh0010/v001/pose/sh0010.1001.json"
    )
    assert pose is not None
    assert set(pose["outputs"][0]["checkpoints"]) == {
        CHECKPOINTS["pose"]["sha256"],
        CHECKPOINTS["seg"]["sha256"],
    }
    zarr = f"{spec.output_root}/sh0010/v001/passes.zarr/normal"
    zarr_found = queries.output_provenance(catalog.engine, zarr, frame=1003)
    assert zarr_found is not None
    assert [o["frame"] for o in zarr_found["outputs"]] == [1003]
    assert queries.output_provenance(catalog.engine, f"{tmp_path}/nothing.exr") is None


def test_invalidated_by(catalog: Catalog, tmp_path: Path) -> None:
    spec, job_id = registered(catalog, tmp_path)
    catalog.record_chunk(job_id, make_chunk(spec, range(1001, 1004)))

    by_plate = queries.invalidated_page(catalog.engine, plate_sha256=plate_sha("sh0010", 1002))[0]
    assert len(by_plate) == OUTPUTS_PER_FRAME
    assert {o["frame"] for o in by_plate} == {1002}

    seg = CHECKPOINTS["seg"]["sha256"]
    by_seg = queries.invalidated_page(catalog.engine, checkpoint_sha256=seg)[0]
    assert {o["pass_name"] for o in by_seg} == {"seg", "pose"}  # pose found people with seg
    assert len(by_seg) == 3 * 4
    by_normal = queries.invalidated_page(
        catalog.engine, checkpoint_sha256=CHECKPOINTS["normal"]["sha256"]
    )[0]
    assert {o["pass_name"] for o in by_normal} == {"normal"}
    assert len(by_normal) == 3 * 3
    both = queries.invalidated_page(
        catalog.engine, plate_sha256=plate_sha("sh0010", 1001), checkpoint_sha256=seg
    )[0]
    assert len(both) == 12 + 3  # seg/pose of all frames, plus frame 1001's normal outputs
    assert (
        queries.invalidated_page(catalog.engine, checkpoint_sha256=seg, limit=5, offset=10)[0]
        == by_seg[10:]
    )
    with pytest.raises(ValueError, match="needs plate_sha256 or checkpoint_sha256"):
        queries.invalidated_page(catalog.engine)

    # re-running with a new seg checkpoint moves those outputs off the old one
    new_seg = {**CHECKPOINTS, "seg": checkpoint("seg", version=2)}
    catalog.record_chunk(job_id, make_chunk(spec, range(1001, 1004), checkpoints=new_seg))
    assert queries.invalidated_page(catalog.engine, checkpoint_sha256=seg)[0] == []
    assert (
        len(queries.invalidated_page(catalog.engine, checkpoint_sha256=new_seg["seg"]["sha256"])[0])
        == 12
    )


def test_queries_accept_session_and_connection(catalog: Catalog, tmp_path: Path) -> None:
    spec, job_id = registered(catalog, tmp_path)
    catalog.record_chunk(job_id, make_chunk(spec, [1001]))
    expected = queries.jobs_page(catalog.engine)[0]
    with Session(catalog.engine) as session:
        assert queries.jobs_page(session)[0] == expected
    with catalog.engine.connect() as conn:
        assert (
            queries.outputs_page(conn, *SHOT)[0] == queries.outputs_page(catalog.engine, *SHOT)[0]
        )


def test_injection_looking_filters_match_nothing(catalog: Catalog, tmp_path: Path) -> None:
    spec, job_id = registered(catalog, tmp_path)
    catalog.record_chunk(job_id, make_chunk(spec, [1001]))
    for evil in ("x' OR '1'='1", "'; DROP TABLE jobs; --", "%", "sh0010' --", 'demo" OR 1=1 --'):
        _match_nothing(catalog, spec.plate, evil)
    assert len(queries.jobs_page(catalog.engine)[0]) == 1  # nothing was dropped or changed
    assert len(queries.outputs_page(catalog.engine, *SHOT)[0]) == OUTPUTS_PER_FRAME


def _match_nothing(catalog: Catalog, plate: str, evil: str) -> None:
    engine = catalog.engine
    assert queries.shots_page(engine, show=evil)[0] == []
    assert queries.shots_page(engine, shot=evil)[0] == []
    assert queries.outputs_page(engine, "demo", "sq010", evil)[0] == []
    assert queries.outputs_page(engine, *SHOT, pass_name=evil)[0] == []
    assert queries.jobs_page(engine, status=evil)[0] == []
    assert queries.jobs_page(engine, sequence=evil)[0] == []
    assert queries.invalidated_page(engine, plate_sha256=evil, checkpoint_sha256=evil)[0] == []
    assert queries.output_provenance(engine, evil) is None
    assert catalog.known_plate_frames("demo", "sq010", evil, plate) == {}
    assert catalog.known_plate_frames(*SHOT, evil) == {}
    assert catalog.existing_outputs(*SHOT, kind=evil) == {}
