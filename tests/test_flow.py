"""End to end on a LocalCluster of two worker processes, tiny UNTRAINED models:

- every pass of a 6-frame shot (two chunks) through the Prefect flow; outputs read back;
  catalog rows consistent with the files;
- the same spec again does no model work;
- a corrupt frame gives `partial` with that frame named;
- a worker killed with SIGKILL mid-shot still gives every frame exactly once.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import signal
import threading
from pathlib import Path

import numpy as np
import OpenEXR
import pytest
from distributed import Client, LocalCluster
from sqlalchemy import func, select, update

from schemas.catalog import open_catalog, queries
from schemas.catalog.models import JobFrame, Output
from storage.pose_json import read_pose_json
from storage.zarr_store import open_shot_store
from tasks.temporal_qc import METHOD
from tests.nuke_parse import parse, tcl_unliteral
from tests.shot_helpers import make_plate, settings_for, spec_data

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster():
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as local,
        Client(local) as client,
    ):
        yield local, client


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", str(tmp_path))
    monkeypatch.delenv("SVFX_CATALOG_URL", raising=False)
    monkeypatch.delenv("SVFX_CHECKPOINT_ROOT", raising=False)
    return tmp_path


def _sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_6_frame_shot_through_the_flow_then_again(home, prefect_api, cluster):
    from flows.process_shot import process_shot

    local, _ = cluster
    pattern = make_plate(home / "plates", frames=6)  # two chunks (chunk_frames 4)
    spec = spec_data(pattern, home / "out", review_clips=True)
    result = process_shot(spec, local.scheduler_address)

    assert result["status"] == "complete", result["failed"]
    assert sorted(result["done"]) == list(range(1001, 1007))
    exrs = sorted(Path(result["output_root"]).glob("*.exr"))
    assert len(exrs) == 6
    with OpenEXR.File(str(exrs[5])) as f:
        assert [p.name() for p in f.parts] == ["N", "P", "albedo", "matte", "CryptoBodyPart", "seg"]
        assert f.parts[1].channels["depth.Z"].pixels.dtype == np.float32
        assert f.parts[2].header["colorInteropID"] == "lin_rec709_scene"  # the plate's space
    store = open_shot_store(result["zarr"])
    assert list(store["frame"][:]) == list(range(1001, 1007))
    assert not np.isnan(store["normal"][:].astype(np.float32)).any()  # every frame written
    pose = read_pose_json(result["extras"]["pose_json"])
    assert len(pose["frames"]) == 6
    assert Path(result["extras"]["contact_sheet_normal"]).is_file()
    assert Path(result["extras"]["review_clip_seg"]).is_file()
    script = parse(Path(result["extras"]["nuke_script"]).read_text())  # beside the EXRs
    read = script.node("Read_data")
    assert tcl_unliteral(read.knobs["file"]) == result["exr_pattern"]
    assert (read.knobs["first"], read.knobs["last"], read.knobs["raw"]) == ("1001", "1006", "true")
    assert script.node("Cryptomatte_BodyPart").knobs["cryptoLayer"] == "CryptoBodyPart"

    catalog = open_catalog(f"sqlite:///{home / 'catalog.db'}")
    outputs, _ = queries.outputs_page(
        catalog.engine, "demo", "sq010", "sh010", kind="exr", limit=500
    )
    by_file = {}
    for row in outputs:
        by_file.setdefault(row["uri"], set()).add(row["sha256"])
    assert len(by_file) == 6
    for uri, shas in by_file.items():  # the catalog's checksum is the file's
        assert shas == {_sha(uri)}
    coverage = queries.shots_page(catalog.engine, show="demo")[0]
    assert coverage[0]["passes"] == {
        p: 6 for p in ("albedo", "matte", "normal", "pointmap", "pose", "seg")
    }
    provenance = queries.output_provenance(catalog.engine, str(exrs[0]))
    assert provenance is not None
    scores = queries.flicker_scores(catalog.engine, "demo", "sq010", "sh010")  # temporal QC
    scored = {(s["pass_name"], s["frame"]) for s in scores}
    assert scored == {
        (p, f) for p in ("normal", "pointmap", "albedo", "matte", "seg") for f in range(1001, 1007)
    }
    assert all(s["flicker"] > 0 and s["preview_id"] is not None for s in scores)
    assert set(result["flagged"]) <= {"normal", "pointmap", "albedo", "matte", "seg"}

    assert {s["flicker_method"] for s in scores} == {METHOD}
    with catalog.engine.begin() as conn:  # as if an earlier QC had scored the version
        conn.execute(update(Output).values(flicker_method=None))

    again = process_shot(spec, local.scheduler_address)
    assert again["status"] == "complete"
    assert again["done"] == [] and len(again["skipped"]) == 6
    assert again["chunks"] == 0 and again["model_s"] == 0  # no model work at all
    rescored = queries.flicker_scores(catalog.engine, "demo", "sq010", "sh010")
    assert {(s["pass_name"], s["frame"]) for s in rescored} == scored  # its QC ran again
    assert {s["flicker_method"] for s in rescored} == {METHOD}
    assert {_sha(str(p)) for p in exrs} == {next(iter(by_file[str(p)])) for p in exrs}


def test_a_corrupt_frame_gives_partial_with_that_frame_named(home, prefect_api, cluster):
    from flows.process_shot import process_shot

    local, _ = cluster
    pattern = make_plate(home / "plates", frames=6)
    bad = home / "plates" / "astronaut.1004.exr"
    bad.write_bytes(bad.read_bytes()[:500])
    result = process_shot(
        spec_data(pattern, home / "out", passes="normal,seg"), local.scheduler_address
    )
    assert result["status"] == "partial"
    assert list(result["failed"]) == [1004]
    assert "astronaut.1004.exr" in result["failed"][1004]
    assert len(result["done"]) == 5
    catalog = open_catalog(f"sqlite:///{home / 'catalog.db'}")
    job = queries.job(catalog.engine, result["job_id"])
    assert job["status"] == "partial"
    assert [f["frame"] for f in job["failed_frames"]] == [1004]


def test_a_worker_killed_mid_shot_still_gives_every_frame_once(home, cluster):
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot
    from schemas.spec import parse_spec

    _, client = cluster
    settings = settings_for(home)
    pattern = make_plate(home / "plates", frames=12)
    spec = parse_spec(spec_data(pattern, home / "out", passes="normal,matte", chunk_frames=2))
    catalog = open_catalog(settings.catalog)
    killed = threading.Event()

    def kill_a_busy_worker(_summary) -> None:
        if killed.is_set():
            return
        processing = client.processing()
        busy = [address for address, keys in processing.items() if keys]
        if busy:
            pid = client.run(os.getpid, workers=[busy[0]])[busy[0]]
            os.kill(pid, signal.SIGKILL)
            killed.set()

    plan = plan_shot(spec, settings)
    result = run_planned_shot(plan, catalog, client, window=4, on_chunk=kill_a_busy_worker)
    assert killed.is_set()
    assert result.status == "complete", result.failed
    assert sorted(result.done) == list(range(1001, 1013))
    with catalog.engine.connect() as conn:
        per_frame = conn.execute(
            select(Output.frame, Output.pass_name, func.count())
            .where(Output.kind == "exr")
            .group_by(Output.frame, Output.pass_name)
        ).all()
        job_frames = conn.execute(
            select(func.count()).where(JobFrame.job_id == result.job_id)
        ).scalar_one()
    assert len(per_frame) == 24 and {n for *_, n in per_frame} == {1}
    assert job_frames == 12
    store = open_shot_store(result.zarr)
    assert not np.isnan(store["matte"][:].astype(np.float32)).any()
    client.wait_for_workers(2, timeout=60)  # the nanny brought the worker back


class _FlowDied(Exception):
    pass


def test_a_flow_killed_mid_shot_redoes_only_the_missing_frames(home, cluster):
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot
    from schemas.spec import parse_spec

    _, client = cluster
    settings = settings_for(home)
    pattern = make_plate(home / "plates", frames=8)
    spec = parse_spec(spec_data(pattern, home / "out", passes="matte", chunk_frames=2))
    catalog = open_catalog(settings.catalog)
    recorded: list[int] = []

    def die_after_two_chunks(summary) -> None:
        recorded.extend(f.frame for f in summary.frames)
        if len(recorded) >= 4:
            raise _FlowDied  # the flow process goes away with chunks still in flight

    with pytest.raises(_FlowDied):
        run_planned_shot(
            plan_shot(spec, settings), catalog, client, window=2, on_chunk=die_after_two_chunks
        )
    # the chunks still running when it died finished (their frames are on disk with their
    # records, not in the catalog): they are found and recorded, not computed again
    resumed = run_planned_shot(plan_shot(spec, settings), catalog, client)
    assert resumed.status == "complete"
    assert sorted(resumed.skipped) == sorted(recorded)
    assert not set(resumed.adopted) & set(recorded)
    assert sorted(resumed.done + resumed.adopted) == sorted(set(range(1001, 1009)) - set(recorded))
    assert resumed.chunks == len(resumed.done) // 2


def test_a_gpu_worker_runs_two_chunks_at_once_and_every_frame_once(home):
    """The flow keeps a GPU worker fed: on a cluster of one GPU worker (as `svfx submit`
    starts on a one-GPU node; the models here on the CPU), two of its chunks run at once (one
    reads and writes while the other has the device) and every frame is recorded once."""
    from distributed import get_task_stream

    from flows.cluster import CHUNKS_PER_GPU, chunk_dispatch_shape, start_local_cluster
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot
    from schemas.spec import parse_spec

    settings = settings_for(home)
    pattern = make_plate(home / "plates", frames=8)
    spec = parse_spec(spec_data(pattern, home / "out", passes="matte", chunk_frames=2))
    catalog = open_catalog(settings.catalog)
    with start_local_cluster(gpus=1) as local, Client(local) as client:
        assert chunk_dispatch_shape(client) == (CHUNKS_PER_GPU + 1, {"GPU": 1 / CHUNKS_PER_GPU})
        with get_task_stream(client) as stream:
            result = run_planned_shot(plan_shot(spec, settings), catalog, client)
    assert result.status == "complete" and sorted(result.done) == list(range(1001, 1009))
    chunks = sorted(
        (part["start"], part["stop"])
        for task in stream.data
        if str(task["key"]).startswith("svfx-chunk-")
        for part in task["startstops"]
        if part["action"] == "compute"
    )
    assert len(chunks) == 4
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(chunks))
    with catalog.engine.connect() as conn:
        job_frames = conn.execute(
            select(func.count()).where(JobFrame.job_id == result.job_id)
        ).scalar_one()
    assert job_frames == 8
