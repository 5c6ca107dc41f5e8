"""Latency of the catalog API over a catalog of 10,000 outputs, on SQLite and PostgreSQL.

Fills a catalog (100 shots x 20 frames x 5 passes: normal, seg, matte and albedo EXR parts
and a pose JSON per frame; every tenth shot has a failed frame) through the Catalog writer,
serves it with uvicorn in a separate process on loopback and times requests with httpx
(p50/p99 in ms), then the same requests through the in-process TestClient. PostgreSQL gets a
database of its own (created and dropped) on the server at --pg.

    python -m bench.api                      # SQLite and PostgreSQL, 200 requests each
    python -m bench.api --requests 500 --no-postgres
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import free_port, full_frame_plate, pg_database
from schemas.catalog import Catalog, open_catalog
from schemas.settings import Settings
from schemas.spec import ShotSpec
from schemas.summaries import ChunkSummary, FrameSummary, OutputRecord

PASSES = ("normal", "seg", "matte", "albedo", "pose")
PARTS = {"normal": "N", "seg": "seg", "matte": "matte", "albedo": "albedo"}
PG_DATABASE = "svfx_bench_api"
ENVIRONMENT = {
    "platform_version": "0.1.0",
    "torch": "2.13.0",
    "cuda": "12.8",
    "device": "cuda:0",
    "precision": "bf16",
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _spec(root: Path, index: int) -> ShotSpec:
    show = f"show{index % 4}"
    shot = f"sh{index:04d}"
    return ShotSpec(
        plate=f"{root}/plates/{shot}/{shot}.####.exr",
        show=show,
        sequence=f"sq{index // 10:03d}",
        shot=shot,
        passes=PASSES,
        output_root=f"{root}/out",
        submitter="bench",
    )


def _chunk(spec: ShotSpec, frames: range, failed: set[int]) -> ChunkSummary:
    checkpoints = {
        p: {"sha256": _sha(f"ckpt {p}"), "arch": "sapiens2_1b", "task": p, "trained": True}
        for p in PASSES
    }
    out = f"{spec.output_root}/{spec.show}/{spec.sequence}/{spec.shot}/sapiens2_v001"
    summaries = []
    for frame in frames:
        common = {"frame": frame, "plate_uri": spec.plate.replace("####", f"{frame:04d}")}
        psha = _sha(f"{spec.shot_path} {frame}")
        if frame in failed:
            error = f"frame {frame}: not an OpenEXR file"
            summaries.append(FrameSummary(**common, status="failed", error=error))
            continue
        exr = f"{out}/{spec.shot}_sapiens2_v001.{frame:04d}.exr"
        outputs = [
            OutputRecord(
                p, frame, "exr", exr, _sha(f"{exr} {p}"), 10**7, (2160, 4096, 3), "half", PARTS[p]
            )
            for p in PARTS
        ]
        pose = f"{out}/pose/{spec.shot}.{frame:04d}.json"
        outputs.append(OutputRecord("pose", frame, "pose_json", pose, _sha(pose), 900, (1,), "f4"))
        summaries.append(FrameSummary(**common, status="done", plate_sha256=psha, outputs=outputs))
    return ChunkSummary(
        chunk_index=0,
        frames=summaries,
        worker="bench:1",
        environment=ENVIRONMENT,
        checkpoints=checkpoints,
        colour={"source": "ACEScg", "target": "sRGB - Display"},
        tiling={"tile_height": 1024, "tile_width": 768, "overlap": 128},
    )


def fill(catalog: Catalog, root: Path, shots: int, frames: int) -> list[str]:
    """Record the shots; returns one EXR path per shot (for provenance look-ups)."""
    paths = []
    for index in range(shots):
        spec = _spec(root, index)
        failed = {1000 + frames + 1} if index % 10 == 0 else set()
        numbers = range(1001, 1001 + frames + len(failed))
        plate = full_frame_plate(spec.plate, numbers, (4096, 2160), "ACEScg")
        job_id = catalog.register_job(spec, plate, f"flow-run-{index}")
        chunk = _chunk(spec, numbers, failed)
        catalog.record_chunk(job_id, chunk)
        catalog.finish_job(job_id, "partial" if failed else "complete")
        paths.append(chunk.frames[frames // 2].outputs[0].uri)
    return paths


def _serve(url: str, root: str, port: int) -> None:
    import logging

    import uvicorn

    from api.app import create_app

    logging.getLogger("alembic").setLevel(logging.WARNING)
    settings = Settings(home=Path(root) / "home", catalog_url=url, allowed_roots=[root])
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning")


@contextlib.contextmanager
def served(url: str, root: Path) -> Iterator[str]:
    """The API over ``url`` in a uvicorn process of its own; yields its base URL."""
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(url, str(root), port), daemon=True
    )
    process.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{base}/api/shots?limit=1", timeout=5).status_code == 200:
                    break
            if not process.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.join(10)


def timings(get: Callable[[str], Any], urls: list[str], warmup: int = 20) -> list[float]:
    """Milliseconds per request, cycling through ``urls``."""
    for url in urls[:warmup]:
        get(url).raise_for_status()
    out = []
    for url in urls:
        start = time.perf_counter()
        get(url).raise_for_status()
        out.append((time.perf_counter() - start) * 1000)
    return out


def endpoints(paths: list[str], n: int) -> dict[str, list[str]]:
    shot = "show0/sq000/sh0000"
    return {
        "GET /api/shots": ["/api/shots"] * n,
        "GET /api/provenance?path=": [
            str(httpx.URL("/api/provenance", params={"path": paths[i % len(paths)]}))
            for i in range(n)
        ],
        "GET /api/shots/{shot}": [f"/api/shots/{shot}"] * n,
        "GET / (page)": ["/"] * n,
    }


def run(backend: str, url: str, root: Path, requests: int, shots: int, frames: int) -> list[dict]:
    catalog = open_catalog(url)
    start = time.perf_counter()
    paths = fill(catalog, root, shots, frames)
    fill_s = time.perf_counter() - start
    print(f"{backend}: {shots * frames * len(PASSES)} outputs recorded in {fill_s:.1f} s")
    rows = []
    todo = endpoints(paths, requests)
    with served(url, root) as base, httpx.Client(base_url=base, timeout=30) as client:
        for name, urls in todo.items():
            rows.append(_row(backend, name, "uvicorn + httpx", timings(client.get, urls)))
    from fastapi.testclient import TestClient

    from api.app import create_app

    settings = Settings(home=root / "home", catalog_url=url, allowed_roots=[str(root)])
    with TestClient(create_app(settings, engine=catalog.engine)) as client:
        for name, urls in todo.items():
            rows.append(_row(backend, name, "TestClient", timings(client.get, urls)))
    catalog.close()
    return rows


def _row(backend: str, endpoint: str, via: str, ms: list[float]) -> dict:
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return {
        "backend": backend,
        "endpoint": endpoint,
        "via": via,
        "n": len(ms),
        "p50": statistics.median(ms),
        "p99": cuts[98],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=200, help="timed requests per endpoint")
    p.add_argument("--shots", type=int, default=100)
    p.add_argument("--frames", type=int, default=20)
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--no-postgres", action="store_true")
    args = p.parse_args(argv)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "sqlite").mkdir()
        url = f"sqlite:///{root}/sqlite/catalog.db"
        rows += run("SQLite", url, root / "sqlite", args.requests, args.shots, args.frames)
        if not args.no_postgres:
            (root / "pg").mkdir()
            with pg_database(args.pg, PG_DATABASE) as pg_url:
                rows += run(
                    "PostgreSQL", pg_url, root / "pg", args.requests, args.shots, args.frames
                )
    print()
    print("| backend | endpoint | via | requests | p50 ms | p99 ms |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['backend']} | {r['endpoint']} | {r['via']} | {r['n']} "
            f"| {r['p50']:.2f} | {r['p99']:.2f} |"
        )


if __name__ == "__main__":
    main()
