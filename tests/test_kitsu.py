"""Publishing to a real Kitsu (`pytest -m kitsu`): zou from PyPI in its own venv on a
throwaway PostgreSQL and redis-server (tests/kitsu_server.py), read back with gazu: the
comment, the preview revision (the review clip; the contact sheet's pixels), the output
files; a second publish of the same job makes nothing new, a new version makes a new
revision; a shot Kitsu lacks is refused by name; a refused login and a Kitsu that is down
leave the publish pending with the reason, the password never in it. Tiny UNTRAINED models."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.common import free_port
from publish.item import item_for_job
from publish.kitsu import KitsuTracker, connect
from publish.run import publish_job
from schemas.catalog import queries
from tests.kitsu_server import kitsu_server
from tests.publish_helpers import catalog_of, in_process_client, run_shot
from tests.shot_helpers import settings_for

pytestmark = [pytest.mark.kitsu, pytest.mark.timeout(600)]

kitsu = pytest.fixture(scope="module")(kitsu_server)
client = pytest.fixture(scope="module")(in_process_client)


@pytest.fixture(scope="module")
def gazu_admin(kitsu):
    """gazu logged in as Kitsu's admin, with the project 'demo' (vfx style)."""
    import gazu

    admin = gazu.client.create_client(kitsu.host)
    gazu.log_in(kitsu.email, kitsu.password, client=admin)
    gazu.project.new_project("demo", production_style="vfx", client=admin)
    return admin


@pytest.fixture(scope="module")
def shot(tmp_path_factory, client):
    home = tmp_path_factory.mktemp("kitsu")
    v1 = run_shot(home, client, "v001")
    v2 = run_shot(home, client, "v002")
    return home, {"v001": v1, "v002": v2}


def _settings(home: Path, kitsu, **extra):
    values = {
        "publish": "kitsu",
        "publish_create": True,
        "kitsu_host": kitsu.host,
        "kitsu_email": kitsu.email,
        "kitsu_password": kitsu.password,
        **extra,
    }
    return settings_for(home, **values)


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)


@pytest.mark.slow
def test_a_shot_published_to_kitsu_read_back_with_gazu(shot, kitsu, gazu_admin, tmp_path) -> None:
    import gazu

    home, jobs = shot
    settings = _settings(home, kitsu)
    catalog = catalog_of(settings)
    job_id, root = jobs["v001"]
    tracker = connect(settings)
    outcome = publish_job(catalog, job_id, settings, tracker=tracker)
    assert outcome.status == "published", outcome.reason
    ids = outcome.entity_ids
    c = gazu_admin
    project = gazu.project.get_project_by_name("demo", client=c)
    sequence = gazu.shot.get_sequence_by_name(project, "sq010", client=c)
    shot_entity = gazu.shot.get_shot_by_name(sequence, "sh010", client=c)
    assert shot_entity["id"] == ids["shot"]
    task_type = gazu.task.get_task_type_by_name("Sapiens", "Shot", client=c)
    task = gazu.task.get_task_by_entity(shot_entity, task_type, client=c)
    assert task["id"] == ids["task"]

    item = item_for_job(catalog.engine, job_id, settings)
    comments = gazu.task.all_comments_for_task(task, client=c)
    assert [cm["id"] for cm in comments] == [ids["comment"]]
    text = comments[0]["text"]
    assert "UNTRAINED" in text and "passes normal" in text and "frames 1001-1004" in text
    assert text == item.comment

    previews = gazu.files.get_all_preview_files_for_task(task, client=c)
    assert {p["revision"] for p in previews} == {1} and ids["revision"] == 1
    movie = gazu.files.wait_for_preview_file(ids["preview_file"], timeout=120, poll_interval=1,
                                             client=c)  # fmt: skip
    assert (movie["extension"], movie["status"]) == ("mp4", "ready"), kitsu.log_tail()
    sheet = gazu.files.wait_for_preview_file(ids["thumbnail"], timeout=60, poll_interval=1,
                                             client=c)  # fmt: skip
    assert sheet["status"] == "ready" and sheet["revision"] == 1
    got = tmp_path / "sheet.png"
    gazu.files.download_preview_file(sheet, str(got), client=c)
    ours = _pixels(Path(f"{root}/previews/sh010_sapiens2_v001_normal_contact.jpg").read_bytes())
    theirs = _pixels(got.read_bytes())
    assert theirs.shape == ours.shape
    assert np.abs(theirs - ours).max() <= 2  # zou re-encodes: pixels, not bytes
    refreshed = gazu.shot.get_shot(shot_entity["id"], client=c)
    assert refreshed["preview_file_id"] == ids["thumbnail"]

    files = gazu.files.all_output_files_for_entity(shot_entity, client=c)
    by_kind = {f["representation"]: f for f in files}
    name = "sh010_sapiens2_v001"
    assert set(by_kind) == {"exr", "zarr", "nuke"}
    assert by_kind["exr"]["path"] == f"{root}/{name}.%04d.exr"
    assert by_kind["exr"]["nb_elements"] == 4
    assert by_kind["zarr"]["path"] == f"{root}/{name}.zarr"
    assert by_kind["nuke"]["path"] == f"{root}/{name}.nk"
    assert {f["name"] for f in files} == {name} and {f["revision"] for f in files} == {1}
    assert sorted(f["id"] for f in files) == sorted(ids["output_files"])

    # the same job again: nothing new
    again = publish_job(catalog, job_id, settings, tracker=tracker, again=True)
    assert again.status == "published"
    assert again.entity_ids["output_files"] == sorted(ids["output_files"])
    assert again.entity_ids["comment"] == ids["comment"]
    assert len(gazu.task.all_comments_for_task(task, client=c)) == 1
    assert len(gazu.files.get_all_preview_files_for_task(task, client=c)) == 2
    assert len(gazu.files.all_output_files_for_entity(shot_entity, client=c)) == 3

    # a new version of the shot: a new revision
    second = publish_job(catalog, jobs["v002"][0], settings, tracker=tracker)
    assert second.status == "published" and second.entity_ids["revision"] == 2
    assert second.entity_ids["shot"] == ids["shot"] and second.entity_ids["task"] == ids["task"]
    assert len(gazu.task.all_comments_for_task(task, client=c)) == 2
    assert {p["revision"] for p in gazu.files.get_all_preview_files_for_task(task, client=c)} == {
        1,
        2,
    }
    v2_files = gazu.files.all_output_files_for_entity(
        shot_entity, name="sh010_sapiens2_v002", client=c
    )
    assert len(v2_files) == 3 and {f["revision"] for f in v2_files} == {2}
    [record] = queries.job_publishes(catalog.engine, jobs["v002"][0])
    assert record["status"] == "published" and record["entity_ids"]["revision"] == 2

    # a publish cut short (an output file lost): completed, nothing else made again
    nuke = next(f for f in v2_files if f["representation"] == "nuke")
    gazu.client.delete(f"data/output-files/{nuke['id']}", client=c)
    resumed = publish_job(catalog, jobs["v002"][0], settings, tracker=tracker, again=True)
    assert resumed.status == "published" and resumed.entity_ids["revision"] == 2
    assert resumed.entity_ids["comment"] == second.entity_ids["comment"]
    assert len(gazu.task.all_comments_for_task(task, client=c)) == 2
    assert len(gazu.files.get_all_preview_files_for_task(task, client=c)) == 4
    v2_again = gazu.files.all_output_files_for_entity(
        shot_entity, name="sh010_sapiens2_v002", client=c
    )
    assert sorted(f["representation"] for f in v2_again) == ["exr", "nuke", "zarr"]
    assert nuke["id"] not in {f["id"] for f in v2_again}


def test_a_shot_kitsu_lacks_is_refused_by_name(shot, kitsu, gazu_admin) -> None:
    import gazu

    home, jobs = shot
    settings = _settings(home, kitsu, publish_create=False)
    catalog = catalog_of(settings)
    gazu.project.new_project("other", production_style="vfx", client=gazu_admin)
    tracker = connect(settings)
    # the publish of a shot whose sequence Kitsu lacks (a project without it)
    item = item_for_job(catalog.engine, jobs["v001"][0], settings)
    moved = dataclasses.replace(item, show="other")
    with pytest.raises(Exception, match=r"has no sequence 'sq010' for other/sq010/sh010"):
        tracker.publish(moved)
    assert (
        gazu.shot.all_sequences_for_project(
            gazu.project.get_project_by_name("other", client=gazu_admin), client=gazu_admin
        )
        == []
    )


def test_a_login_kitsu_refuses_and_kitsu_down_leave_the_publish_pending(
    shot, kitsu, gazu_admin
) -> None:
    home, jobs = shot
    wrong = "not-the-password-123"
    settings = _settings(home, kitsu, kitsu_password=wrong)
    catalog = catalog_of(settings)
    job_id = jobs["v002"][0]
    refused = publish_job(catalog, job_id, settings, again=True)
    assert refused.status == "pending"
    assert refused.reason.startswith(f"Kitsu at {kitsu.host} refuses the login")
    assert "SVFX_KITSU_PASSWORD" in refused.reason and wrong not in refused.reason

    down = _settings(home, kitsu, kitsu_host=f"http://127.0.0.1:{free_port()}")
    away = publish_job(catalog, job_id, down, again=True)
    assert away.status == "pending" and "is not reachable" in away.reason
    assert kitsu.password not in away.reason
    [record] = queries.job_publishes(catalog.engine, job_id)  # published before: it stays
    assert record["status"] == "published" and record["reason"] is None
    assert record["entity_ids"]["revision"] == 2 and record["attempts"] >= 3
    assert isinstance(connect(_settings(home, kitsu)), KitsuTracker)
