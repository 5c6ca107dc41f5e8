"""`svfx delete`: a version's folder off the disk and its outputs marked deleted in the catalog,
refused by name when it must not go, finished by running it again when it was stopped half
way, made again by a resubmit. On SQLite and PostgreSQL with real files; one real shot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from schemas.catalog import open_catalog, queries
from schemas.catalog.errors import VersionBeingDeleted
from schemas.catalog.lease import end_run, start_run
from schemas.settings import Settings
from tasks import deletion
from tasks.deletion import DeleteRefused, plan_delete
from tests import catalog_fixtures
from tests.catalog_fixtures import folder_of, make_chunk, make_plate, make_spec, make_version

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
studio = catalog_fixtures.studio
SHOT = "demo/sq010/sh0010"
FRAMES = catalog_fixtures.VERSION_FRAMES


def test_a_deleted_version_is_gone_from_disk_and_marked_in_the_catalog(catalog, studio):
    root, settings = studio
    spec, _job = make_version(catalog, root)
    plan = plan_delete(catalog.engine, settings, SHOT, "v001")
    [version] = plan.versions
    files = deletion.files_of(version, settings)
    assert len(files) == 4 * 5 + 1  # per frame: EXR, 2 previews, pose JSON; one Zarr chunk
    done = deletion.delete(catalog, settings, version, requested_by="alice@ws1", reason="test")
    assert not Path(folder_of(spec)).exists()
    assert (done.files, done.size_bytes, done.outputs) == (
        21,
        2100,
        4 * 7,
    )  # rows: normal 3, seg 2, pose 2 per frame
    assert queries.outputs_page(catalog.engine, shot="sh0010") == ([], 0)
    [again] = queries.shot_versions(catalog.engine, shot="sh0010")
    assert again.deletion is not None and again.deletion.requested_by == "alice@ws1"
    assert again.deletion.finished_at is not None and again.outputs == 0
    # provenance still answers for the deleted file, and says it is deleted
    exr = next(o.uri for f in make_chunk(spec, FRAMES).frames for o in f.outputs)
    answer = queries.output_provenance(catalog.engine, exr)
    assert answer is not None and all(o["deleted_at"] for o in answer["outputs"])
    # a second delete has nothing to do
    assert plan_delete(catalog.engine, settings, SHOT, "v001").versions == []


def test_a_delete_stopped_half_way_is_finished_by_running_it_again(catalog, studio, monkeypatch):
    root, settings = studio
    spec, _job = make_version(catalog, root)
    [version] = plan_delete(catalog.engine, settings, SHOT, "v001").versions

    def killed(*_args, **_kwargs):
        raise KeyboardInterrupt  # the process stopped after marking, before the files went

    fs, _path = settings.location(version.folder).fs_and_path()
    monkeypatch.setattr(type(fs), "rm", killed)
    with pytest.raises(KeyboardInterrupt):
        deletion.delete(catalog, settings, version, requested_by="a", reason="test")
    monkeypatch.undo()
    # every frame is marked deleted though its files are still there; nothing may write there
    assert queries.outputs_page(catalog.engine, shot="sh0010")[1] == 0
    assert Path(folder_of(spec)).exists()
    with pytest.raises(VersionBeingDeleted, match="run the same `svfx delete` again"):
        catalog.register_job(spec, make_plate(spec, FRAMES), None, output_root=folder_of(spec))
    [version] = plan_delete(catalog.engine, settings, SHOT, "v001").versions
    assert version.deletion is not None and version.deletion.finished_at is None
    deletion.delete(catalog, settings, version, requested_by="a", reason="test")
    assert not Path(folder_of(spec)).exists()
    [gone] = queries.shot_versions(catalog.engine, shot="sh0010")
    assert gone.deletion is not None and gone.deletion.finished_at is not None
    assert gone.deletion.size_bytes > 0
    # and a resubmit makes it again: its outputs are on disk and live again
    make_version(catalog, root)
    [back] = queries.shot_versions(catalog.engine, shot="sh0010")
    assert back.deletion is None and back.outputs == 4 * 7


def test_a_file_the_storage_will_not_remove_is_named_and_a_rerun_finishes(
    catalog, studio, monkeypatch
):
    root, settings = studio
    spec, _job = make_version(catalog, root)
    [version] = plan_delete(catalog.engine, settings, SHOT, "v001").versions

    def refused(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")

    fs, _path = settings.location(version.folder).fs_and_path()
    monkeypatch.setattr(type(fs), "rm", refused)
    with pytest.raises(deletion.DeletionStopped, match="Permission denied; its outputs are"):
        deletion.delete(catalog, settings, version, requested_by="a", reason="test")
    monkeypatch.undo()
    [version] = plan_delete(catalog.engine, settings, SHOT, "v001").versions
    deletion.delete(catalog, settings, version, requested_by="a", reason="test")
    assert not Path(folder_of(spec)).exists()


def test_what_a_delete_refuses(catalog, studio):
    root, settings = studio
    spec, job_id = make_version(catalog, root)
    refusals = {
        "demo/sq010/sh9999": "the catalog has no shot demo/sq010/sh9999",
        "demo/../sh0010": "shot must be SHOW/SEQ/SHOT with plain names",
        "demo/sq010": "shot must be SHOW/SEQ/SHOT",
    }
    for shot, why in refusals.items():
        with pytest.raises(DeleteRefused, match=why):
            plan_delete(catalog.engine, settings, shot, "v001")
    with pytest.raises(DeleteRefused, match=r"has no version v009 \(it has v001\)"):
        plan_delete(catalog.engine, settings, SHOT, "v009")
    elsewhere = Settings(home=root / "home", allowed_roots=[str(root / "plates")])
    with pytest.raises(DeleteRefused, match="lies outside the allowed roots"):
        plan_delete(catalog.engine, elsewhere, SHOT, "v001")
    catalog.record_publish(job_id, "kitsu", code="sh0010_v001")
    with pytest.raises(DeleteRefused, match=r"published to kitsu as 'sh0010_v001'.*--force"):
        plan_delete(catalog.engine, settings, SHOT, "v001")
    forced = plan_delete(catalog.engine, settings, SHOT, "v001", force=True)
    assert forced.forced == [f"{SHOT} v001: was published to kitsu as 'sh0010_v001'"]
    assert Path(folder_of(spec)).exists()  # planning deletes nothing


def test_a_version_a_live_job_writes_is_refused(catalog, studio):
    root, settings = studio
    spec = make_spec(root)
    owner = start_run()
    try:
        job_id = catalog.register_job(
            spec, make_plate(spec, FRAMES), None, output_root=folder_of(spec), owner=owner
        )
        with pytest.raises(DeleteRefused, match=f"job {job_id} is still running"):
            plan_delete(catalog.engine, settings, SHOT, "v001")
    finally:
        end_run(owner)


def test_a_stabilised_versions_source_is_kept_unless_forced(catalog, studio):
    root, settings = studio
    make_version(catalog, root)
    made = {"temporal": "stabilize", "source_version": "v001", "fusion_method": "m1"}
    make_version(catalog, root, version="v002", **made)
    with pytest.raises(DeleteRefused, match="v002 was made from it"):
        plan_delete(catalog.engine, settings, SHOT, "v001")
    [source] = plan_delete(catalog.engine, settings, SHOT, "v001", force=True).versions
    deletion.delete(catalog, settings, source, requested_by="a", reason="test")
    [v1, v2] = queries.shot_versions(catalog.engine, shot="sh0010")
    assert v1.deletion is not None and v2.deletion is None and v2.outputs == 4 * 7


def test_the_cli_dry_run_lists_and_deletes_nothing_then_deletes(tmp_path, monkeypatch):
    root = tmp_path / "studio"
    monkeypatch.setenv("SVFX_HOME", str(root / "home"))
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", str(root))
    cat = open_catalog(f"sqlite:///{root / 'home' / 'catalog.db'}")
    spec, _job = make_version(cat, root)
    runner = CliRunner()
    dry = runner.invoke(app, ["delete", SHOT, "--version", "v001", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    [row] = json.loads(dry.stdout)
    assert (row["files"], row["size_bytes"], row["status"]) == (21, 2100, "would be deleted")
    assert Path(folder_of(spec)).exists()
    done = runner.invoke(app, ["delete", SHOT, "--version", "v001"])
    assert done.exit_code == 0, done.output
    assert "deleted" in done.stdout and not Path(folder_of(spec)).exists()
    again = runner.invoke(app, ["delete", SHOT, "--version", "v001"])
    assert again.exit_code == 0 and "was deleted already" in again.stderr
    refused = runner.invoke(app, ["delete", SHOT, "--version", "v7"])
    assert refused.exit_code == 2
    assert refused.stderr.strip().splitlines() == [f"error: {SHOT} has no version v7 (it has v001)"]


def test_a_version_on_s3_is_deleted_there(catalog, s3_bucket, tmp_path):
    import s3fs

    bucket, options = s3_bucket
    settings = Settings(
        home=tmp_path / "home",
        allowed_roots=[bucket],
        s3_endpoint_url=options["client_kwargs"]["endpoint_url"],
    )
    spec = make_spec(bucket)  # type: ignore[arg-type]  # its outputs under s3://bucket/out
    job_id = catalog.register_job(spec, make_plate(spec, FRAMES), None, output_root=folder_of(spec))
    chunk = make_chunk(spec, FRAMES)
    fs = s3fs.S3FileSystem(**options)
    for frame in chunk.frames:
        for out in frame.outputs:
            fs.pipe(out.uri + ("/c0" if out.kind == "zarr" else ""), b"x" * 100)
    catalog.record_chunk(job_id, chunk)
    catalog.finish_job(job_id, "complete")
    [version] = plan_delete(catalog.engine, settings, SHOT, "v001").versions
    assert len(deletion.files_of(version, settings)) == 21
    done = deletion.delete(catalog, settings, version, requested_by="a", reason="test")
    assert (done.files, done.size_bytes) == (21, 2100)
    fs.invalidate_cache()
    assert fs.find(bucket) == []  # every object of the version is gone


def test_a_deleted_version_is_made_again_by_a_resubmit(tmp_path):
    """Through the real flow: a shot run, deleted, run again: every frame is computed anew
    (none skipped, none adopted) and its outputs are on disk and live in the catalog."""
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot
    from schemas.spec import parse_spec
    from tests.shot_helpers import local_client, make_plate, settings_for, spec_data

    settings = settings_for(tmp_path)
    cat = open_catalog(settings.catalog)
    pattern = make_plate(tmp_path / "plates", frames=2)
    spec = parse_spec(spec_data(pattern, tmp_path / "out", passes="matte"))
    cluster = local_client(1)
    client = next(cluster)
    try:  # one cluster for both runs
        first = run_planned_shot(plan_shot(spec, settings), cat, client)
        [version] = plan_delete(cat.engine, settings, spec.shot_path, "v001").versions
        deletion.delete(cat, settings, version, requested_by="a", reason="test")
        assert not Path(first.output_root).exists()
        again = run_planned_shot(plan_shot(spec, settings), cat, client)
    finally:
        cluster.close()
    assert (again.status, again.done, again.skipped, again.adopted) == (
        "complete", [1001, 1002], [], []
    )  # fmt: skip
    assert Path(again.exr_pattern % 1001).is_file()
    [back] = queries.shot_versions(cat.engine, shot=spec.shot)
    live = queries.outputs_page(cat.engine, shot=spec.shot, limit=1000)[1]
    assert back.deletion is None and back.outputs == live > 0
