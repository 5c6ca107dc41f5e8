"""Catalog test fixtures: a fresh catalog per test on SQLite (a temporary file) and PostgreSQL
(a schema of its own in one per-session database), and builders for realistic summaries.

Bind the fixtures in a test module (``catalog = catalog_fixtures.catalog``, likewise
``catalog_url`` and ``pg_database_url``): pytest finds fixtures by module attribute name.
PostgreSQL must be reachable at 127.0.0.1:5432 with trust auth: when it is not, the
PostgreSQL parameters fail (CI has a server) instead of being skipped.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench.common import full_frame_plate
from schemas.catalog import Catalog, open_catalog
from schemas.catalog.engine import VERSION_TABLE, head_revision, make_engine
from schemas.catalog.models import Base
from schemas.settings import Settings
from schemas.spec import ShotSpec, cache_key
from schemas.summaries import ChunkSummary, FrameSummary, OutputRecord, PlateInfo

PG_HOST = "127.0.0.1:5432"
DIALECTS = ["sqlite", "postgresql"]


def pg_admin() -> tuple[str, str]:
    """(user, libpq URL of the maintenance database); fails the test when no server answers."""
    problems = []
    for user in ("postgres", "root"):
        url = f"postgresql://{user}@{PG_HOST}/postgres"
        try:
            psycopg.connect(url, connect_timeout=5).close()
        except psycopg.OperationalError as exc:
            problems.append(f"{user}: {str(exc).strip()}")
            continue
        return user, url
    pytest.fail(
        f"PostgreSQL at {PG_HOST} is unreachable (trust auth as postgres or root): "
        + "; ".join(problems),
        pytrace=False,
    )


@pytest.fixture(scope="session")
def pg_database_url() -> Iterator[str]:
    """A database ``test_<xdist worker>_<uuid>`` for this session (each pytest-xdist worker is
    a session of its own, so each has its own database), dropped at the end."""
    user, admin = pg_admin()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"test_{worker}_{uuid.uuid4().hex}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"postgresql+psycopg://{user}@{PG_HOST}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


def _pg_schema_url(database_url: str) -> str:
    """The database URL with a new, empty schema first on the search path."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    libpq = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    url = make_url(database_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


@pytest.fixture(params=DIALECTS)
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty catalog URL: a SQLite file in a directory that does not exist yet, or a fresh
    PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/db/catalog.db"
    return pg_schema_url(request)


def at_head_without_migrating(url: str) -> None:
    """Make the catalog's tables from the models and record the newest revision, as the
    migrations would leave them (test_catalog holds the two equal) in a tenth of the time:
    the tests that need a catalog get one this way, the migrations are tested on their own."""
    engine = make_engine(url)
    try:
        Base.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(
                text(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) PRIMARY KEY)")
            )
            conn.execute(
                text(f"INSERT INTO {VERSION_TABLE} VALUES (:head)"), {"head": head_revision()}
            )
    finally:
        engine.dispose()


@contextmanager
def opened_catalog(url: str) -> Iterator[Catalog]:
    """A new, empty catalog at ``url`` (see `at_head_without_migrating`), closed after."""
    at_head_without_migrating(url)
    cat = open_catalog(url)
    try:
        yield cat
    finally:
        cat.close()


def pg_schema_url(request: pytest.FixtureRequest) -> str:
    """A fresh PostgreSQL schema in this session's database."""
    return _pg_schema_url(request.getfixturevalue("pg_database_url"))


@pytest.fixture
def catalog(catalog_url: str) -> Iterator[Catalog]:
    with opened_catalog(catalog_url) as cat:
        yield cat


# -- builders ------------------------------------------------------------------------------
def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint(pass_name: str, version: int = 1, size: str = "0.4b") -> dict[str, Any]:
    return {
        "sha256": sha(f"checkpoint {pass_name} v{version}"),
        "arch": f"sapiens2_{size}",
        "task": pass_name,
        "path": f"/mnt/models/sapiens2/{pass_name}_{size}_v{version}.safetensors",
        "trained": True,
        "size_bytes": 1_600_000_000 + version,
    }


CHECKPOINTS = {p: checkpoint(p) for p in ("normal", "seg", "pose")}
ENVIRONMENT = {
    "platform": "sapiens-vfx 0.1.0",
    "python": "3.11.7",
    "torch": "2.13.0",
    "cuda": "12.8",
    "device": "NVIDIA H100 80GB HBM3",
    "precision": "bf16",
}
COLOUR = {
    "config_name": "studio-config-v2.2.0_aces-v1.3_ocio-v2.4",
    "source": "ARRI LogC3 (EI800)",
    "target": "sRGB - Display",
    "description": "LogC3 -> sRGB for the model input",
}
TILING = {"tile_height": 1024, "tile_width": 768, "overlap": 128}


def make_spec(root: Path, shot: str = "sh0010", **changes: Any) -> ShotSpec:
    values: dict[str, Any] = {
        "plate": f"{root}/plates/{shot}/{shot}_plate.####.exr",
        "show": "demo",
        "sequence": "sq010",
        "shot": shot,
        "passes": ("normal", "seg", "pose"),
        "output_root": f"{root}/out",
        "submitter": "alice",
    }
    return ShotSpec(**{**values, **changes})


def plate_sha(shot: str, frame: int, version: int = 1) -> str:
    return sha(f"plate {shot} {frame} v{version}")


def make_plate(spec: ShotSpec, frames: Iterable[int], version: int = 1) -> PlateInfo:
    frames = tuple(frames)
    fingerprints = {f: (50_000_000 + f, f"{50_000_000 + f}:{1700000000 + version}") for f in frames}
    return full_frame_plate(
        spec.plate,
        frames,
        (4448, 3096),
        "ARRI LogC3 (EI800)",
        guessed=True,
        fingerprints=fingerprints,
    )


def exr_uri(spec: ShotSpec, frame: int) -> str:
    return (
        f"{spec.output_root}/{spec.shot}/{spec.version}/{spec.shot}_{spec.version}.{frame:04d}.exr"
    )


def _output(
    pass_name: str,
    frame: int,
    key: str,
    salt: str,
    kind: str,
    uri: str,
    shape: tuple[int, ...],
    dtype: str,
    part: str | None = None,
) -> OutputRecord:
    return OutputRecord(
        pass_name=pass_name,
        frame=frame,
        kind=kind,  # type: ignore[arg-type]
        uri=uri,
        sha256=sha(f"{uri} {part} {frame} {salt}"),
        size_bytes=1000 + frame,
        shape=shape,
        dtype=dtype,
        part=part,
        cache_key=key,
    )


def make_chunk(
    spec: ShotSpec,
    frames: Iterable[int],
    *,
    chunk_index: int = 0,
    failed: Mapping[int, str] | None = None,
    checkpoints: Mapping[str, dict[str, Any]] = CHECKPOINTS,
    plate_version: int = 1,
    worker: str = "gpu-node-07:4242",
    output_sha_salt: str = "",
) -> ChunkSummary:
    """A chunk as a worker returns it: per frame one multi-part EXR (normal, seg), a preview
    per pass, a pose JSON and a normal region in a Zarr array; frames in ``failed`` carry
    their error and no outputs."""
    failed = failed or {}
    out = f"{spec.output_root}/{spec.shot}/{spec.version}"
    summaries = []
    for frame in frames:
        plate_uri = spec.plate.replace("####", f"{frame:04d}")
        psha = plate_sha(spec.shot, frame, plate_version)
        common = {
            "frame": frame,
            "plate_uri": plate_uri,
            "plate_sha256": psha,
            "plate_size": 50_000_000 + frame,
            "plate_fingerprint": f"{50_000_000 + frame}:{1700000000 + plate_version}",
        }
        if frame in failed:
            summaries.append(
                FrameSummary(**common, status="failed", error=failed[frame], timings={"read": 0.4})
            )
            continue
        outputs = []
        for pass_name in spec.passes:
            used = [pass_name, *(["seg"] if pass_name == "pose" else [])]
            key = cache_key(psha, [checkpoints[p]["sha256"] for p in used], spec.settings_digest())
            made = (pass_name, frame, key, output_sha_salt)
            if pass_name == "pose":
                pose_uri = f"{out}/pose/{spec.shot}.{frame:04d}.json"
                outputs.append(_output(*made, "pose_json", pose_uri, (17, 3), "float32"))
            else:
                part = {"normal": "N", "seg": "seg"}[pass_name]
                shape = (3096, 4448, 3)
                outputs.append(_output(*made, "exr", exr_uri(spec, frame), shape, "half", part))
            preview = f"{out}/preview/{pass_name}/{frame:04d}.jpg"
            outputs.append(_output(*made, "preview", preview, (540, 960, 3), "uint8"))
            if pass_name == "normal":
                zarr = f"{out}/passes.zarr/normal"
                outputs.append(_output(*made, "zarr", zarr, (3, 3096, 4448), "float16"))
        summaries.append(
            FrameSummary(
                **common,
                status="done",
                outputs=outputs,
                timings={"read": 0.4, "model": 1.9, "write": 0.3},
                cache_key=outputs[0].cache_key,
            )
        )
    return ChunkSummary(
        chunk_index=chunk_index,
        frames=summaries,
        worker=worker,
        environment=ENVIRONMENT,
        checkpoints={p: dict(checkpoints[p]) for p in spec.model_passes},
        colour=COLOUR,
        tiling=TILING,
        wall_s=12.5,
        model_s=9.1,
    )


# -- versions with their files on disk (delete, prune, usage) -----------------------------
VERSION_FRAMES = range(1001, 1005)


@pytest.fixture
def studio(tmp_path: Path) -> tuple[Path, Settings]:
    """A studio folder and settings that allow it (outputs of ``make_version`` go under it)."""
    root = tmp_path / "studio"
    root.mkdir()
    return root, Settings(home=root / "home", allowed_roots=[str(root)])


def folder_of(spec: ShotSpec) -> str:
    """The folder the fixture's outputs lie in (catalog_fixtures.make_chunk)."""
    return f"{spec.output_root}/{spec.shot}/{spec.version}"


def write_files(chunk: ChunkSummary) -> None:
    """Every output of the chunk as a small real file (a Zarr array: one chunk file)."""
    for frame in chunk.frames:
        for out in frame.outputs:
            path = Path(out.uri) / "c0" if out.kind == "zarr" else Path(out.uri)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 100)


def make_version(
    catalog: Catalog, root: Path, version: str = "v001", **changes: Any
) -> tuple[ShotSpec, int]:
    """A complete version of sh0010 (or ``shot=``) with its files on disk; (spec, job id)."""
    spec = make_spec(root, version=version, **changes)
    plate = make_plate(spec, VERSION_FRAMES)
    job_id = catalog.register_job(spec, plate, None, output_root=folder_of(spec))
    chunk = make_chunk(spec, VERSION_FRAMES)
    write_files(chunk)
    catalog.record_chunk(job_id, chunk)
    catalog.finish_job(job_id, "complete")
    return spec, job_id
