"""What the outputs occupy: the catalog's usage per show, shot, version folder and pass (each
file once: a multi-part EXR's parts, a Zarr array's frames), deleted versions not counted;
`svfx catalog usage` with ``--verify`` against real files on disk; the API and the pages."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, update
from typer.testing import CliRunner, Result

from cli.main import app as svfx_app
from schemas.catalog import Catalog, queries
from schemas.catalog import models as m
from schemas.spec import ShotSpec
from schemas.summaries import ChunkSummary, FrameSummary, OutputRecord
from tasks.output_paths import ShotOutputPaths
from tests import api_fixtures, catalog_fixtures
from tests.api_fixtures import Filled
from tests.catalog_fixtures import (
    CHECKPOINTS,
    COLOUR,
    ENVIRONMENT,
    TILING,
    make_plate,
    make_spec,
    sha,
)

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
filled = api_fixtures.filled

runner = CliRunner()
FRAMES = (1001, 1002, 1003)
EXR_BYTES, ZARR_REGION, PREVIEW_BYTES = 700, 48, 90


def _write(path: str, size: int) -> int:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(b"x" * size)
    return size


def _record(uri: str, pass_name: str, frame: int, kind: str, size: int, part: str | None = None):
    return OutputRecord(
        pass_name, frame, kind, uri, sha(f"{uri} {part} {frame}"), size, (1,), "u1", part, "k"
    )  # type: ignore[arg-type]


def _version(
    catalog: Catalog, spec: ShotSpec, frames: tuple[int, ...] = FRAMES, exr_bytes: int = EXR_BYTES
) -> tuple[int, ShotOutputPaths]:
    """A version written for real in its folder: per frame a two-part EXR (normal, seg), a
    normal preview and a region of the normal Zarr array (the store's files on disk are
    smaller, as compressed ones are); recorded as a worker would."""
    paths = ShotOutputPaths.for_shot(
        str(spec.output_root), spec.show, spec.sequence, spec.shot, spec.version
    )
    job = catalog.register_job(spec, make_plate(spec, frames), "run", output_root=paths.root)
    summaries = []
    for frame in frames:
        exr = paths.exr(frame)
        size = _write(exr, exr_bytes)
        preview = paths.preview("normal", frame)
        _write(preview, PREVIEW_BYTES)
        zarr = f"{paths.zarr}/normal"
        _write(f"{zarr}/c/{frame}", 20)  # compressed: fewer bytes than the region
        outputs = [
            _record(exr, "normal", frame, "exr", size, "N"),
            _record(exr, "seg", frame, "exr", size, "seg"),
            _record(preview, "normal", frame, "preview", PREVIEW_BYTES),
            _record(zarr, "normal", frame, "zarr", ZARR_REGION),
        ]
        plate = spec.plate.replace("####", f"{frame:04d}")
        plate_sha = catalog_fixtures.plate_sha(spec.shot, frame)
        summaries.append(
            FrameSummary(frame, plate, "done", plate_sha, outputs=outputs, cache_key="k")
        )
    _write(f"{paths.zarr}/zarr.json", 10)  # the group's metadata: not catalogued
    _write(paths.nuke_script, 30)  # not catalogued by design
    _write(paths.frame_record(frames[0]), 12)
    used = {p: CHECKPOINTS[p] for p in ("normal", "seg")}
    chunk = ChunkSummary(0, summaries, "w", ENVIRONMENT, used, COLOUR, TILING)
    catalog.record_chunk(job, chunk)
    catalog.finish_job(job, "complete")
    return job, paths


def _per_version(frames: int, exr_bytes: int = EXR_BYTES) -> int:
    return frames * (exr_bytes + PREVIEW_BYTES + ZARR_REGION)


def _delete(catalog: Catalog, job: int, root: str) -> None:
    """Mark a version's outputs deleted, as a delete records it."""
    with catalog.engine.begin() as conn:
        shot_id = conn.execute(m.Job.__table__.select().where(m.Job.id == job)).one().shot_id
        deletion = conn.execute(
            insert(m.Deletion).values(
                shot_id=shot_id, version="v001", output_root=root, requested_by="t", reason="t"
            )
        ).inserted_primary_key[0]
        conn.execute(update(m.Output).where(m.Output.job_id == job).values(deletion_id=deletion))


@pytest.fixture
def studio(catalog: Catalog, tmp_path: Path) -> dict[str, Any]:
    """Two versions of demo/sq010/sh0010 (v001 written twice: a resubmit), one of sh0020,
    one of other/sq020/sh0100."""
    a1 = make_spec(tmp_path, "sh0010", output_root=f"{tmp_path}/out")
    jobs = {"a1": _version(catalog, a1)[0]}
    jobs["a1 again"], paths = _version(catalog, a1)  # same folder, same files: counted once
    a2 = make_spec(tmp_path, "sh0010", output_root=f"{tmp_path}/out", version="v002")
    jobs["a2"], paths2 = _version(catalog, a2, frames=(1001, 1002))
    b = make_spec(tmp_path, "sh0020", output_root=f"{tmp_path}/out")
    jobs["b"], _ = _version(catalog, b, frames=(1001,))
    c = make_spec(tmp_path, "sh0100", show="other", sequence="sq020", output_root=f"{tmp_path}/out")
    jobs["c"], _ = _version(catalog, c, frames=(1,))
    return {"jobs": jobs, "v001": paths, "v002": paths2, "root": tmp_path}


def test_usage_counts_each_file_once_per_show_shot_version_and_pass(
    catalog: Catalog, studio: dict[str, Any]
) -> None:
    bind = catalog.engine
    shows = {r["show"]: r for r in queries.usage(bind, level="show")}
    assert shows["demo"]["size_bytes"] == _per_version(3) + _per_version(2) + _per_version(1)
    assert shows["demo"]["files"] == 3 * 3 + 2 * 3 + 1 * 3  # EXR, preview, Zarr frame
    assert shows["other"]["size_bytes"] == _per_version(1)

    shots = queries.usage(bind, "demo", level="shot")
    assert [(r["shot"], r["size_bytes"]) for r in shots] == [
        ("sh0010", _per_version(3) + _per_version(2)),
        ("sh0020", _per_version(1)),
    ]

    versions = queries.usage(bind, "demo", "sq010", "sh0010")
    assert [(r["folder"], r["version"], r["size_bytes"]) for r in versions] == [
        ("sapiens2_v001", "v001", _per_version(3)),
        ("sapiens2_v002", "v002", _per_version(2)),
    ]
    assert versions[0]["job_id"] == studio["jobs"]["a1 again"]  # the folder's newest job

    per_pass = queries.usage(bind, "demo", "sq010", "sh0010", passes=True)
    v1 = {(r["pass_name"], r["kind"]): r for r in per_pass if r["folder"] == "sapiens2_v001"}
    assert v1[(None, "exr")]["size_bytes"] == 3 * EXR_BYTES  # one file holds normal and seg
    assert v1[("normal", "preview")]["files"] == 3
    assert v1[("normal", "zarr")]["size_bytes"] == 3 * ZARR_REGION


def test_deleted_versions_are_not_counted(catalog: Catalog, studio: dict[str, Any]) -> None:
    _delete(catalog, studio["jobs"]["a2"], studio["v002"].root)
    versions = queries.usage(catalog.engine, "demo", "sq010", "sh0010")
    assert [r["folder"] for r in versions] == ["sapiens2_v001"]
    assert queries.usage(catalog.engine, "demo", level="shot")[0]["size_bytes"] == _per_version(3)


def _svfx(monkeypatch: pytest.MonkeyPatch, catalog_url: str, home: Path, *args: str) -> Result:
    monkeypatch.setenv("SVFX_HOME", str(home))
    monkeypatch.setenv("SVFX_CATALOG_URL", catalog_url)
    monkeypatch.setenv("PREFECT_HOME", str(home / "prefect"))
    for name in ("SVFX_OUTPUT_ROOT", "SVFX_CONFIG", "SVFX_ALLOWED_ROOTS"):
        monkeypatch.delenv(name, raising=False)
    return runner.invoke(svfx_app, ["catalog", "usage", *args])


def _why(result: Result) -> str:
    text = f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    if result.exc_info and not isinstance(result.exception, SystemExit):
        text += "".join(traceback.format_exception(*result.exc_info))
    return text


def test_cli_usage_tables_and_json(
    catalog_url: str, studio: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = studio["root"] / "home"
    shown = _svfx(monkeypatch, catalog_url, home)
    assert shown.exit_code == 0, _why(shown)
    assert "demo" in shown.stdout and "other" in shown.stdout and "total:" in shown.stdout
    found = _svfx(monkeypatch, catalog_url, home, "demo/sq010/sh0010", "--json")
    assert found.exit_code == 0, _why(found)
    rows = json.loads(found.stdout)
    assert [r["folder"] for r in rows] == ["sapiens2_v001", "sapiens2_v002"]
    by_pass = _svfx(monkeypatch, catalog_url, home, "demo", "--by", "pass", "--json")
    assert {r["kind"] for r in json.loads(by_pass.stdout)} == {"exr", "preview", "zarr"}


def test_cli_verify_names_what_differs(
    catalog_url: str, studio: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = studio["root"] / "home"
    clean = _svfx(monkeypatch, catalog_url, home, "demo/sq010/sh0010", "--verify", "--json")
    assert clean.exit_code == 0, _why(clean)
    checks = json.loads(clean.stdout)["verify"]
    assert [c["differs"] for c in checks] == [False, False]
    v1 = checks[0]
    assert v1["catalog_bytes"] == _per_version(3)
    assert v1["disk_bytes"] == 3 * (EXR_BYTES + PREVIEW_BYTES + 20)  # Zarr as stored
    assert v1["expected_files"] == 3  # zarr.json, the Nuke script, a frame record

    paths: ShotOutputPaths = studio["v001"]
    Path(paths.exr(1002)).unlink()
    Path(paths.preview("normal", 1003)).write_bytes(b"y" * 5)
    _write(f"{paths.root}/stray.bin", 64)
    differs = _svfx(monkeypatch, catalog_url, home, "demo/sq010/sh0010", "--verify")
    assert differs.exit_code == 2, _why(differs)
    said = differs.stderr
    assert paths.root in said and "sapiens2_v002" not in said
    name = Path(paths.exr(1002)).name
    assert f"1 catalogued missing ({name})" in said
    assert "previews/normal/" in said and "90 -> 5 bytes" in said
    assert "1 unknown to the catalog (stray.bin)" in said
    report = json.loads(
        _svfx(monkeypatch, catalog_url, home, "demo/sq010/sh0010", "--verify", "--json").stdout
    )["verify"][0]
    assert report["unknown"] == ["stray.bin"] and report["unknown_bytes"] == 64


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("demo/../etc", "'..'"),
        ("demo/sq010/sh0010/extra", "4 parts"),
        ("nosuchshow", "no shot under nosuchshow"),
        ("demo/sq010/sh9999", "no shot under demo/sq010/sh9999"),
    ],
)
def test_cli_usage_refuses_bad_paths(
    catalog_url: str,
    studio: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    why: str,
) -> None:
    refused = _svfx(monkeypatch, catalog_url, studio["root"] / "home", path)
    assert refused.exit_code == 2, _why(refused)
    assert why in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert not refused.stdout


def test_api_usage_and_pages(filled: Filled) -> None:
    client = filled.client
    shows = client.get("/api/usage").json()
    assert shows["by"] == "show" and {i["show"] for i in shows["items"]} == {"demo", "other"}
    assert shows["size_bytes"] == sum(i["size_bytes"] for i in shows["items"]) > 0
    shot = client.get(
        "/api/usage", params={"show": "demo", "sequence": "sq010", "shot": "sh0010", "by": "pass"}
    )
    assert shot.status_code == 200, shot.text
    items = shot.json()["items"]
    assert {(i["pass_name"], i["kind"]) for i in items} >= {(None, "exr"), ("pose", "pose_json")}
    assert client.get("/api/usage", params={"show": "nosuch"}).status_code == 404
    assert client.get("/api/usage", params={"shot": "sh0010"}).status_code == 200
    assert client.get("/api/usage", params={"sequence": "nope"}).status_code == 404
    assert client.get("/api/usage", params={"by": "planet"}).status_code == 422
    assert "/api/usage" in client.get("/openapi.json").json()["paths"]

    page = client.get("/shots/demo/sq010/sh0010")
    assert page.status_code == 200 and "Disk usage" in page.text
    assert "several (multi-part EXR)" in page.text
    listing = client.get("/usage", params={"show": "demo"})
    assert listing.status_code == 200 and "sh0020" in listing.text
