"""The catalog's HTTP API and pages (api/) through FastAPI's TestClient, on SQLite and on
PostgreSQL: values, pagination totals, 422 reasons, token refusals, retries of failed frames,
file routes that serve catalogued previews and contact sheets only, and hostile input (path
traversal, SQL injection) that is refused or matches nothing."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient
from PIL import Image
from sqlalchemy import inspect

from api.app import create_app, run_api
from api.params import JobStatus
from schemas.catalog import models
from schemas.settings import Settings
from schemas.spec import ShotSpec
from tests import api_fixtures, catalog_fixtures
from tests.api_fixtures import (
    AUTH,
    REASON_1002,
    REASON_1007,
    TOKEN,
    A,
    B,
    C,
    FakeSubmitter,
    Filled,
    detail,
    good_spec,
)
from tests.catalog_fixtures import CHECKPOINTS, checkpoint, exr_uri, plate_sha
from tests.test_catalog import TABLES, row_counts

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
filled = api_fixtures.filled

INJECTIONS = ["' OR 1=1 --", "x'; DROP TABLE shots; --", "1; DELETE FROM outputs"]


# -- shots -----------------------------------------------------------------------------------
def test_shots_with_coverage_and_pagination(filled: Filled) -> None:
    page = filled.client.get("/api/shots").json()
    assert (page["total"], page["limit"], page["offset"]) == (3, 50, 0)
    rows = {f"{r['show']}/{r['sequence']}/{r['shot']}": r for r in page["items"]}
    assert list(rows) == [A, B, C]  # sorted by show, sequence, shot
    a, b, c = rows[A], rows[B], rows[C]
    assert a["passes"] == {"normal": 6, "pose": 6, "seg": 6}  # 8 frames, 2 failed
    assert (a["plate_frames"], a["job_id"], a["job_status"]) == (8, filled.jobs[A], "partial")
    assert a["plate"] == filled.specs[A].plate
    assert (b["passes"], b["job_status"], b["untrained"]) == (
        {"normal": 4, "pose": 4, "seg": 4},
        "complete",
        True,
    )
    assert (a["untrained"], c["untrained"], c["job_status"]) == (False, False, "running")

    second = filled.client.get("/api/shots", params={"limit": 1, "offset": 1}).json()
    assert (second["total"], [r["shot"] for r in second["items"]]) == (3, ["sh0020"])
    past = filled.client.get("/api/shots", params={"limit": 2, "offset": 5}).json()
    assert (past["total"], past["items"]) == (3, [])
    demo = filled.client.get("/api/shots", params={"show": "demo", "limit": 1}).json()
    assert (demo["total"], [r["shot"] for r in demo["items"]]) == (2, ["sh0010"])
    one = filled.client.get("/api/shots", params={"shot": "sh0100"}).json()
    assert (one["total"], one["items"][0]["show"]) == (1, "other")
    none = filled.client.get("/api/shots", params={"show": "nosuchshow"}).json()
    assert (none["total"], none["items"]) == (0, [])


def test_shot_detail(filled: Filled) -> None:
    found = filled.client.get(f"/api/shots/{A}").json()
    assert (found["show"], found["sequence"], found["shot"]) == tuple(A.split("/"))
    assert found["coverage"]["passes"] == {"normal": 6, "pose": 6, "seg": 6}
    (plate,) = found["plates"]
    assert (plate["pattern"], plate["frames"], plate["first_frame"], plate["last_frame"]) == (
        filled.specs[A].plate,
        8,
        1001,
        1008,
    )
    assert (plate["width"], plate["height"], plate["colorspace"]) == (
        4448,
        3096,
        "ARRI LogC3 (EI800)",
    )
    (job,) = found["jobs"]
    assert found["jobs_total"] == 1
    assert (job["id"], job["status"], job["frames_failed"], job["frames_done"]) == (
        filled.jobs[A],
        "partial",
        2,
        6,
    )
    assert job["failed_frames"] == [
        {"frame": 1002, "error": REASON_1002},
        {"frame": 1007, "error": REASON_1007},
    ]
    (prov,) = found["provenance"]
    assert prov["data"]["platform"] == "sapiens-vfx 0.1.0"
    assert prov["data"]["checkpoints"]["normal"]["sha256"] == CHECKPOINTS["normal"]["sha256"]
    assert prov["data"]["colour"]["description"] == "LogC3 -> sRGB for the model input"
    assert found["untrained"] is False
    assert filled.client.get(f"/api/shots/{B}").json()["untrained"] is True

    missing = filled.client.get("/api/shots/demo/sq010/sh9999")
    assert missing.status_code == 404
    assert "no shot demo/sq010/sh9999" in detail(missing)


def test_shot_outputs_filters_and_totals(filled: Filled) -> None:
    url = f"/api/shots/{A}/outputs"
    everything = filled.client.get(url, params={"limit": 1000}).json()
    assert everything["total"] == len(everything["items"]) == 6 * 7
    normal_exr = filled.client.get(url, params={"pass": "normal", "kind": "exr"}).json()
    assert normal_exr["total"] == 6
    assert {(o["pass_name"], o["kind"], o["part"]) for o in normal_exr["items"]} == {
        ("normal", "exr", "N")
    }
    assert {o["frame"] for o in normal_exr["items"]} == {1001, 1003, 1004, 1005, 1006, 1008}
    tail = filled.client.get(url, params={"limit": 5, "offset": 40}).json()
    assert (tail["total"], len(tail["items"])) == (42, 2)
    assert tail["items"] == everything["items"][40:]

    bad_pass = filled.client.get(url, params={"pass": "beauty"})
    assert bad_pass.status_code == 422
    assert "normal" in detail(bad_pass) and "pose" in detail(bad_pass)
    bad_kind = filled.client.get(url, params={"kind": "mov"})
    assert bad_kind.status_code == 422
    assert filled.client.get("/api/shots/demo/sq010/sh9999/outputs").status_code == 404


def test_jobs(filled: Filled) -> None:
    page = filled.client.get(f"/api/shots/{A}/jobs").json()
    assert page["total"] == 1
    assert page["items"][0]["failed_frames"][1] == {"frame": 1007, "error": REASON_1007}
    assert filled.client.get(f"/api/shots/{A}/jobs", params={"status": "complete"}).json() == {
        "items": [],
        "total": 0,
        "limit": 50,
        "offset": 0,
    }
    assert filled.client.get(f"/api/shots/{A}/jobs", params={"status": "done"}).status_code == 422

    job = filled.client.get(f"/api/jobs/{filled.jobs[B]}").json()
    assert (job["status"], job["untrained"], job["flow_run_id"]) == ("complete", True, "flow-run-b")
    assert job["spec"]["shot"] == "sh0020"
    assert job["failed_frames"] == []
    missing = filled.client.get("/api/jobs/999999")
    assert (missing.status_code, detail(missing)) == (404, "the catalog has no job 999999")
    assert filled.client.get("/api/jobs/0").status_code == 422


def test_provenance(filled: Filled) -> None:
    spec = filled.specs[A]
    found = filled.client.get("/api/provenance", params={"path": exr_uri(spec, 1003)}).json()
    assert found["uri"] == exr_uri(spec, 1003)
    assert [(o["pass_name"], o["part"], o["frame"]) for o in found["outputs"]] == [
        ("normal", "N", 1003),
        ("seg", "seg", 1003),
    ]
    assert {c["sha256"] for c in found["checkpoints"]} == {
        CHECKPOINTS["normal"]["sha256"],
        CHECKPOINTS["seg"]["sha256"],
    }
    assert found["provenance"][0]["data"]["torch"] == "2.13.0"
    assert found["jobs"][0]["id"] == filled.jobs[A]
    assert found["plate_frames"][0]["sha256"] == plate_sha("sh0010", 1003)

    zarr = f"{spec.output_root}/sh0010/v001/passes.zarr/normal"
    narrowed = filled.client.get("/api/provenance", params={"path": zarr, "frame": 1004}).json()
    assert [o["frame"] for o in narrowed["outputs"]] == [1004]

    failed = exr_uri(spec, 1002)  # the failed frame wrote nothing
    missing = filled.client.get("/api/provenance", params={"path": failed})
    assert missing.status_code == 404
    assert detail(missing) == f"the catalog knows no output at {failed}"
    missing = filled.client.get("/api/provenance", params={"path": zarr, "frame": 1002})
    assert (missing.status_code, detail(missing).endswith("frame 1002")) == (404, True)
    assert filled.client.get("/api/provenance").status_code == 422
    assert (
        filled.client.get("/api/provenance", params={"path": zarr, "frame": "x"}).status_code == 422
    )


def test_search_by_plate_and_checkpoint(filled: Filled) -> None:
    plate = plate_sha("sh0010", 1004)
    by_plate = filled.client.get("/api/search", params={"plate_sha256": plate}).json()
    assert by_plate["total"] == 7
    assert {(o["shot"], o["frame"]) for o in by_plate["items"]} == {("sh0010", 1004)}
    upper = filled.client.get("/api/search", params={"plate_sha256": plate.upper()}).json()
    assert upper == by_plate

    seg = CHECKPOINTS["seg"]["sha256"]
    by_seg = filled.client.get("/api/search", params={"checkpoint_sha256": seg, "limit": 5})
    page = by_seg.json()
    assert (page["total"], len(page["items"])) == (
        6 * 4,
        5,
    )  # seg EXR + preview, pose JSON + preview
    everything = filled.client.get(
        "/api/search", params={"checkpoint_sha256": seg, "limit": 1000}
    ).json()
    assert {o["pass_name"] for o in everything["items"]} == {"seg", "pose"}
    untrained_seg = checkpoint("seg", version=9)["sha256"]
    made = filled.client.get("/api/search", params={"checkpoint_sha256": untrained_seg}).json()
    assert {o["shot"] for o in made["items"]} == {"sh0020"}
    nothing = filled.client.get("/api/search", params={"plate_sha256": "0" * 64}).json()
    assert (nothing["total"], nothing["items"]) == (0, [])

    short = filled.client.get("/api/search", params={"plate_sha256": "abc123"})
    assert short.status_code == 422
    assert "pattern" in detail(short)


@pytest.mark.parametrize(
    ("url", "params", "reason"),
    [
        ("/api/shots", {"limit": 0}, "greater than or equal to 1"),
        ("/api/shots", {"limit": 1001}, "less than or equal to 1000"),
        ("/api/shots", {"offset": -1}, "greater than or equal to 0"),
        ("/api/shots", {"limit": "ten"}, "valid integer"),
        ("/api/shots", {"show": "bad name!"}, "pattern"),
        ("/api/shots", {"sequence": "-sq"}, "pattern"),
        ("/api/shots", {"shot": "x" * 65}, "pattern"),
        ("/api/shots/demo/sq010/sh%20010", {}, "pattern"),
    ],
)
def test_invalid_parameters_are_422_with_the_reason(
    filled: Filled, url: str, params: dict[str, Any], reason: str
) -> None:
    response = filled.client.get(url, params=params)
    assert response.status_code == 422
    assert reason in detail(response)


def test_openapi_is_documented(filled: Filled) -> None:
    schema = filled.client.get("/openapi.json").json()
    shots = schema["paths"]["/api/shots"]
    assert shots["get"]["summary"] == "Shots with per-pass coverage"
    assert shots["get"]["tags"] == ["shots"]
    assert shots["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ShotSpec"
    }
    components = schema["components"]["schemas"]
    assert {"ShotSpec", "TilingSpec", "Coverage", "ShotDetail", "OutputProvenance"} <= set(
        components
    )
    params = {p["name"]: p for p in shots["get"]["parameters"]}
    assert params["limit"]["schema"]["maximum"] == 1000
    assert "pattern" in params["show"]["schema"]["anyOf"][0]
    assert schema["components"]["securitySchemes"]["token"]["scheme"] == "bearer"
    # Swagger UI and ReDoc load scripts from a CDN: off
    assert filled.client.get("/docs").status_code == 404
    assert filled.client.get("/redoc").status_code == 404


# -- writes ----------------------------------------------------------------------------------
def test_submit_needs_the_token(filled: Filled) -> None:
    body = good_spec(filled)
    missing = filled.client.post("/api/shots", json=body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = filled.client.post("/api/shots", json=body, headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, detail(wrong)) == (403, "wrong bearer token")
    basic = filled.client.post("/api/shots", json=body, headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    assert filled.submitter.calls == []

    accepted = filled.client.post("/api/shots", json=body, headers=AUTH)
    assert accepted.status_code == 202
    assert accepted.json() == {
        "run_id": "run-1",
        "shot": "demo/sq010/sh0300",
        "frames": None,
        "retry_of": None,
    }
    ((spec, reason),) = filled.submitter.calls
    assert spec == ShotSpec.model_validate(body)
    assert "API" in reason


def test_writes_disabled_without_a_token(filled: Filled) -> None:
    client = filled.app()  # settings.api_token is None and no token given
    for response in (
        client.post("/api/shots", json=good_spec(filled), headers=AUTH),
        client.post(f"/api/jobs/{filled.jobs[A]}/retry", headers=AUTH),
    ):
        assert response.status_code == 403
        assert "SVFX_API_TOKEN" in detail(response)
    assert filled.submitter.calls == []
    assert client.get("/api/shots").status_code == 200  # reads need no token


def test_token_from_the_environment(filled: Filled, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SVFX_API_TOKEN", "from-env")
    settings = Settings(home=filled.root / "home", allowed_roots=[str(filled.root)])
    app = create_app(settings, engine=filled.catalog.engine, submitter=filled.submitter)
    client = TestClient(app)
    body = good_spec(filled)
    assert client.post("/api/shots", json=body, headers=AUTH).status_code == 403
    ok = client.post("/api/shots", json=body, headers={"Authorization": "Bearer from-env"})
    assert ok.status_code == 202


def test_submit_refuses_bad_specs(filled: Filled) -> None:
    def post(body: Any, **kwargs: Any) -> Any:
        return filled.client.post("/api/shots", json=body, headers=AUTH, **kwargs)

    unknown_pass = post({**good_spec(filled), "passes": ["normal", "beauty"]})
    assert unknown_pass.status_code == 422
    assert "unknown pass 'beauty'" in detail(unknown_pass)
    bad_name = post({**good_spec(filled), "shot": "../../etc"})
    assert (bad_name.status_code, "not a usable name" in detail(bad_name)) == (422, True)
    outside = post(good_spec(filled, plate="/etc/plates/p.####.exr"))
    assert outside.status_code == 403  # a deployment's policy, not a malformed spec
    assert "outside the allowed roots" in detail(outside)
    assert post(["not", "an", "object"]).status_code == 422
    not_json = filled.client.post(
        "/api/shots", content=b"{nope", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert (not_json.status_code, "not JSON" in detail(not_json)) == (422, True)
    assert filled.submitter.calls == []


def test_submitter_failure_is_503(filled: Filled) -> None:
    client = filled.app(submitter=FakeSubmitter(fail=True), token=TOKEN)
    response = client.post("/api/shots", json=good_spec(filled), headers=AUTH)
    assert response.status_code == 503
    assert "Prefect API unreachable" in detail(response)


def test_retry_submits_exactly_the_failed_frames(filled: Filled) -> None:
    url = f"/api/jobs/{filled.jobs[A]}/retry"
    assert filled.client.post(url).status_code == 401
    response = filled.client.post(url, headers=AUTH)
    assert response.status_code == 202
    assert response.json() == {
        "run_id": "run-1",
        "shot": A,
        "frames": "1002,1007",
        "retry_of": filled.jobs[A],
    }
    ((spec, reason),) = filled.submitter.calls
    assert spec == filled.specs[A].model_copy(update={"frames": "1002,1007"})
    assert f"job {filled.jobs[A]}" in reason and "1002,1007" in reason

    nothing_failed = filled.client.post(f"/api/jobs/{filled.jobs[B]}/retry", headers=AUTH)
    assert nothing_failed.status_code == 409
    assert "no failed frames" in detail(nothing_failed)
    assert filled.client.post("/api/jobs/999999/retry", headers=AUTH).status_code == 404
    assert len(filled.submitter.calls) == 1


# -- files -----------------------------------------------------------------------------------
def preview_ids(filled: Filled, shot: str, pass_name: str = "normal") -> dict[int, int]:
    """frame -> output id of the shot's previews of one pass."""
    outputs = filled.client.get(
        f"/api/shots/{shot}/outputs", params={"pass": pass_name, "kind": "preview"}
    ).json()["items"]
    return {o["frame"]: o["id"] for o in outputs}


def test_preview_files_by_catalog_id(filled: Filled) -> None:
    ids = preview_ids(filled, A)
    assert sorted(ids) == [1001, 1003, 1004, 1005, 1006, 1008]
    response = filled.client.get(f"/files/outputs/{ids[1003]}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/jpeg"
    assert response.content[:3] == b"\xff\xd8\xff"
    assert Image.open(io.BytesIO(response.content)).size == (48, 27)
    etag = response.headers["etag"]
    cached = filled.client.get(f"/files/outputs/{ids[1003]}", headers={"If-None-Match": etag})
    assert (cached.status_code, cached.content) == (304, b"")

    exr = filled.client.get(f"/api/shots/{A}/outputs", params={"kind": "exr", "limit": 1})
    exr_id = exr.json()["items"][0]["id"]
    assert filled.client.get(f"/files/outputs/{exr_id}").status_code == 404  # previews only
    assert filled.client.get("/files/outputs/987654321").status_code == 404
    # catalogued previews outside the allowed roots, or not images, are never read
    for output_id in preview_ids(filled, C).values():
        refused = filled.client.get(f"/files/outputs/{output_id}")
        assert refused.status_code == 404
        assert b"root:" not in refused.content


def test_contact_sheets_from_the_newest_jobs_layout(filled: Filled) -> None:
    sheet = filled.client.get(f"/files/contact/{A}/normal")
    assert (sheet.status_code, sheet.headers["content-type"]) == (200, "image/jpeg")
    assert sheet.content[:2] == b"\xff\xd8"
    assert filled.client.get(f"/files/contact/{A}/pose").status_code == 404  # not on disk
    assert filled.client.get(f"/files/contact/{A}/albedo").status_code == 404  # not asked for
    assert filled.client.get(f"/files/contact/{B}/normal").status_code == 404
    assert filled.client.get("/files/contact/demo/sq010/sh9999/normal").status_code == 404
    assert filled.client.get(f"/files/contact/{A}/passwd").status_code == 422


TRAVERSALS = [
    "/files/outputs/..%2F..%2Fetc%2Fpasswd",
    "/files/outputs/%2Fetc%2Fpasswd",
    "/files/outputs//etc/passwd",
    "/files/outputs/1%2F..%2F..%2Fetc%2Fpasswd",
    "/files/contact/demo/sq010/sh0010/..%2F..%2F..%2F..%2Fetc%2Fpasswd",
    "/files/contact/%2E%2E/%2E%2E/%2E%2E/normal",
    "/files/contact/..%2F..%2Fetc/sq010/sh0010/normal",
    "/files/contact/%2Fetc/passwd/sh0010/normal",
    "/files/contact/demo/sq010/sh0010%2F..%2F..%2F..%2F..%2F..%2Fetc/normal",
    "/files/contact/demo/sq010/..%5C..%5Cetc/normal",
    "/api/shots/%2E%2E/%2E%2E/etc",
    "/api/shots/demo/sq010/..%2F..%2Fetc%2Fpasswd/outputs",
    "/shots/%2E%2E/%2E%2E/%2E%2E%2Fetc%2Fpasswd",
    "/shots/demo/sq010/%2Fetc%2Fpasswd",
]


@pytest.mark.parametrize("url", TRAVERSALS)
def test_path_traversal_is_refused(filled: Filled, url: str) -> None:
    response = filled.client.get(url)
    assert response.status_code in (404, 422), response.text
    assert b"root:" not in response.content


def test_sql_injection_is_refused_or_matches_nothing(filled: Filled) -> None:
    before = row_counts(filled.catalog.engine)
    client = filled.client
    for attack in INJECTIONS:
        for name in ("show", "sequence", "shot"):
            assert client.get("/api/shots", params={name: attack}).status_code == 422
        assert client.get("/", params={"show": attack}).status_code == 422
        for params in (
            {"pass": attack},
            {"kind": attack},
            {"limit": attack},
            {"offset": attack},
        ):
            assert client.get(f"/api/shots/{A}/outputs", params=params).status_code == 422
        assert client.get(f"/api/shots/{A}/jobs", params={"status": attack}).status_code == 422
        for key in ("plate_sha256", "checkpoint_sha256"):
            assert client.get("/api/search", params={key: attack}).status_code == 422
        encoded = attack.replace("/", "%2F")
        for url in (
            f"/api/shots/demo/sq010/{encoded}",
            f"/api/shots/{encoded}/sq010/sh0010/outputs",
            f"/api/jobs/{encoded}",
            f"/files/outputs/{encoded}",
            f"/files/contact/demo/{encoded}/sh0010/normal",
            f"/shots/demo/sq010/{encoded}",
        ):
            assert client.get(url).status_code in (404, 422), url
        assert client.post(f"/api/jobs/{encoded}/retry", headers=AUTH).status_code == 422
        # free text goes in as a bound parameter: it matches nothing
        missing = client.get("/api/provenance", params={"path": attack})
        assert missing.status_code == 404
        assert client.get("/api/provenance", params={"path": f"/x/{attack}.exr"}).status_code == 404
    assert set(inspect(filled.catalog.engine).get_table_names()) >= TABLES
    assert row_counts(filled.catalog.engine) == before
    assert client.get("/api/shots").json()["total"] == 3
    assert filled.submitter.calls == []


# -- pages -----------------------------------------------------------------------------------
def test_index_page(filled: Filled) -> None:
    page = filled.client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    html = page.text
    for shot in (A, B, C):
        assert f'href="/shots/{shot}"' in html
    assert html.count(">6/8<") == 3  # normal, seg, pose of sh0010
    assert html.count(">4/4<") == 3
    assert 'class="badge partial"' in html and 'class="badge complete"' in html
    assert html.count(">UNTRAINED<") == 1  # sh0020 only
    # every link and image stays on this server
    for target in re.findall(r'(?:href|src|action)="([^"]*)"', html):
        assert target.startswith("/"), target
    assert "http://" not in html and "https://" not in html

    other = filled.client.get("/", params={"show": "other"}).text
    assert f'href="/shots/{C}"' in other and f'href="/shots/{A}"' not in other
    paged = filled.client.get("/", params={"limit": 1, "offset": 1}).text
    assert f'href="/shots/{B}"' in paged and f'href="/shots/{A}"' not in paged
    assert "2–2 of 3" in paged and "previous" in paged and "next" in paged


def test_shot_page(filled: Filled) -> None:
    page = filled.client.get(f"/shots/{A}")
    assert page.status_code == 200
    html = page.text
    # failed frames with their reasons, escaped
    assert "NaN in channel R" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>" not in html
    # thumbnails by catalog id for each pass, first frames first; contact sheets on disk
    ids = preview_ids(filled, A, "seg")
    thumbs = re.findall(r'src="/files/outputs/(\d+)" alt="seg frame (\d+)"', html)
    assert [(int(i), int(f)) for i, f in thumbs] == sorted(
        ((ids[f], f) for f in ids), key=lambda x: x[1]
    )
    assert f'src="/files/contact/{A}/normal"' in html
    assert f'src="/files/contact/{A}/seg"' in html
    assert f'src="/files/contact/{A}/pose"' not in html  # not on disk: no broken image
    for src in re.findall(r'src="([^"]*)"', html):
        assert filled.client.get(src).status_code == 200, src
    # provenance: checkpoints, colour transform, platform version
    assert CHECKPOINTS["pose"]["sha256"] in html
    assert "LogC3 -&gt; sRGB for the model input" in html
    assert "sapiens-vfx 0.1.0" in html and "NVIDIA H100 80GB HBM3" in html
    assert filled.specs[A].plate in html
    assert "UNTRAINED" not in html

    untrained = filled.client.get(f"/shots/{B}").text
    assert "UNTRAINED models:" in untrained
    assert untrained.count('class="badge untrained"') >= 1 + 3  # heading, job, 3 checkpoints
    running = filled.client.get(f"/shots/{C}")
    assert running.status_code == 200 and 'class="badge running"' in running.text
    assert "/files/outputs/" not in running.text  # its previews are never served: not shown
    missing = filled.client.get("/shots/demo/sq010/sh9999")
    assert missing.status_code == 404 and "no shot demo/sq010/sh9999" in missing.text


# -- wiring ----------------------------------------------------------------------------------
def test_job_status_parameter_matches_the_catalog() -> None:
    assert get_args(JobStatus) == models.JOB_STATUSES


def test_run_api_serves_the_configured_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    settings = Settings(home=tmp_path, catalog_url=f"sqlite:///{tmp_path}/cat.db")
    run_api("127.0.0.1", 8123, settings)
    assert (served["host"], served["port"]) == ("127.0.0.1", 8123)
    client = TestClient(served["app"])
    assert client.get("/api/shots").json()["total"] == 0
    assert (tmp_path / "cat.db").is_file()
