"""A stabilised version beside a per-frame one (issue 24, part 3): `flows.stabilise` picks
the version and refuses what cannot be stabilised; the chunks run `tasks.stabilise.worker`
on the cluster, no model; the catalog links every stabilised output to what it was fused from.

One 6-frame shot (normal, matte, seg, parts; chunks and shards of 2 frames, so every chunk
needs frames of its neighbours) with tiny UNTRAINED models, then its stabilised version.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import OpenEXR
import pytest
from sqlalchemy import update

from flows.planning import plan_shot
from flows.shot_runner import run_planned_shot
from flows.stabilise import NothingToStabilise, stabilised_spec
from schemas.catalog import open_catalog, queries
from schemas.catalog.models import Job
from schemas.spec import SpecError, parse_spec
from storage.cryptomatte import class_ids
from tasks.checkpoints.files import seg_class_names
from tasks.stabilise.settings import METHOD as FUSION_METHOD
from tests.shot_helpers import local_client, make_plate, settings_for, spec_data

pytestmark = pytest.mark.timeout(600)
FRAMES = [1001, 1002, 1003, 1004, 1005, 1006]
PASSES = "normal,matte,seg,parts,motion,pose"

client = pytest.fixture(scope="module")(local_client)


@pytest.fixture(scope="module")
def shot(tmp_path_factory, client):
    home = tmp_path_factory.mktemp("stabilise")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SVFX_HOME", str(home))
        settings = settings_for(home)
        pattern = make_plate(home / "plates", frames=len(FRAMES))
        spec = parse_spec(spec_data(pattern, home / "out", passes=PASSES, chunk_frames=2))
        catalog = open_catalog(settings.catalog)
        per_frame = run_planned_shot(plan_shot(spec, settings), catalog, client)
        assert per_frame.status == "complete", per_frame.failed
        stable_spec = stabilised_spec(catalog, settings, spec.shot_path, "v001")
        plan = plan_shot(stable_spec, settings)
        stable = run_planned_shot(plan, catalog, client)
        yield home, settings, catalog, spec, plan, per_frame, stable


def _channels(path: str) -> dict[str, np.ndarray]:
    with OpenEXR.File(path, separate_channels=True) as exr:
        return {n: np.array(c.pixels) for part in exr.parts for n, c in part.channels.items()}


@pytest.mark.slow
def test_the_stabilised_version_lies_beside_the_per_frame_one(shot):
    _home, _settings, _catalog, _spec, plan, per_frame, stable = shot
    assert stable.status == "complete", stable.failed
    assert sorted(stable.done) == FRAMES
    assert plan.spec.version == "v002" and plan.spec.source_version == "v001"
    assert plan.paths.root.endswith("/sapiens2_v002")
    assert per_frame.output_root.endswith("/sapiens2_v001")
    for frame in FRAMES:
        before = _channels(per_frame.exr_pattern.replace("%04d", f"{frame:04d}"))
        after = _channels(plan.paths.exr(frame))
        assert set(before) == set(after)  # the same layers
        normals = np.stack([after[f"N.{c}"] for c in "xyz"]).astype(np.float32)
        assert np.isfinite(normals).all()
        assert np.allclose(np.linalg.norm(normals, axis=0), 1.0, atol=2e-3)
        assert after["matte.A"].min() >= 0.0 and after["matte.A"].max() <= 1.0
        assert not np.array_equal(before["N.x"], after["N.x"])  # fused, not copied
        for channel in ("forward.u", "forward.v", "backward.u", "backward.v"):
            # the stabiliser's own flow, the same as the chunk worker's
            assert np.array_equal(before[channel], after[channel]), channel


def test_labels_and_cryptomatte_come_from_one_fused_thing(shot):
    _home, _settings, _catalog, _spec, plan, _per_frame, _stable = shot
    names = seg_class_names(plan.checkpoints)
    ids = class_ids(names)
    for frame in FRAMES:
        channels = _channels(plan.paths.exr(frame))
        labels = channels["seg.id"].astype(np.int64)
        top_id = channels["CryptoBodyPart00.R"]  # rank 0: the most covered class
        clear = channels["CryptoBodyPart00.G"] > channels["CryptoBodyPart00.A"]  # no tie
        assert clear.mean() > 0.99
        assert np.array_equal(ids[labels][clear], top_id[clear])


def test_every_stabilised_output_is_linked_to_what_it_was_fused_from(shot):
    _home, _settings, catalog, _spec, plan, _per_frame, _stable = shot
    found = queries.output_provenance(catalog.engine, plan.paths.exr(1003))
    assert found is not None
    normal = next(o for o in found["outputs"] if o["pass_name"] == "normal")
    made_from = {(s["frame"], s["kind"]) for s in normal["made_from"]}
    # radius 2: frames 1001..1005 of v001, their EXR and Zarr rows of the normal pass
    assert made_from == {(f, k) for f in range(1001, 1006) for k in ("exr", "zarr")}
    assert all(s["pass_name"] == "normal" for s in normal["made_from"])
    assert all("sapiens2_v001" in s["uri"] for s in normal["made_from"])
    first = queries.output_provenance(catalog.engine, plan.paths.exr(1001))
    seg = next(o for o in first["outputs"] if o["pass_name"] == "seg")
    assert {s["frame"] for s in seg["made_from"]} == {1001, 1002, 1003}  # the shot's edge
    data = first["provenance"][0]["data"]
    assert data["tiling"]["temporal_radius"] == 2


def test_a_second_run_finds_the_same_version_done(shot):
    _home, settings, catalog, spec, _plan, _per_frame, _stable = shot
    again = stabilised_spec(catalog, settings, spec.shot_path, "v001")
    assert again.version == "v002"  # the same stabilisation: the same version, not v003
    wider = stabilised_spec(catalog, settings, spec.shot_path, "v001", radius=3)
    assert wider.version == "v003"  # other settings: the next free version


def test_a_killed_stabilisation_resumes_the_frames_it_lost(shot, client):
    _home, settings, catalog, _spec, plan, _per_frame, _stable = shot
    lost = Path(plan.paths.exr(1004))
    before = _channels(str(lost))
    lost.unlink()
    result = run_planned_shot(plan_shot(plan.spec, settings), catalog, client)
    assert result.status == "complete", result.failed
    assert sorted(result.done) == [1004]
    # alone in its chunk now, with two frames of context each side: the same frame
    after = _channels(str(lost))
    assert all(np.array_equal(before[name], after[name]) for name in before)


def test_a_version_stabilised_by_an_earlier_method_stays_and_a_new_one_goes_beside(shot):
    # v002 as a version made before the fusion's method was recorded: same source, radius and
    # passes, but its frames were fused otherwise, so it is neither resumed nor written over
    _home, settings, catalog, spec, plan, _per_frame, _stable = shot
    assert plan.spec.fusion_method == FUSION_METHOD
    jobs, _total = queries.jobs_page(catalog.engine, shot=spec.shot, limit=100)
    recorded = {j["id"]: j["spec"] for j in jobs if j["spec"].get("version") == "v002"}
    earlier = {k: v for k, v in next(iter(recorded.values())).items() if k != "fusion_method"}
    try:
        with catalog.engine.begin() as conn:
            conn.execute(update(Job).where(Job.id.in_(recorded)).values(spec=earlier))
        again = stabilised_spec(catalog, settings, spec.shot_path, "v001")
        assert again.version == "v003" and again.fusion_method == FUSION_METHOD
        # its frames' cache keys differ too: nothing of v002 would be taken as done
        assert parse_spec(earlier).settings_digest() != again.settings_digest()
    finally:
        with catalog.engine.begin() as conn:
            for job_id, made in recorded.items():
                conn.execute(update(Job).where(Job.id == job_id).values(spec=made))


@pytest.mark.parametrize(
    ("version", "passes", "why"),
    [
        ("v009", None, "has no per-frame version v009 in the catalog (it has v001, v002)"),
        ("v001", ["pointmap"], "v001 was made without pointmap"),
    ],
)
def test_what_cannot_be_stabilised_is_refused_by_name(shot, version, passes, why):
    _home, settings, catalog, spec, _plan, _per_frame, _stable = shot
    with pytest.raises(SpecError, match=re.escape(why)):
        stabilised_spec(catalog, settings, spec.shot_path, version, passes=passes)


def test_an_incomplete_or_short_version_is_not_stabilised(tmp_path, client, monkeypatch):
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    settings = settings_for(tmp_path)
    catalog = open_catalog(settings.catalog)
    pattern = make_plate(tmp_path / "plates", frames=3)
    Path(pattern.replace("####", "1002")).write_bytes(b"not an exr")
    data = spec_data(pattern, tmp_path / "out", passes="matte")
    spec = parse_spec(data)
    partial = run_planned_shot(plan_shot(spec, settings), catalog, client)
    assert partial.status == "partial"
    with pytest.raises(SpecError, match=r"sh010 v001 is partial .*: stabilising needs every"):
        stabilised_spec(catalog, settings, spec.shot_path, "v001")
    short = parse_spec({**data, "frames": "1001", "version": "v004"})
    assert run_planned_shot(plan_shot(short, settings), catalog, client).status == "complete"
    with pytest.raises(NothingToStabilise, match="1 frame: nothing to stabilise"):
        stabilised_spec(catalog, settings, spec.shot_path, "v004")


def test_a_plate_changed_since_the_source_was_made_is_refused_by_frame(shot, client):
    _home, settings, catalog, spec, _plan, _per_frame, _stable = shot
    plate = Path(spec.plate.replace("####", "1006"))
    original = plate.read_bytes()
    try:
        with OpenEXR.File(str(plate)) as exr:
            header, channels = exr.header(), exr.channels()
            pixels = np.array(channels["RGB"].pixels)
        OpenEXR.File(header, {"RGB": pixels * 0.5}).write(str(plate))
        wider = stabilised_spec(catalog, settings, spec.shot_path, "v001", radius=3)
        result = run_planned_shot(plan_shot(wider, settings), catalog, client)
        assert result.status == "partial"
        assert list(result.failed) == [1006]
        assert "the plate changed since v001 was made" in result.failed[1006]
    finally:
        plate.write_bytes(original)


def test_temporal_qc_scores_both_versions_and_the_shot_page_draws_both(shot):
    from fastapi.testclient import TestClient

    from api.app import create_app

    _home, settings, catalog, spec, _plan, _per_frame, _stable = shot
    page = TestClient(create_app(settings, engine=catalog.engine)).get(f"/shots/{spec.shot_path}")
    assert page.status_code == 200
    charts = dict(re.findall(r'<section class="qc" id="qc-(\w+)">(.*?)</section>', page.text, re.S))
    assert set(charts) == {"normal", "matte", "seg", "parts"}
    for chart in charts.values():
        lines = re.findall(r'<polyline class="score" data-version="([\w.]+)"', chart)
        assert lines[:2] == ["sapiens2_v001", "sapiens2_v002"]  # (v003: the test above)
    qc = TestClient(create_app(settings, engine=catalog.engine)).get(
        f"/api/shots/{spec.shot_path}/qc"
    )
    versions = qc.json()["versions"]["normal"]
    assert {"sapiens2_v001", "sapiens2_v002"} <= set(versions)
    assert [s["frame"] for s in versions["sapiens2_v002"]] == FRAMES


def test_pose_keypoints_are_smoothed_in_the_pose_json(shot):
    _home, _settings, _catalog, _spec, plan, per_frame, _stable = shot
    from storage.pose_json import read_pose_json

    def tracks(root: str, name: str) -> np.ndarray:
        frames = read_pose_json(f"{root}/{name}_pose.json")["frames"]
        people = [frames[str(f)] for f in FRAMES]
        assert all(len(p) == 1 for p in people)  # the untrained seg: one box, the frame
        return np.array([p[0]["keypoints"] for p in people], dtype=np.float64)

    before = tracks(per_frame.output_root, "sh010_sapiens2_v001")
    after = tracks(plan.paths.root, plan.paths.name)
    assert np.array_equal(before[..., 2], after[..., 2])  # scores kept
    jitter = [np.abs(np.diff(t[..., :2], n=2, axis=0)).mean() for t in (before, after)]
    assert jitter[1] < 0.5 * jitter[0]
