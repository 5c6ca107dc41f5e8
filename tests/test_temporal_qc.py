"""Temporal QC (tasks/temporal_qc.py) on a synthetic shot: a person-shaped region moves over a
smooth background, its passes follow it; each pass is perturbed on one frame, and one frame
shakes (plate and passes move away and back, as a camera bump does). Each perturbed frame is
flagged for its pass and no other frame is, the shaken one included. Then the scores through
the catalog: recorded beside the outputs, listed by the API and on each job, drawn on the
shot page."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bench.temporal_qc import (
    FRAMES,
    PERTURBED,
    SHAKEN,
    SYNTHESISED,
    THRESHOLD,
    write_synthetic_shot,
)
from schemas.catalog import queries
from schemas.passes import BY_NAME, PASSES
from tasks.temporal_qc import (
    METHOD,
    QcJob,
    flagged_frames,
    follow_motion,
    proxies_of,
    scores,
    shot_flicker,
)
from tests import api_fixtures, catalog_fixtures
from tests.api_fixtures import A, Filled
from tests.catalog_fixtures import exr_uri

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
filled = api_fixtures.filled


@pytest.fixture(scope="module")
def synthetic_shot(tmp_path_factory: pytest.TempPathFactory) -> QcJob:
    return write_synthetic_shot(tmp_path_factory.mktemp("qc"))


def test_each_perturbed_frame_is_flagged_for_its_pass_and_no_other_frame(synthetic_shot):
    flicker = shot_flicker(synthetic_shot)

    assert set(flicker) == set(SYNTHESISED)  # pose is not a dense pass
    assert {BY_NAME[name].qc for name in SYNTHESISED} == {p.qc for p in PASSES} - {None}
    for name in SYNTHESISED:
        assert set(flicker[name]) == set(FRAMES)
    assert flagged_frames(flicker, THRESHOLD) == {name: [f] for name, f in PERTURBED.items()}
    for name, frame in PERTURBED.items():
        others = [s for f, s in flicker[name].items() if f != frame]
        assert flicker[name][frame] > 2 * max(others), (name, flicker[name])
    shaken = {name: flicker[name][SHAKEN] for name in SYNTHESISED}
    assert max(shaken.values()) < THRESHOLD, shaken  # honest motion, however sudden


def test_a_small_normal_flicker_stands_out_in_fast_action(tmp_path):
    # 4 px a frame: comparing pixels where they are, a 10 degree tilt scored 1.2 (a turning or
    # moving figure's normals change more than that); followed along the motion it stands out
    flicker = shot_flicker(write_synthetic_shot(tmp_path, speed=4.0, tilt=10.0))

    assert flagged_frames(flicker, THRESHOLD) == {name: [f] for name, f in PERTURBED.items()}
    others = [s for f, s in flicker["normal"].items() if f != PERTURBED["normal"]]
    assert flicker["normal"][PERTURBED["normal"]] > 2 * THRESHOLD > 2 * max(others)


def test_a_cut_is_compared_where_the_pixels_are():
    rng = np.random.default_rng(0)
    a = proxies_of(1, rng.random((48, 80), dtype=np.float32), {})
    b = proxies_of(2, np.full((48, 80), 0.9, np.float32), {})  # another shot: nothing to follow

    followed, trusted = follow_motion(a, b)

    assert followed is b and trusted is None


def test_a_plate_too_small_for_flow_is_compared_where_the_pixels_are():
    rng = np.random.default_rng(0)
    a, b = (proxies_of(f, rng.random((8, 256), dtype=np.float32), {}) for f in (1, 2))

    followed, trusted = follow_motion(a, b)

    assert followed is b and trusted is None


def test_scores_localise_a_spike_at_either_end_of_the_shot():
    frames = [1, 2, 3, 4, 5, 6]
    plate = {(a, b): 0.01 for a in frames for b in frames if a < b}

    def change(bad: int) -> dict[tuple[int, int], float]:
        return {pair: (0.3 if bad in pair else 0.01) for pair in plate}

    for bad in (1, 3, 6):
        result = scores(frames, change(bad), plate)
        assert [f for f, s in result.items() if s > THRESHOLD] == [bad], result
    steady = scores(frames, {p: 0.01 for p in plate}, plate)
    assert set(steady.values()) == {1.0}


def test_a_plate_change_explains_a_pass_change():
    frames = [1, 2, 3, 4, 5]
    plate = {(a, b): (0.2 if 3 in (a, b) else 0.01) for a in frames for b in frames if a < b}
    passes = {pair: (0.2 if 3 in pair else 0.01) for pair in plate}  # a flash: both change
    assert max(scores(frames, passes, plate).values()) < THRESHOLD


def test_short_shots_and_shots_without_dense_passes_have_no_scores(synthetic_shot):
    from dataclasses import replace

    assert shot_flicker(replace(synthetic_shot, frames=(1001, 1002))) == {}
    assert shot_flicker(replace(synthetic_shot, passes=("pose",))) == {}


# -- through the catalog, the API, the jobs and the page (SQLite and PostgreSQL) -------------
def test_scores_recorded_beside_outputs_listed_flagged_and_drawn(filled: Filled) -> None:
    spec = filled.specs[A]
    job = filled.jobs[A]
    done = [1001, 1003, 1004, 1005, 1006, 1008]  # 1002 and 1007 failed in the fixture
    flicker = {"normal": {f: 1.0 for f in done}, "seg": {f: 0.9 for f in done}}
    flicker["normal"][1005] = 7.5
    uris = {f: (exr_uri(spec, f),) for f in done}
    filled.catalog.record_flicker(job, flicker, uris, METHOD)

    outputs = queries.outputs_page(filled.catalog.engine, *A.split("/"), kind="exr", limit=100)[0]
    scored = {(o["pass_name"], o["frame"]): o["flicker"] for o in outputs}
    assert scored[("normal", 1005)] == 7.5 and scored[("seg", 1005)] == 0.9

    qc = filled.client.get(f"/api/shots/{A}/qc").json()
    assert qc["threshold"] == 3.0
    assert qc["flagged"] == [{"pass_name": "normal", "frame": 1005, "flicker": 7.5}]
    normal = {s["frame"]: s for s in qc["passes"]["normal"]}
    assert sorted(normal) == done and normal[1005]["flagged"]
    assert normal[1005]["preview_id"] is not None
    lower = filled.client.get(f"/api/shots/{A}/qc", params={"threshold": 0.95}).json()
    assert {(f["pass_name"], f["frame"]) for f in lower["flagged"]} == {("normal", f) for f in done}
    assert filled.client.get(f"/api/shots/{A}/qc", params={"threshold": 0}).status_code == 422
    assert filled.client.get("/api/shots/demo/sq010/nope/qc").status_code == 404

    job_view = filled.client.get(f"/api/jobs/{job}").json()
    assert job_view["flagged_frames"] == [{"pass_name": "normal", "frame": 1005, "flicker": 7.5}]
    found = queries.job(filled.catalog.engine, job, flicker_threshold=0.95)
    assert len(found["flagged_frames"]) == len(done)

    page = filled.client.get(f"/shots/{A}").text
    charts = re.findall(r'<section class="qc" id="qc-(\w+)">(.*?)</section>', page, re.S)
    assert [name for name, _ in charts] == ["normal", "seg"]
    normal_chart = dict(charts)["normal"]
    assert "<svg" in normal_chart and "<polyline" in normal_chart
    assert re.findall(r'class="flagged" data-frame="(\d+)"', normal_chart) == ["1005"]
    link = f'<a href="/files/outputs/{normal[1005]["preview_id"]}"><circle class="flagged"'
    assert link in normal_chart
    assert 'class="flagged"' not in dict(charts)["seg"]
    assert filled.client.get(f"/files/outputs/{normal[1005]['preview_id']}").status_code == 200


def test_a_remade_output_loses_its_score_until_scored_again(filled: Filled) -> None:
    from tests.catalog_fixtures import make_chunk

    spec = filled.specs[A]
    job = filled.jobs[A]
    filled.catalog.record_flicker(
        job, {"normal": {1001: 9.0}}, {1001: (exr_uri(spec, 1001),)}, METHOD
    )
    filled.catalog.record_chunk(job, make_chunk(spec, [1001], output_sha_salt="remade"))
    outputs = queries.outputs_page(filled.catalog.engine, *A.split("/"), kind="exr", limit=100)[0]
    assert {o["flicker"] for o in outputs if o["frame"] == 1001} == {None}


def test_versions_scored_by_different_qc_methods_are_said_not_to_be_on_one_scale(
    filled: Filled,
) -> None:
    from sqlalchemy import update

    from schemas.catalog import models as m
    from tests.catalog_fixtures import make_chunk, make_plate, make_spec

    engine = filled.catalog.engine
    v001 = filled.jobs[A]
    done = [1001, 1003, 1004, 1005, 1006, 1008]
    scores = {"normal": {f: 1.0 for f in done}}
    uris = {f: (exr_uri(filled.specs[A], f),) for f in done}
    assert queries.unscored(engine, v001, ["normal"], METHOD)  # never scored
    filled.catalog.record_flicker(v001, scores, uris, METHOD)
    assert not queries.unscored(engine, v001, ["normal"], METHOD)
    assert queries.unscored(engine, v001, ["normal"], "another-method")
    assert queries.unscored(engine, v001, ["normal", "seg"], METHOD)  # seg has no score yet
    first = "unknown"  # the fixture's job recorded no output folder to name its version by
    qc = filled.client.get(f"/api/shots/{A}/qc").json()
    assert qc["unlike"] == [] and qc["methods"] == {"normal": {first: METHOD}}

    # v002 of the shot scored now, v001's scores from before methods were recorded
    spec = make_spec(filled.root, "sh0010", version="v002")
    folder = f"{spec.output_root}/{spec.shot}/{spec.version}"
    v002 = filled.catalog.register_job(
        spec, make_plate(spec, range(1001, 1005)), "flow-run-c", output_root=folder
    )
    filled.catalog.record_chunk(v002, make_chunk(spec, range(1001, 1005)))
    filled.catalog.finish_job(v002, "complete")
    frames = range(1001, 1005)
    filled.catalog.record_flicker(
        v002, {"normal": dict.fromkeys(frames, 1.0)}, {f: (exr_uri(spec, f),) for f in frames},
        METHOD,
    )  # fmt: skip
    with engine.begin() as conn:
        conn.execute(update(m.Output).where(m.Output.job_id == v001).values(flicker_method=None))
    qc = filled.client.get(f"/api/shots/{A}/qc").json()
    assert qc["methods"] == {"normal": {first: None, "v002": METHOD}}
    assert qc["unlike"] == ["normal"]
    assert queries.unscored(engine, v001, ["normal"], METHOD)  # submitting it again rescores
    assert not queries.unscored(engine, v002, ["normal"], METHOD)
    page = filled.client.get(f"/shots/{A}").text
    normal = dict(re.findall(r'<section class="qc" id="qc-(\w+)">(.*?)</section>', page, re.S))
    assert "Not on one scale" in normal["normal"]
    assert f"v002: {METHOD}" in normal["normal"] and f"{first}: an earlier QC" in normal["normal"]

    with engine.begin() as conn:  # one version's frames scored by two methods
        conn.execute(
            update(m.Output).where(m.Output.job_id == v001, m.Output.frame == 1001)
            .values(flicker_method=METHOD)
        )  # fmt: skip
    qc = filled.client.get(f"/api/shots/{A}/qc").json()
    assert qc["methods"]["normal"][first] == "mixed" and qc["unlike"] == ["normal"]


def test_the_page_says_when_there_are_no_scores(filled: Filled) -> None:
    page = filled.client.get(f"/shots/{A}").text
    assert "No flicker scores yet" in page


def test_a_catalog_that_cannot_say_whether_scores_are_current_skips_qc_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    from sqlalchemy.exc import OperationalError

    from flows import shot_runner

    def down(*_args: object) -> bool:
        raise OperationalError("SELECT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(shot_runner.queries, "unscored", down)
    plan = SimpleNamespace(spec=SimpleNamespace(passes=("normal",)))
    catalog = SimpleNamespace(engine=None)
    nothing_done = SimpleNamespace(done=[])
    assert shot_runner._qc_due(plan, catalog, 7, nothing_done) is False  # type: ignore[arg-type]
    assert "temporal QC not run" in caplog.text and "job 7" in caplog.text
    made_frames = SimpleNamespace(done=[1001])
    assert shot_runner._qc_due(plan, catalog, 7, made_frames) is True  # type: ignore[arg-type]
