"""Publishing a completed job (publish/): what a publish makes, its catalog record, and
ShotGrid through its own test double (shotgun_api3's mockgun, with the schema of
tests/data/shotgrid): Toolkit's Version and PublishedFile fields, no duplicate on a second
publish, a new Version for a new version, and the faults (tracker down, shot or project
missing, job not complete) recorded pending or refused by name. Tiny UNTRAINED models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.common import free_port
from publish.errors import PublishRefused, TrackerLoginRefused
from publish.item import item_for_job
from publish.run import publish_job, publish_pending
from publish.shotgrid import ShotGridTracker, _translated
from schemas.catalog import queries
from tests.publish_helpers import catalog_of, in_process_client, mockgun, run_shot
from tests.shot_helpers import settings_for

pytestmark = pytest.mark.timeout(300)

client = pytest.fixture(scope="module")(in_process_client)
VERSIONS = ("v001", "v002", "v003", "v004")


@pytest.fixture(scope="module")
def shot(tmp_path_factory, client):
    """One home with a job of each of VERSIONS of demo/sq010/sh010 (v003 and v004 for the
    tests of a publish that does not go through: none published before)."""
    home = tmp_path_factory.mktemp("publish")
    os.environ.pop("SVFX_PUBLISH", None)
    return home, {version: run_shot(home, client, version) for version in VERSIONS}


def _settings(home: Path, **extra):
    return settings_for(home, publish_create=True, **extra)


def test_what_a_publish_of_a_completed_job_makes(shot) -> None:
    home, jobs = shot
    job_id, root = jobs["v001"]
    item = item_for_job(catalog_of(_settings(home)).engine, job_id, _settings(home))
    name = "sh010_sapiens2_v001"
    assert (item.show, item.sequence, item.shot, item.code) == ("demo", "sq010", "sh010", name)
    assert (item.first_frame, item.last_frame, item.version_number) == (1001, 1004, 1)
    assert item.review_pass == "normal" and item.untrained == ["normal"]
    assert item.movie.uri == f"{root}/review/{name}_normal.mp4"
    assert item.thumbnail.uri == f"{root}/previews/{name}_normal_contact.jpg"
    files = {f.kind: f.path for f in item.files}
    assert files == {
        "exr": f"{root}/{name}.%04d.exr",
        "zarr": f"{root}/{name}.zarr",
        "nuke": f"{root}/{name}.nk",
    }
    lines = item.comment.splitlines()
    assert lines[0].startswith("UNTRAINED models (random weights) for normal")
    assert "passes normal" in item.comment and "frames 1001-1004 (4 frames)" in item.comment
    assert any(line.startswith("model normal: sapiens2 ") and "untrained" in line for line in lines)


def test_shotgrid_version_and_published_files_with_toolkit_fields(shot) -> None:
    home, jobs = shot
    job_id, root = jobs["v001"]
    settings = _settings(home)
    catalog = catalog_of(settings)
    sg = mockgun()
    sg.create("LocalStorage", {"code": "primary", "linux_path": str(home)})
    tracker = ShotGridTracker(sg, "mock")
    outcome = publish_job(catalog, job_id, settings, tracker=tracker, again=True)
    assert outcome.status == "published", outcome.reason
    name = "sh010_sapiens2_v001"
    version = sg.find_one(
        "Version",
        [["code", "is", name]],
        ["entity", "sg_task", "sg_path_to_frames", "sg_first_frame", "sg_last_frame",
         "sg_path_to_movie", "description", "frame_range"],
    )  # fmt: skip
    shot_entity = sg.find_one("Shot", [["code", "is", "sh010"]], ["sg_sequence"])
    assert version["entity"]["id"] == shot_entity["id"]
    assert (
        sg.find_one("Task", [["id", "is", version["sg_task"]["id"]]], ["content"])["content"]
        == "Sapiens"
    )
    assert version["sg_path_to_frames"] == f"{root}/{name}.%04d.exr"
    assert (version["sg_first_frame"], version["sg_last_frame"]) == (1001, 1004)
    assert version["frame_range"] == "1001-1004"
    assert version["sg_path_to_movie"] == f"{root}/review/{name}_normal.mp4"
    assert "UNTRAINED" in version["description"] and "passes normal" in version["description"]
    uploads = {field: data for _t, _id, field, _p, data in sg.uploads}
    assert uploads["sg_uploaded_movie"] == Path(version["sg_path_to_movie"]).read_bytes()
    sheet = Path(f"{root}/previews/{name}_normal_contact.jpg").read_bytes()
    assert uploads["image"] == sheet
    published = sg.find(
        "PublishedFile",
        [["version", "is", {"type": "Version", "id": version["id"]}]],
        ["code", "name", "path", "published_file_type", "version_number", "entity", "task"],
    )
    by_type = {
        sg.find_one("PublishedFileType", [["id", "is", p["published_file_type"]["id"]]], ["code"])[
            "code"
        ]: p
        for p in published
    }
    assert set(by_type) == {"EXR Sequence", "Zarr Store", "Nuke Script"}
    assert by_type["EXR Sequence"]["path"]["local_path"] == f"{root}/{name}.%04d.exr"
    assert by_type["Zarr Store"]["path"]["local_path"] == f"{root}/{name}.zarr"
    assert by_type["Nuke Script"]["path"]["local_path"] == f"{root}/{name}.nk"
    assert {p["version_number"] for p in published} == {1}
    assert {p["entity"]["id"] for p in published} == {shot_entity["id"]}
    record = queries.job_publishes(catalog.engine, job_id)
    assert [(r["tracker"], r["status"], r["code"]) for r in record] == [
        ("shotgrid", "published", name)
    ]
    assert record[0]["entity_ids"]["version"] == version["id"]
    assert sorted(record[0]["entity_ids"]["published_files"]) == sorted(p["id"] for p in published)

    # the same job again: nothing new, at the catalog or at the tracker
    assert publish_job(catalog, job_id, settings, tracker=tracker).status == "already published"
    again = publish_job(catalog, job_id, settings, tracker=tracker, again=True)
    assert again.entity_ids == outcome.entity_ids
    assert len(sg.find("Version", [])) == 1 and len(sg.find("PublishedFile", [])) == 3
    assert len(sg.uploads) == 2

    # a new version of the shot: a new Version, files with its number
    job2, _root2 = jobs["v002"]
    second = publish_job(catalog, job2, settings, tracker=tracker)
    assert second.status == "published"
    assert second.entity_ids["version"] != outcome.entity_ids["version"]
    assert second.entity_ids["shot"] == outcome.entity_ids["shot"]
    codes = sorted(v["code"] for v in sg.find("Version", [], ["code"]))
    assert codes == [name, "sh010_sapiens2_v002"]
    numbers = {p["version_number"] for p in sg.find("PublishedFile", [], ["version_number"])}
    assert numbers == {1, 2}


def test_a_shot_missing_in_shotgrid_is_refused_by_name_then_retried(shot) -> None:
    home, jobs = shot
    job_id, _ = jobs["v003"]
    settings = settings_for(home, publish_create=False)
    catalog = catalog_of(settings)
    sg = mockgun()
    tracker = ShotGridTracker(sg, "mock")
    outcome = publish_job(catalog, job_id, settings, tracker=tracker, again=True)
    assert outcome.status == "pending"
    assert "no Sequence 'sq010' for demo/sq010/sh010" in outcome.reason
    assert "SVFX_PUBLISH_CREATE" in outcome.reason
    assert sg.find("Version", []) == []
    pending = queries.pending_publishes(catalog.engine, "shotgrid")
    assert [(p["job_id"], p["reason"]) for p in pending] == [(job_id, outcome.reason)]

    project = {"type": "Project", "id": sg.find_one("Project", [])["id"]}
    seq = sg.create("Sequence", {"project": project, "code": "sq010"})
    shot_entity = sg.create(
        "Shot",
        {"project": project, "code": "sh010", "sg_sequence": {"type": "Sequence", "id": seq["id"]}},
    )
    sg.create("Task", {"project": project, "content": "Sapiens",
                       "entity": {"type": "Shot", "id": shot_entity["id"]}})  # fmt: skip
    retried = publish_pending(catalog, settings, tracker=tracker)
    assert [(o.job_id, o.status) for o in retried] == [(job_id, "published")]
    assert retried[0].entity_ids["shot"] == shot_entity["id"]
    # no LocalStorage holds the outputs: file:// links, as Toolkit writes them
    exr = sg.find_one("PublishedFile", [["code", "is", "sh010_sapiens2_v003.%04d.exr"]], ["path"])
    root = jobs["v003"][1]
    assert exr["path"] == {
        "url": f"file://{root}/sh010_sapiens2_v003.%04d.exr",
        "name": "sh010_sapiens2_v003.%04d.exr",
    }
    assert queries.pending_publishes(catalog.engine) == []
    assert queries.job_publishes(catalog.engine, job_id)[0]["attempts"] >= 2


def test_a_project_the_tracker_lacks_is_refused_by_name(shot) -> None:
    home, jobs = shot
    settings = _settings(home)
    catalog = catalog_of(settings)
    sg = mockgun(project="another_show")
    outcome = publish_job(
        catalog, jobs["v002"][0], settings, tracker=ShotGridTracker(sg, "mock"), again=True
    )
    assert outcome.status == "pending"
    assert outcome.reason == "ShotGrid at mock has no project named 'demo'"
    assert sg.find("Sequence", []) == [] and sg.find("Shot", []) == []


def test_shotgrid_down_leaves_the_publish_pending_without_the_secret(shot) -> None:
    home, jobs = shot
    key = "s3cr3t-key-value"
    settings = settings_for(
        home,
        publish="shotgrid",
        shotgrid_url=f"http://127.0.0.1:{free_port()}",
        shotgrid_script="svfx",
        shotgrid_script_key=key,
        publish_timeout_s=2,
    )
    catalog = catalog_of(settings)
    outcome = publish_job(catalog, jobs["v004"][0], settings, again=True)
    assert outcome.status == "pending"
    assert outcome.reason.startswith(f"ShotGrid at {settings.shotgrid_url} is not reachable")
    assert key not in outcome.reason
    [record] = queries.job_publishes(catalog.engine, jobs["v004"][0])
    assert record["status"] == "pending" and record["reason"] == outcome.reason
    assert key not in repr(record)

    # a failed attempt never undoes a publish that was made
    published = publish_job(catalog, jobs["v001"][0], settings, again=True)
    assert published.status == "pending"
    [kept] = queries.job_publishes(catalog.engine, jobs["v001"][0])
    assert kept["status"] == "published" and kept["reason"] is None and kept["entity_ids"]


def test_a_login_shotgrid_refuses_names_the_settings_not_the_key() -> None:
    from shotgun_api3 import AuthenticationFault

    key = "k-123-secret"
    exc = _translated(AuthenticationFault(f"Can't authenticate script 'svfx' ({key})"), "site", key)
    assert isinstance(exc, TrackerLoginRefused)
    assert "SVFX_SHOTGRID_SCRIPT_KEY" in exc.message and key not in exc.message


def test_a_job_that_is_not_complete_is_refused_saying_what_is_missing(shot) -> None:
    home, _jobs = shot
    from tests.catalog_fixtures import make_plate, make_spec

    settings = _settings(home)
    catalog = catalog_of(settings)
    spec = make_spec(home, shot="sh0099")
    job_id = catalog.register_job(spec, make_plate(spec, range(1001, 1005)), None)
    with pytest.raises(PublishRefused, match=rf"job {job_id} \(.*sh0099\) is (queued|running)"):
        publish_job(catalog, job_id, settings, tracker=ShotGridTracker(mockgun(), "mock"))
    with pytest.raises(PublishRefused, match="the catalog has no job 999999"):
        publish_job(catalog, 999999, settings, tracker=ShotGridTracker(mockgun(), "mock"))


def test_a_job_completes_with_its_tracker_down_then_svfx_publish_pending(
    tmp_path, client, monkeypatch
) -> None:
    """SVFX_PUBLISH set and ShotGrid away while a job completes: the job is complete, the
    publish pending with the reason; `svfx publish --pending` says so again (exit 2) while it
    is away, and publishes once it answers; `svfx catalog publishes` shows it."""
    from typer.testing import CliRunner

    import publish.shotgrid as shotgrid
    from cli.main import app

    key = "very-secret-key"
    env = {
        "SVFX_HOME": str(tmp_path),
        "SVFX_ALLOWED_ROOTS": str(tmp_path),
        "SVFX_PUBLISH": "shotgrid",
        "SVFX_PUBLISH_CREATE": "true",
        "SVFX_SHOTGRID_URL": f"http://127.0.0.1:{free_port()}",
        "SVFX_SHOTGRID_SCRIPT": "svfx",
        "SVFX_SHOTGRID_SCRIPT_KEY": key,
        "SVFX_PUBLISH_TIMEOUT_S": "2",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job_id, _root = run_shot(tmp_path, client)
    catalog = catalog_of(settings_for(tmp_path))
    assert queries.job(catalog.engine, job_id)["status"] == "complete"
    [record] = queries.job_publishes(catalog.engine, job_id)
    assert record["status"] == "pending" and "is not reachable" in record["reason"]
    assert key not in repr(record)

    runner = CliRunner()
    away = runner.invoke(app, ["publish", "--pending"])
    assert away.exit_code == 2, away.output
    assert f"job {job_id} pending on shotgrid: ShotGrid at" in away.output
    assert key not in away.output

    sg = mockgun()
    monkeypatch.setattr(shotgrid, "connect", lambda _settings: shotgrid.ShotGridTracker(sg, "mock"))
    back = runner.invoke(app, ["publish", "--pending", "--json"])
    assert back.exit_code == 0, back.output
    assert '"status": "published"' in back.output
    assert [v["code"] for v in sg.find("Version", [], ["code"])] == ["sh010_sapiens2_v001"]
    again = runner.invoke(app, ["publish", "--shot", "demo/sq010/sh010", "--version", "v001"])
    assert again.exit_code == 0 and "already published" in again.output
    listed = runner.invoke(app, ["catalog", "publishes", "demo", "--json"])
    assert '"tracker": "shotgrid"' in listed.output and '"status": "published"' in listed.output
    assert len(sg.find("Version", [])) == 1


def test_the_api_and_the_shot_page_show_what_was_published_where(shot) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app

    home, jobs = shot
    settings = _settings(home)
    catalog = catalog_of(settings)
    sg = mockgun()
    publish_job(catalog, jobs["v001"][0], settings, tracker=ShotGridTracker(sg, "mock"), again=True)
    http = TestClient(create_app(settings, engine=catalog.engine))
    body = http.get("/api/shots/demo/sq010/sh010/publishes").json()
    published = [p for p in body["items"] if p["status"] == "published"]
    assert published and published[0]["tracker"] == "shotgrid"
    assert published[0]["code"] == "sh010_sapiens2_v001" and published[0]["published_at"]
    version_id = published[0]["entity_ids"]["version"]
    assert version_id == sg.find_one("Version", [["code", "is", "sh010_sapiens2_v001"]])["id"]
    pending = http.get("/api/shots/demo/sq010/sh010/publishes?status=pending").json()
    assert all(p["status"] == "pending" and p["reason"] for p in pending["items"])
    detail = http.get("/api/shots/demo/sq010/sh010").json()
    assert {p["id"] for p in detail["publishes"]} >= {published[0]["id"]}
    page = http.get("/shots/demo/sq010/sh010").text
    assert "Published to trackers" in page and "sh010_sapiens2_v001" in page
    assert f"version {version_id}" in page


def test_a_tracker_setting_missing_is_named_and_the_publish_left_pending(shot, tmp_path) -> None:
    home, jobs = shot
    settings = settings_for(home, publish="kitsu", kitsu_host="http://127.0.0.1:9")
    catalog = catalog_of(settings)
    outcome = publish_job(catalog, jobs["v001"][0], settings, again=True)
    assert outcome.status == "pending"
    assert outcome.reason == (
        "publishing to Kitsu needs SVFX_KITSU_EMAIL, SVFX_KITSU_PASSWORD "
        "(or SVFX_KITSU_PASSWORD_FILE)"
    )
    missing = tmp_path / "no-such-file"
    settings = settings_for(
        home, publish="shotgrid", shotgrid_url="https://x", shotgrid_script="s",
        shotgrid_script_key_file=missing,
    )  # fmt: skip
    outcome = publish_job(catalog, jobs["v001"][0], settings, again=True)
    assert outcome.reason == (
        f"SVFX_SHOTGRID_SCRIPT_KEY_FILE {missing}: cannot be read (No such file or directory)"
    )


def test_a_name_the_tracker_refuses_is_said_in_one_line_as_the_tracker_words_it() -> None:
    """What each client raises when the tracker refuses a name or an entity, as our refusal
    (recorded pending, retried by --pending once the name is fixed); the secret redacted."""
    from gazu.exception import ParameterException
    from shotgun_api3 import Fault

    from publish import kitsu
    from publish.errors import TrackerRefused

    refused = kitsu._translated(
        ParameterException("data/sequences", "name 'sq 010' is not valid (pw-1)"), "k", "pw-1"
    )
    assert isinstance(refused, TrackerRefused)
    assert refused.message.startswith("Kitsu at k refuses the publish: ParameterException:")
    assert "sq 010" in refused.message and "pw-1" not in refused.message
    sg = _translated(Fault("API create() CRUD ERROR #6: code 'sh 010' is invalid"), "s", None)
    assert isinstance(sg, TrackerRefused) and "code 'sh 010' is invalid" in sg.message
