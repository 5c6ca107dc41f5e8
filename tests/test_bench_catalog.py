"""The catalog bench (`python -m bench.catalog`) at a tiny size on the local PostgreSQL, so
that it cannot rot: the fill through the writer, every route of ROUTES answered, the CLI and
the planning timed, the figures written, and a kept fill reused. No timing is asserted."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from bench import catalog as bench
from bench.catalog_fill import drop_database, fill
from bench.catalog_studio import studio
from bench.catalog_timing import ROUTES
from tests.catalog_fixtures import pg_admin


def test_studio_is_deterministic_and_sized() -> None:
    shots = studio(10_000, seed=3)
    assert shots == studio(10_000, seed=3)
    assert len(shots) == 20
    assert 9_000 <= sum(s.outputs for s in shots) <= 11_000
    assert 150 <= sum(s.jobs for s in shots) <= 250
    assert len({s.path for s in shots}) == len(shots)


def test_bench_fills_times_every_route_and_reuses_a_kept_fill(tmp_path: Path) -> None:
    _user, admin = pg_admin()
    database = f"test_bench_{uuid.uuid4().hex[:12]}"
    figures = tmp_path / "figures.json"
    args = ["--outputs", "2000", "--database", database, "--pg", admin, "--workers", "1",
            "--requests", "2", "--clients", "2", "--repeats", "1", "--keep",
            "--json", str(figures)]  # fmt: skip
    try:
        bench.main(args)
        found = json.loads(figures.read_text())
        assert not found["fill"]["reused"]
        assert found["not_timed"] == []  # every GET route of the app has a row in ROUTES
        assert found["fill"]["outputs"] == sum(s.outputs for s in studio(2000, 2026))
        rows = {row["what"]: row for row in found["rows"]}
        for name, _path in ROUTES:
            expected = [404] if "not on disk" in name else [200]
            assert rows[name]["status"] == expected, (name, rows[name])
        assert {"svfx catalog shots", "svfx catalog outputs SHOT"} <= set(rows)
        assert any(name.startswith("resubmit planning") for name in rows)
        again = fill(admin, database, 2000, 2026, workers=1, chunk_frames=64)
        assert again.reused and again.outputs == found["fill"]["outputs"]
    finally:
        drop_database(admin, database)
