"""A resubmit decides per frame and per output from what is really there (flows.resume).

One 4-frame shot (normal and seg, previews; shards and chunks of 2 frames) on a LocalCluster
of two processes with tiny UNTRAINED models, then, one after another, something is taken
away or changed behind the catalog's back and the same spec is submitted again: exactly the
frames that lost something are computed again, the shot ends `complete` and its Zarr store
holds every frame.

Then outputs on disk that the catalog does not know (a new catalog over the same output
folder): every frame whose files match its frame record is recorded without computing it;
a frame whose file was changed (same size, other bytes) is computed again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from flows.planning import plan_shot
from flows.shot_result import ShotResult
from flows.shot_runner import run_planned_shot
from schemas.catalog import open_catalog, queries
from schemas.passes import zarr_arrays
from schemas.spec import parse_spec
from storage.checksum import sha256_file
from storage.zarr_store import create_shot_store, open_shot_store
from tests.shot_helpers import local_client, make_plate, settings_for, spec_data

pytestmark = pytest.mark.timeout(600)
FRAMES = [1001, 1002, 1003, 1004]


client = pytest.fixture(scope="module")(local_client)


@pytest.fixture(scope="module")
def shot(tmp_path_factory, client):
    home = tmp_path_factory.mktemp("resume")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SVFX_HOME", str(home))
        settings = settings_for(home)
        pattern = make_plate(home / "plates", frames=len(FRAMES))
        spec = parse_spec(spec_data(pattern, home / "out", passes="normal,seg", chunk_frames=2))

        def submit(catalog_url: str | None = None) -> ShotResult:
            url = catalog_url or settings.catalog
            return run_planned_shot(plan_shot(spec, settings), open_catalog(url), client)

        first = submit()
        assert first.status == "complete" and sorted(first.done) == FRAMES
        yield home, submit, plan_shot(spec, settings).paths


def _redone(result: ShotResult) -> list[int]:
    assert result.status == "complete", result.failed
    assert sorted(result.done + result.skipped + result.adopted) == FRAMES
    return sorted(result.done)


def _every_frame_stored(zarr_uri: str) -> bool:
    store = open_shot_store(zarr_uri)
    values = store["normal"][:].astype(np.float32)
    return not np.isnan(values).any() and (store["seg"][:] != 255).all()


@pytest.mark.parametrize(
    ("what", "damage", "frames"),
    [
        ("nothing", lambda paths: None, []),
        ("an EXR deleted", lambda paths: Path(paths.exr(1002)).unlink(), [1002]),
        (
            "an EXR cut short",
            lambda paths: Path(paths.exr(1003)).write_bytes(
                Path(paths.exr(1003)).read_bytes()[:1000]
            ),
            [1003],
        ),
        ("a preview deleted", lambda paths: Path(paths.preview("seg", 1004)).unlink(), [1004]),
        ("the Zarr store deleted", lambda paths: shutil.rmtree(paths.zarr), FRAMES),
        (
            "the Zarr store recreated empty",
            lambda paths: create_shot_store(
                paths.zarr,
                FRAMES,
                180,
                320,
                zarr_arrays(["normal", "seg"]),
                20,
                {},
                2,
                overwrite=True,
            ),
            FRAMES,
        ),
        (
            "the Zarr store's metadata lost",
            lambda paths: Path(paths.zarr, "zarr.json").unlink(),
            FRAMES,
        ),
        (
            "one shard of one array lost",
            lambda paths: _remove_shard(paths, "seg", 1),
            [1003, 1004],
        ),
    ],
)
@pytest.mark.slow
def test_a_resubmit_redoes_exactly_what_was_lost(shot, what, damage, frames):
    _home, submit, paths = shot
    damage(paths)
    assert _redone(submit()) == frames, what
    assert _every_frame_stored(paths.zarr), what


def _remove_shard(paths, array: str, shard: int) -> None:
    (Path(paths.zarr) / array / "c" / str(shard) / "0" / "0").unlink()


def test_outputs_the_catalog_does_not_know_are_recorded_not_recomputed(shot, tmp_path):
    _home, submit, paths = shot
    assert _redone(submit()) == []  # settled
    # same size, other bytes: only a checksum can tell
    tampered = Path(paths.exr(1002))
    data = bytearray(tampered.read_bytes())
    data[-10] ^= 0xFF
    tampered.write_bytes(bytes(data))

    fresh = f"sqlite:///{tmp_path / 'new_catalog.db'}"
    result = submit(fresh)
    assert _redone(result) == [1002]
    assert sorted(result.adopted) == [1001, 1003, 1004]
    catalog = open_catalog(fresh)
    rows = queries.outputs_page(catalog.engine, "demo", "sq010", "sh010", kind="exr", limit=100)[0]
    assert {r["frame"] for r in rows} == set(FRAMES)
    for row in rows:  # what the catalog says is what is on disk
        assert row["sha256"] == sha256_file(row["uri"])
    job = queries.job(catalog.engine, result.job_id)
    assert (job["frames_done"], job["frames_total"]) == (4, 4)
