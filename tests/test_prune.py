"""`svfx prune`: versions off the disk by rule (--keep, --older-than, --invalidated), the plan
printed, nothing deleted without --yes; never a shot's newest complete version, a version a
job still writes, and unless forced a published version or one another was made from. The
scheduled prune is served only when configured. On SQLite and PostgreSQL with real files."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from cli.main import app
from flows import prune as prune_flow
from flows import scheduled
from schemas.catalog import models as m
from schemas.catalog import open_catalog, queries
from schemas.catalog.models import utcnow
from schemas.settings import Settings
from tasks.prune import PruneRefused, PruneRules, parse_duration, plan_prune
from tests import catalog_fixtures
from tests.catalog_fixtures import CHECKPOINTS, checkpoint, make_chunk, make_plate, make_spec

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
studio = catalog_fixtures.studio
FRAMES = range(1001, 1004)
SHOT = "demo/sq010/sh0010"


def folder_of(spec: Any) -> str:
    return f"{spec.output_root}/{spec.shot}/{spec.version}"


def make_version(
    cat: Any,
    root: Path,
    version: str,
    *,
    days_ago: float = 0,
    shot: str = "sh0010",
    plate_version: int = 1,
    checkpoints: dict[str, dict[str, Any]] = CHECKPOINTS,
    status: str = "complete",
    **changes: Any,
) -> int:
    """A version with its files on disk, made ``days_ago``; its job id."""
    spec = make_spec(root, shot=shot, version=version, **changes)
    plate = make_plate(spec, FRAMES, version=plate_version)
    job_id = cat.register_job(spec, plate, None, output_root=folder_of(spec))
    chunk = make_chunk(spec, FRAMES, plate_version=plate_version, checkpoints=checkpoints)
    for frame in chunk.frames:
        for out in frame.outputs:
            path = Path(out.uri) / "c0" if out.kind == "zarr" else Path(out.uri)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * 100)
    cat.record_chunk(job_id, chunk)
    cat.finish_job(job_id, status)
    made = utcnow() - timedelta(days=days_ago)
    with cat.engine.begin() as conn:
        stmt = update(m.Job).where(m.Job.id == job_id)
        conn.execute(stmt.values(created_at=made - timedelta(hours=1), finished_at=made))
    return job_id


def on_disk(root: Path, version: str, shot: str = "sh0010") -> bool:
    return (root / "out" / shot / version).exists()


def planned(plan: Any) -> tuple[list[str], list[str]]:
    """(labels to delete, labels kept)."""
    return [i.version.label for i in plan.delete], [i.version.label for i in plan.kept]


def test_keep_n_keeps_the_newest_complete_versions_and_anything_newer(catalog, studio):
    root, settings = studio
    for n, days in ((1, 40), (2, 30), (3, 20), (4, 10)):
        make_version(catalog, root, f"v00{n}", days_ago=days)
    make_version(catalog, root, "v005", days_ago=15, status="failed")  # newer than the 2nd
    make_version(catalog, root, "v001", shot="sh0020", days_ago=50)  # one version only
    plan = plan_prune(catalog.engine, settings, PruneRules(keep=2))
    assert planned(plan) == (["v001", "v002"], [])
    assert all("older than the 2 newest complete" in i.why for i in plan.delete)
    assert plan.size_bytes > 0
    assert plan.reason == "prune: --keep 2"
    # planning deletes nothing
    assert all(on_disk(root, f"v00{n}") for n in range(1, 6))
    # --keep 1 and --older-than 25d together: v002, v001 (v003 is too young)
    both = PruneRules(keep=1, older_than=parse_duration("25d"))
    plan = plan_prune(catalog.engine, settings, both)
    assert planned(plan)[0] == ["v001", "v002"]
    assert "made over 25d ago" in plan.delete[0].why


def test_older_than_never_takes_the_newest_complete_version(catalog, studio):
    root, settings = studio
    make_version(catalog, root, "v001", days_ago=90)
    make_version(catalog, root, "v002", days_ago=60)
    make_version(catalog, root, "v003", days_ago=1, status="failed")
    plan = plan_prune(catalog.engine, settings, PruneRules(older_than=timedelta(days=30)))
    assert planned(plan) == (["v001"], ["v002"])
    assert plan.kept[0].why.endswith("kept: the shot's newest complete version")
    plan = plan_prune(catalog.engine, settings, PruneRules(older_than=timedelta(hours=12)))
    assert planned(plan) == (["v001", "v003"], ["v002"])


def test_invalidated_finds_a_repulled_plate_and_a_replaced_checkpoint(catalog, studio):
    root, settings = studio
    make_version(catalog, root, "v001", days_ago=30)
    make_version(catalog, root, "v002", days_ago=20)
    rules = PruneRules(invalidated=True)
    assert planned(plan_prune(catalog.engine, settings, rules)) == ([], [])
    # the plate is pulled again: v003 is made from the new frames; v001 and v002 are stale
    make_version(catalog, root, "v003", days_ago=10, plate_version=2)
    plan = plan_prune(catalog.engine, settings, rules)
    assert planned(plan) == (["v001", "v002"], [])
    assert plan.delete[0].why == "3 frame(s) (1001-1003) made from plate frames changed since"
    # a retrained normal model at the same path: v003's files were made with the old one
    retrained = {**checkpoint("normal", 2), "path": CHECKPOINTS["normal"]["path"]}
    new = {**CHECKPOINTS, "normal": retrained}
    make_version(catalog, root, "v004", days_ago=5, plate_version=2, checkpoints=new)
    plan = plan_prune(catalog.engine, settings, rules)
    assert planned(plan) == (["v001", "v002", "v003"], [])
    assert plan.delete[2].why.endswith(f"made with {CHECKPOINTS['normal']['path']}, replaced since")
    # a shot's newest complete version is kept even when stale (made with the old model)
    make_version(catalog, root, "v001", shot="sh0020", days_ago=3)
    plan = plan_prune(catalog.engine, settings, rules)
    assert planned(plan) == (["v001", "v002", "v003"], ["v001"])
    assert plan.kept[0].version.shot == "sh0020"
    scoped = PruneRules(invalidated=True, shot="demo/sq010/sh0020")
    with pytest.raises(PruneRefused, match="sh0020 v001 is the shot's only complete version"):
        plan_prune(catalog.engine, settings, scoped)


def test_published_and_made_from_versions_are_kept_unless_forced(catalog, studio):
    root, settings = studio
    published = make_version(catalog, root, "v001", days_ago=40)
    catalog.record_publish(published, "kitsu", code="sh0010_v001")
    make_version(catalog, root, "v002", days_ago=30)
    made = {"temporal": "stabilize", "source_version": "v002", "fusion_method": "m1"}
    make_version(catalog, root, "v003", days_ago=20, **made)
    make_version(catalog, root, "v004", days_ago=10)
    rules = PruneRules(keep=1)
    plan = plan_prune(catalog.engine, settings, rules)
    assert planned(plan) == (["v003"], ["v001", "v002"])
    assert "published to kitsu as 'sh0010_v001' (--force deletes it)" in plan.kept[0].why
    assert "v003 was made from it (stabilised)" in plan.kept[1].why
    forced = plan_prune(catalog.engine, settings, rules, force=True)
    assert planned(forced) == (["v001", "v002", "v003"], [])
    assert forced.forced == [
        f"{SHOT} v001: was published to kitsu as 'sh0010_v001'",
        f"{SHOT} v002: v003 was made from it (stabilised)",
    ]
    assert forced.reason == "prune: --keep 1 --force"


def test_a_version_a_live_job_writes_is_kept(catalog, studio):
    root, settings = studio
    make_version(catalog, root, "v001", days_ago=40)
    spec = make_spec(root, version="v002")
    job_id = catalog.register_job(spec, make_plate(spec, FRAMES), None, output_root=folder_of(spec))
    with catalog.engine.begin() as conn:
        old = utcnow() - timedelta(days=35)
        conn.execute(update(m.Job).where(m.Job.id == job_id).values(created_at=old))
    make_version(catalog, root, "v003", days_ago=1)
    plan = plan_prune(catalog.engine, settings, PruneRules(older_than=timedelta(days=30)))
    assert planned(plan) == (["v001"], ["v002"])
    why = f"kept: job {job_id} is still running (svfx status); wait for it to end"
    assert plan.kept[0].why.endswith(why)


def test_what_plan_prune_refuses(catalog, studio):
    root, settings = studio
    make_version(catalog, root, "v001", days_ago=40)
    refusals = {
        "no rule given": {},
        "--keep 0: keeps the N newest": {"keep": 0},
        "--keep -2": {"keep": -2},
        "--show must be a plain show name": {"keep": 1, "show": ".."},
        "shot must be SHOW/SEQ/SHOT with plain names": {"keep": 1, "shot": "demo/../sh0010"},
        "--shot demo/sq010/sh0010 is not in --show abc": {"keep": 1, "show": "abc", "shot": SHOT},
    }
    for why, rules in refusals.items():
        with pytest.raises(PruneRefused, match=why):
            PruneRules(**rules)
    for text in ("30", "3x", "0d", "-1d", "d", "1.5h"):
        with pytest.raises(PruneRefused, match=f"--older-than '{text}' is not a duration"):
            parse_duration(text)
    assert [parse_duration(t) for t in ("90m", "12h", "30d", "2w")] == [
        timedelta(minutes=90),
        timedelta(hours=12),
        timedelta(days=30),
        timedelta(weeks=2),
    ]
    with pytest.raises(PruneRefused, match="the catalog has no show abc"):
        plan_prune(catalog.engine, settings, PruneRules(keep=1, show="abc"))
    with pytest.raises(PruneRefused, match="the catalog has no shot demo/sq010/sh9999"):
        plan_prune(catalog.engine, settings, PruneRules(keep=1, shot="demo/sq010/sh9999"))
    only = PruneRules(older_than=timedelta(days=30), shot=SHOT)
    with pytest.raises(PruneRefused, match=r"v001 is the shot's only complete version \(made"):
        plan_prune(catalog.engine, settings, only)
    # over the show, the same version is simply kept
    plan = plan_prune(catalog.engine, settings, PruneRules(older_than=timedelta(days=30)))
    assert planned(plan) == ([], ["v001"])
    assert on_disk(root, "v001")


@pytest.fixture
def cli_studio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    root = tmp_path / "studio"
    monkeypatch.setenv("SVFX_HOME", str(root / "home"))
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", str(root))
    cat = open_catalog(f"sqlite:///{root / 'home' / 'catalog.db'}")
    yield root, cat
    cat.close()


def test_the_cli_prints_the_plan_then_deletes_with_yes(cli_studio):
    root, cat = cli_studio
    for n, days in ((1, 40), (2, 30), (3, 20)):
        make_version(cat, root, f"v00{n}", days_ago=days)
    runner = CliRunner()
    plan = runner.invoke(app, ["prune", "--keep", "1", "--show", "demo"])
    assert plan.exit_code == 0, plan.output
    assert "v001" in plan.stdout and "v002" in plan.stdout and "delete" in plan.stdout
    assert "run `svfx prune --keep 1 --show demo --yes` to delete them" in plan.stdout
    assert on_disk(root, "v001") and on_disk(root, "v002")
    as_json = runner.invoke(app, ["prune", "--keep", "1", "--json"])
    assert as_json.exit_code == 0, as_json.output
    rows = json.loads(as_json.stdout)
    assert [(r["folder"], r["action"]) for r in rows["plan"]] == [
        ("v001", "delete"),
        ("v002", "delete"),
    ]
    assert rows["deleted"] == []
    done = runner.invoke(app, ["prune", "--keep", "1", "--yes", "--json"])
    assert done.exit_code == 0, done.output
    deleted = json.loads(done.stdout)["deleted"]
    assert [r["folder"] for r in deleted] == ["v001", "v002"]
    assert all(r["size_bytes"] > 0 for r in deleted)
    assert "deleted 2 version(s)" in done.stderr and "freed" in done.stderr
    assert not on_disk(root, "v001") and not on_disk(root, "v002") and on_disk(root, "v003")
    versions = queries.shot_versions(cat.engine, shot="sh0010")
    gone = [v.deletion for v in versions if v.deletion is not None]
    assert [d.reason for d in gone] == ["prune: --keep 1", "prune: --keep 1"]
    assert all(d.finished_at is not None and "@" in d.requested_by for d in gone)
    again = runner.invoke(app, ["prune", "--keep", "1", "--yes"])
    assert again.exit_code == 0 and "nothing to prune" in again.stdout


def test_the_cli_refuses_bad_input_in_one_line(cli_studio):
    root, cat = cli_studio
    make_version(cat, root, "v001", days_ago=40)
    refusals = {
        (): "no rule given",
        ("--keep", "0"): "--keep 0: keeps the N newest complete versions",
        ("--keep", "-1"): "--keep -1: keeps the N newest complete versions",
        ("--older-than", "soon"): "--older-than 'soon' is not a duration",
        ("--older-than", "30"): "--older-than '30' is not a duration",
        ("--keep", "1", "--show", "abc"): "the catalog has no show abc",
        ("--keep", "1", "--shot", "demo/sq010/sh9"): "the catalog has no shot demo/sq010/sh9",
        ("--keep", "1", "--shot", "demo/../sh0010"): "shot must be SHOW/SEQ/SHOT with plain",
        ("--older-than", "30d", "--shot", SHOT, "--yes"): "v001 is the shot's only complete",
    }
    runner = CliRunner()
    for args, why in refusals.items():
        result = runner.invoke(app, ["prune", *args])
        assert result.exit_code == 2, (args, result.output)
        [line] = result.stderr.strip().splitlines()
        assert line.startswith("error: ") and why in line, (args, line)
        assert result.stdout == ""
    assert on_disk(root, "v001")


def test_serve_has_a_prune_deployment_only_when_configured():
    assert [d.name for d in scheduled.deployments(Settings())] == ["process-shot"]
    settings = Settings(prune_interval_s=86400, prune_keep=3, prune_older_than="30d")
    served = {d.name: d for d in scheduled.deployments(settings)}
    prune = served[prune_flow.PRUNE_DEPLOYMENT]
    assert prune.parameters == {"keep": 3, "older_than": "30d", "invalidated": False}
    [schedule] = prune.schedules
    assert schedule.schedule.interval == timedelta(days=1)
    for bad, why in (({}, "no rule given"), ({"prune_older_than": "soon"}, "'soon'")):
        with pytest.raises(PruneRefused, match=f"SVFX_PRUNE_INTERVAL_S is set .*{why}"):
            scheduled.deployments(Settings(prune_interval_s=86400, **bad))


def test_the_scheduled_prune_deletes_what_the_plan_lists(cli_studio, monkeypatch):
    root, cat = cli_studio
    for n, days in ((1, 40), (2, 30), (3, 20)):
        make_version(cat, root, f"v00{n}", days_ago=days)
    monkeypatch.setattr(prune_flow, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(prune_flow, "create_markdown_artifact", lambda **kw: None)
    done = prune_flow.prune_versions.fn(keep=1, older_than="25d")
    assert done["deleted"] == [f"{SHOT} v001", f"{SHOT} v002"]
    assert done["size_bytes"] > 0
    assert not on_disk(root, "v001") and not on_disk(root, "v002") and on_disk(root, "v003")
