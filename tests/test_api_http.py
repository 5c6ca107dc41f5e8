"""The OpenAPI document and the HTTP answers agree, on SQLite and PostgreSQL: every 422 is the
documented Problem (one readable string naming each bad parameter) and every operation's 422
refers to it; /api/search with no parameters (valid per the document) answers; OPTIONS lists
every method of a path (GET and POST of /api/shots live on two routers); HEAD is answered
wherever GET is. And `svfx api`: its help names /openapi.json, --workers N serves with N
uvicorn worker processes from an import string."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.app import WORKER_SETTINGS, app_from_environment, run_api
from cli.main import app as svfx_app
from schemas.settings import Settings
from tests import api_fixtures, catalog_fixtures
from tests.api_fixtures import AUTH, A, Filled, detail, good_spec

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
filled = api_fixtures.filled

PROBLEM = {"$ref": "#/components/schemas/Problem"}


def test_every_422_is_one_readable_detail_naming_each_parameter(filled: Filled) -> None:
    many = filled.client.get("/api/shots", params={"limit": 0, "offset": -1, "show": "../x"})
    assert many.status_code == 422
    reason = detail(many)
    for name in ("query parameter limit", "query parameter offset", "query parameter show"):
        assert name in reason, reason
    assert "greater than or equal to 1" in reason
    path = filled.client.get("/api/jobs/abc")
    assert detail(path) == (
        "invalid request: path parameter job_id: "
        "Input should be a valid integer, unable to parse string as an integer"
    )
    missing = filled.client.get("/api/provenance")
    assert detail(missing) == "invalid request: query parameter path: Field required"
    page = filled.client.get("/", params={"limit": "x"})  # the pages' refusals alike
    assert "query parameter limit" in detail(page)


def test_every_operation_documents_its_422_as_a_problem(filled: Filled) -> None:
    document = filled.client.get("/openapi.json").json()
    operations = [
        (f"{method.upper()} {path}", operation)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    ]
    assert len(operations) == 15
    assert {"GET /api/usage", "DELETE /api/shots/{show}/{sequence}/{shot}/versions/{version}"} <= {
        name for name, _ in operations
    }
    for name, operation in operations:
        responses = operation["responses"]
        assert responses["422"]["content"]["application/json"]["schema"] == PROBLEM, name
        for status, response in responses.items():
            if int(status) >= 400:
                assert response["content"]["application/json"]["schema"] == PROBLEM, (
                    name,
                    status,
                )
    names = set(document["components"]["schemas"])
    assert not names & {"HTTPValidationError", "ValidationError"}


def test_search_with_no_checksum_lists_every_output(filled: Filled) -> None:
    search = filled.client.get("/api/search")
    assert search.status_code == 200
    everything = filled.client.get("/api/search", params={"limit": 1000}).json()
    per_shot = 0
    for shot in filled.client.get("/api/shots").json()["items"]:
        url = f"/api/shots/{shot['show']}/{shot['sequence']}/{shot['shot']}/outputs"
        per_shot += filled.client.get(url, params={"limit": 1000}).json()["total"]
    assert everything["total"] == len(everything["items"]) == per_shot == 6 * 7 + 4 * 7 + 2
    assert search.json()["items"] == everything["items"][:100]
    paged = filled.client.get("/api/search", params={"limit": 5, "offset": 5}).json()
    assert (paged["total"], paged["items"]) == (everything["total"], everything["items"][5:10])
    document = filled.client.get("/openapi.json").json()
    assert "422" in document["paths"]["/api/search"]["get"]["responses"]  # bad checksums only


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("/api/shots", "GET, HEAD, OPTIONS, POST"),
        (f"/api/shots/{A}", "GET, HEAD, OPTIONS"),
        ("/api/jobs/1/retry", "OPTIONS, POST"),
        ("/api/jobs/1", "GET, HEAD, OPTIONS"),
        ("/files/outputs/1", "GET, HEAD, OPTIONS"),
        ("/", "GET, HEAD, OPTIONS"),
        ("/openapi.json", "GET, HEAD, OPTIONS"),
    ],
)
def test_options_lists_every_method_of_the_path(filled: Filled, url: str, allowed: str) -> None:
    response = filled.client.options(url)
    assert (response.status_code, response.headers["allow"], response.content) == (
        204,
        allowed,
        b"",
    )
    wrong = filled.client.delete(url)
    assert (wrong.status_code, wrong.headers["allow"]) == (405, allowed)
    assert "DELETE is not allowed" in detail(wrong)


def test_options_and_head_on_unknown_paths_are_404(filled: Filled) -> None:
    assert filled.client.options("/api/nothing").status_code == 404
    assert filled.client.head("/api/nothing").status_code == 404


def _head_like_get(client: TestClient, url: str) -> None:
    got, head = client.get(url), client.head(url)
    assert head.status_code == got.status_code, url
    assert head.content == b"", url
    for name in ("content-type", "content-length", "etag", "content-security-policy"):
        assert head.headers.get(name) == got.headers.get(name), (url, name)


def test_head_is_answered_wherever_get_is(filled: Filled) -> None:
    outputs = filled.client.get(f"/api/shots/{A}/outputs", params={"kind": "preview"}).json()
    for url in (
        "/",
        f"/shots/{A}",
        "/shots/demo/sq010/sh9999",
        "/api/shots",
        f"/api/shots/{A}",
        f"/api/shots/{A}/outputs",
        "/api/jobs/999",
        "/api/search",
        "/openapi.json",
        f"/files/outputs/{outputs['items'][0]['id']}",
        f"/files/contact/{A}/normal",
        "/api/jobs/abc",
    ):
        _head_like_get(filled.client, url)
    assert filled.client.head("/api/jobs/1/retry").status_code == 405


def test_cli_help_names_the_openapi_document_and_workers() -> None:
    result = CliRunner().invoke(svfx_app, ["api", "--help"])
    assert result.exit_code == 0
    assert "/openapi.json" in result.stdout and "/docs" not in result.stdout
    assert "--workers" in result.stdout


def _env_for_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `svfx` sets on startup, set here first so that it is undone after the test."""
    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.delenv("SVFX_CATALOG_URL", raising=False)


def test_cli_passes_workers_to_run_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _env_for_cli(tmp_path, monkeypatch)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr("api.app.run_api", lambda *args, **kw: calls.append({"args": args, **kw}))
    result = CliRunner().invoke(svfx_app, ["api", "--port", "8124", "--workers", "3"])
    assert result.exit_code == 0, result.output
    ((call,),) = [calls]
    assert (call["args"][:2], call["workers"]) == (("127.0.0.1", 8124), 3)
    refused = CliRunner().invoke(svfx_app, ["api", "--workers", "0"])
    assert refused.exit_code == 2 and len(calls) == 1


def test_run_api_with_workers_serves_an_import_string(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    monkeypatch.setenv(WORKER_SETTINGS, "")  # restored (removed) after the test
    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    settings = Settings(home=tmp_path, catalog_url=f"sqlite:///{tmp_path}/cat.db", api_token="t")
    run_api("0.0.0.0", 8125, settings, workers=4)
    assert served["app"] == "api.app:app_from_environment"
    assert (served["factory"], served["workers"], served["host"], served["port"]) == (
        True,
        4,
        "0.0.0.0",
        8125,
    )
    assert (tmp_path / "cat.db").is_file()  # migrated once, before the workers start
    app = app_from_environment()  # what each worker process builds
    assert app.state.ctx.settings == settings
    assert TestClient(app).get("/api/shots").json()["total"] == 0
    with pytest.raises(ValueError, match="workers"):
        run_api("127.0.0.1", 8125, settings, workers=0)


def _strings(schema: Any) -> Any:
    """Every string schema inside ``schema`` (properties, anyOf, items, map values)."""
    if isinstance(schema, dict):
        if schema.get("type") == "string":
            yield schema
        for value in schema.values():
            yield from _strings(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _strings(value)


def test_every_string_of_the_published_spec_states_its_rule(filled: Filled) -> None:
    """The server refuses control characters in every string of a body: the document says so
    (a new ShotSpec field without a rule here would be refused though documented as free)."""
    components = filled.client.get("/openapi.json").json()["components"]["schemas"]
    strings = list(_strings(components["ShotSpec"]))
    assert len(strings) >= 12
    for schema in strings:
        assert "pattern" in schema or "enum" in schema, schema


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"frames": "1001-1100y2"}, "frames"),
        ({"frames": "1001-1100,"}, "frames"),
        ({"frames": "1-9999999"}, "frames"),
        ({"passes": "normal,seg"}, "passes"),
        ({"model_size": "TINY"}, "model_size"),
        ({"version": "v\u0661\u0662\u0663"}, "version"),  # Arabic-Indic digits
        ({"plate": " \u3000 "}, "plate"),
    ],
)
def test_the_body_is_held_to_the_documented_rules(
    filled: Filled, change: dict[str, Any], field: str
) -> None:
    response = filled.client.post("/api/shots", json={**good_spec(filled), **change}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert f"\n  {field}:" in detail(response)
    assert filled.submitter.calls == []


@pytest.mark.parametrize("frames", ["1001-1100", "1001-1100x2", "1001,1005,1010-1020", "-5--1"])
def test_documented_frame_ranges_are_accepted(filled: Filled, frames: str) -> None:
    body = {**good_spec(filled), "frames": frames}
    response = filled.client.post("/api/shots", json=body, headers=AUTH)
    assert response.status_code == 202, response.text
