"""Deleting a version through the API and the shot page's form: behind the token, the same
plan and refusals as `svfx delete` (tests/test_delete.py holds its semantics)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from schemas.catalog import queries
from schemas.catalog.lease import end_run, start_run
from schemas.settings import Settings
from tests import catalog_fixtures
from tests.catalog_fixtures import folder_of, make_plate, make_spec, make_version

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
TOKEN = "delete-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
URL = "/api/shots/demo/sq010/sh0010/versions"


@pytest.fixture
def studio(catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SVFX_API_TOKEN", raising=False)
    root = tmp_path / "studio"
    root.mkdir()
    settings = Settings(home=root / "home", allowed_roots=[str(root)])
    client = TestClient(create_app(settings, engine=catalog.engine, token=TOKEN))
    return root, client


def test_the_api_deletes_a_version_behind_the_token(catalog, studio):
    root, client = studio
    spec, _job = make_version(catalog, root)
    assert client.delete(f"{URL}/v001").status_code == 401
    wrong = client.delete(f"{URL}/v001", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403 and wrong.json()["detail"] == "wrong bearer token"
    dry = client.delete(f"{URL}/v001", params={"dry_run": True}, headers=AUTH)
    assert dry.status_code == 200, dry.text
    [folder] = dry.json()["folders"]
    assert (folder["files"], folder["size_bytes"], folder["status"]) == (
        21,
        2100,
        "would be deleted",
    )
    assert Path(folder_of(spec)).exists()
    done = client.delete(f"{URL}/v001", headers=AUTH)
    assert done.status_code == 200 and done.json()["folders"][0]["status"] == "deleted"
    assert not Path(folder_of(spec)).exists()
    [gone] = queries.shot_versions(catalog.engine, shot="sh0010")
    assert gone.deletion is not None and gone.deletion.requested_by == "API token from testclient"
    outputs = client.get("/api/shots/demo/sq010/sh0010/outputs").json()
    assert outputs["total"] == 0, outputs
    again = client.delete(f"{URL}/v001", headers=AUTH)
    assert again.status_code == 200 and again.json()["already_deleted"] == ["v001"]


def test_the_api_refuses_with_the_reason(catalog, studio):
    root, client = studio
    _spec, job_id = make_version(catalog, root)
    missing = client.delete(f"{URL}/v009", headers=AUTH)
    assert missing.status_code == 404
    assert missing.json()["detail"] == "demo/sq010/sh0010 has no version v009 (it has v001)"
    unknown = client.delete("/api/shots/demo/sq010/nope/versions/v001", headers=AUTH)
    assert unknown.status_code == 404
    assert client.delete(f"{URL}/v1", headers=AUTH).status_code == 422
    catalog.record_publish(job_id, "shotgrid", code="sh0010_v001")
    kept = client.delete(f"{URL}/v001", headers=AUTH)
    assert kept.status_code == 409 and "published to shotgrid" in kept.json()["detail"]
    forced = client.delete(f"{URL}/v001", params={"force": True}, headers=AUTH)
    assert forced.status_code == 200
    assert forced.json()["forced"] == ["demo/sq010/sh0010 v001: was published to shotgrid as "
                                       "'sh0010_v001'"]  # fmt: skip


def test_a_version_a_live_job_writes_is_a_conflict(catalog, studio):
    root, client = studio
    spec = make_spec(root)
    owner = start_run()
    try:
        catalog.register_job(
            spec, make_plate(spec, range(1, 3)), None, output_root=folder_of(spec), owner=owner
        )
        busy = client.delete(f"{URL}/v001", headers=AUTH)
        assert busy.status_code == 409 and "is still running" in busy.json()["detail"]
    finally:
        end_run(owner)


def test_the_shot_page_deletes_with_the_token_in_its_form(catalog, studio):
    root, client = studio
    spec, _job = make_version(catalog, root)
    page = client.get("/shots/demo/sq010/sh0010")
    assert 'action="/shots/demo/sq010/sh0010/delete"' in page.text
    form = {"version": "v001", "token": "nope", "dry_run": "true"}
    refused = client.post("/shots/demo/sq010/sh0010/delete", data=form)
    assert refused.status_code == 403 and "refused: wrong bearer token" in refused.text
    assert TOKEN not in refused.text
    dry = client.post("/shots/demo/sq010/sh0010/delete", data={**form, "token": TOKEN})
    assert dry.status_code == 200 and "Dry run: nothing was deleted" in dry.text
    assert Path(folder_of(spec)).exists()
    done = client.post("/shots/demo/sq010/sh0010/delete", data={"version": "v001", "token": TOKEN})
    assert done.status_code == 200 and "deleted" in done.text and TOKEN not in done.text
    assert not Path(folder_of(spec)).exists()
