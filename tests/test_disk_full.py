"""A full disk while writing passes, with a real small tmpfs mounted where the shot's Zarr
store goes: the EXR of each frame is written (elsewhere) but its Zarr region cannot be.

Each frame fails alone with a message that names the output that could not be written (the
Zarr array, not the input plate) and the reason; what the frame's attempt had written (the
EXR) is removed, so the catalog and the disk agree: no file, no row. Once there is room, the
resubmit completes the shot. Skips where mounting a tmpfs is not allowed (needs root).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from flows.planning import plan_shot
from flows.shot_runner import create_store, run_planned_shot
from schemas.catalog import open_catalog, queries
from schemas.spec import parse_spec
from tests.shot_helpers import make_plate, settings_for, spec_data

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def small_disk(tmp_path):
    """Mounts a 64 KiB tmpfs at a path given later; unmounts at the end."""
    mounted: list[Path] = []

    def mount(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_disk_fails_frames_by_output_and_leaves_no_orphan(tmp_path, small_disk):
    settings = settings_for(tmp_path)
    pattern = make_plate(tmp_path / "plates", frames=3)
    spec = parse_spec(spec_data(pattern, tmp_path / "out", passes="matte", chunk_frames=3))
    plan = plan_shot(spec, settings)
    store = Path(plan.paths.zarr)
    create_store(plan, {})  # the store's metadata, then moved onto the small disk
    shutil.move(store, tmp_path / "saved.zarr")
    shutil.copytree(tmp_path / "saved.zarr", small_disk(store), dirs_exist_ok=True)
    catalog = open_catalog(settings.catalog)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as local,
        Client(local) as client,
    ):
        result = run_planned_shot(plan, catalog, client)
        assert result.status == "failed"
        assert sorted(result.failed) == [1001, 1002, 1003]
        for why in result.failed.values():
            assert f"{store}/matte" in why, why
            assert "No space left on device" in why, why
            assert "astronaut" not in why, "the message must name the output, not the plate"
        assert list(Path(plan.paths.root).glob("*.exr")) == [], "a failed frame's EXR stays"
        rows, _ = queries.outputs_page(catalog.engine, "demo", "sq010", "sh010", limit=100)
        assert rows == []

        subprocess.run(["umount", "-l", str(store)], check=True)
        again = run_planned_shot(plan_shot(spec, settings), catalog, client)
    assert again.status == "complete", again.failed
    assert sorted(again.done) == [1001, 1002, 1003]
    assert len(list(Path(plan.paths.root).glob("*.exr"))) == 3
