"""A motion+matte shot end to end (plan, chunks of two frames on a LocalCluster of two worker
processes, catalog, finalize; tiny UNTRAINED matte model): the planner gives each chunk the
plate frames beside it, the vectors at the chunks' edges are the plate's motion, the catalog
holds motion's outputs with no checkpoint behind them, the Nuke script wires a VectorBlur,
temporal QC leaves motion alone, and the same spec again does nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import OpenEXR
import pytest
from sqlalchemy import select

from flows.planning import plan_shot, work_to_do
from flows.shot_runner import run_planned_shot
from schemas.catalog import open_catalog, queries
from schemas.catalog.models import Output, OutputCheckpoint
from schemas.spec import parse_spec
from tests.nuke_parse import parse
from tests.plates import write_moving_plate
from tests.shot_helpers import SMALL, local_client, settings_for, spec_data

pytestmark = pytest.mark.timeout(600)
FRAMES = [1001, 1002, 1003, 1004]
SHIFT = (2, 1)  # right 2, down 1 per frame

client = pytest.fixture(scope="module")(local_client)


def test_a_motion_shot_through_the_planner_the_cluster_and_the_catalog(tmp_path, client):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SVFX_HOME", str(tmp_path))
        settings = settings_for(tmp_path)
        pattern = write_moving_plate(tmp_path / "plates", FRAMES, SMALL, SHIFT)
        spec = parse_spec(
            spec_data(pattern, tmp_path / "out", passes="matte,motion", chunk_frames=2)
        )
        plan = plan_shot(spec, settings)
        catalog = open_catalog(settings.catalog)
        jobs = work_to_do(plan, catalog, {}).jobs
        assert [(job.frames, sorted(job.neighbours)) for job in jobs] == [
            ((1001, 1002), [1003]),
            ((1003, 1004), [1002]),
        ]
        result = run_planned_shot(plan, catalog, client)
        assert result.status == "complete", result.failed
        assert sorted(result.done) == FRAMES

        # (forward u, forward v, backward u) at the middle of each frame, Nuke's axes (v up):
        # 1002's forward and 1003's backward cross the chunks' edge; 1004 is the range's end
        expected = {1001: (2, -1, 0), 1002: (2, -1, -2), 1003: (2, -1, -2), 1004: (0, 0, -2)}
        for frame, values in expected.items():
            with OpenEXR.File(plan.paths.exr(frame), separate_channels=True) as exr:
                (part,) = [p for p in exr.parts if p.name() == "motion"]
                found = tuple(
                    float(np.median(part.channels[name].pixels[24:-24, 24:-24]))
                    for name in ("forward.u", "forward.v", "backward.u")
                )
            assert found == pytest.approx(values, abs=0.1), frame

        with catalog.engine.connect() as conn:
            motion = conn.execute(
                select(Output.kind, Output.frame).where(Output.pass_name == "motion")
            ).all()
            linked = conn.execute(
                select(OutputCheckpoint.output_id)
                .join(Output, Output.id == OutputCheckpoint.output_id)
                .where(Output.pass_name == "motion")
            ).all()
        assert sorted(motion) == sorted(
            (kind, f) for kind in ("exr", "zarr", "preview") for f in FRAMES
        )
        assert linked == []  # motion depends on the plate alone
        scores = queries.flicker_scores(catalog.engine, "demo", "sq010", "sh010")
        assert {s["pass_name"] for s in scores} == {"matte"}  # no QC metric for motion

        assert Path(result.extras["contact_sheet_motion"]).is_file()  # from its previews
        script = parse(Path(result.extras["nuke_script"]).read_text())
        assert script.node("VectorBlur_motion").knobs["uv"] == "motion"
        assert script.node("Shuffle_motion").knobs["in"] == "motion"

        again = run_planned_shot(plan_shot(spec, settings), catalog, client)
        assert again.status == "complete" and again.done == []
        assert sorted(again.skipped) == FRAMES
