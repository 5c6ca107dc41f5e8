"""Input that used to end in a 500, on SQLite and PostgreSQL alike: NUL and other control
characters (or bytes that are not UTF-8) in any string parameter, ids past the catalog's
32-bit id columns, and submitted bodies that are too deep, too large, not UTF-8, numbers
past Python's digit limit, or strings that are not text. Each is refused with 422 (413 for
size) and a Problem body that says what was wrong."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from api.body import MAX_BODY_BYTES, MAX_DEPTH, nesting_depth
from api.params import MAX_ID
from tests import api_fixtures, catalog_fixtures
from tests.api_fixtures import AUTH, A, Filled, detail, good_spec

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
filled = api_fixtures.filled

NOT_TEXT = ["a\x00b", "\x00", "tab\there", "bell\x07", "del\x7f", "c1\x85", "%FF%FE"]
VALID = {
    "show": "demo",
    "sequence": "sq010",
    "shot": "sh0010",
    "pass_name": "normal",
    "job_id": "1",
    "output_id": "1",
    "version": "v001",
}


def string_parameters(filled: Filled) -> Iterator[tuple[str, str, str]]:
    """(method, path template, parameter) for every string query or path parameter in the
    OpenAPI document, and the pages' (which the document leaves out)."""
    document = filled.client.get("/openapi.json").json()
    for template, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                schemas = parameter["schema"].get("anyOf", [parameter["schema"]])
                strings = any(s.get("type") == "string" for s in schemas)
                if strings and parameter["in"] in ("query", "path"):
                    yield method, template, parameter["name"]
    yield "get", "/", "show"
    for name in ("show", "sequence", "shot"):
        yield "get", "/shots/{show}/{sequence}/{shot}", name


def request_with(filled: Filled, method: str, template: str, name: str, value: str) -> Any:
    """``method`` on ``template`` with parameter ``name`` set to the percent-encoded
    ``value`` (kept as is when it is already percent-encoded) and the others valid."""
    encoded = value if value.startswith("%") else quote(value, safe="")
    path_values = {**VALID, name: encoded}
    url = template.format(**{k: v for k, v in path_values.items() if "{" + k + "}" in template})
    if "{" + name + "}" not in template:
        url += f"?{name}={encoded}"
    return filled.client.request(method.upper(), url, headers=AUTH, json={})


def test_every_string_parameter_refuses_control_characters_with_422(filled: Filled) -> None:
    checked = set()
    for method, template, name in string_parameters(filled):
        for value in NOT_TEXT:
            response = request_with(filled, method, template, name, value)
            assert response.status_code == 422, (method, template, name, value, response.text)
            assert name in detail(response) or (name == "pass_name" and "pass" in detail(response))
        checked.add(name)
    assert {"path", "show", "sequence", "shot", "pass", "kind", "status"} <= checked


def test_provenance_path_with_nul_is_422_not_500(filled: Filled) -> None:
    response = filled.client.get("/api/provenance?path=a%00b")
    assert response.status_code == 422
    assert detail(response).startswith("invalid request: query parameter path:")
    plain = filled.client.get("/api/provenance", params={"path": "/shows/é/ü.exr"})
    assert plain.status_code == 404  # any other text is a path the catalog may know


@pytest.mark.parametrize(
    ("method", "template"),
    [
        ("GET", "/api/jobs/{}"),
        ("GET", "/files/outputs/{}"),
        ("POST", "/api/jobs/{}/retry"),
    ],
)
def test_ids_past_the_32_bit_columns_are_422_not_500(
    filled: Filled, method: str, template: str
) -> None:
    for too_large in (MAX_ID + 1, 2**63 - 1, 2**63, 10**30):
        response = filled.client.request(method, template.format(too_large), headers=AUTH)
        assert response.status_code == 422, (too_large, response.text)
        assert f"less than or equal to {MAX_ID}" in detail(response)
    largest = filled.client.request(method, template.format(MAX_ID), headers=AUTH)
    assert largest.status_code == 404


def post_body(filled: Filled, content: Any) -> Any:
    headers = {**AUTH, "Content-Type": "application/json"}
    return filled.client.post("/api/shots", content=content, headers=headers)


def test_deeply_nested_json_is_422_not_a_recursion_error(filled: Filled) -> None:
    for body in ("[" * 100_000, "[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1"):
        response = post_body(filled, body.encode())
        assert response.status_code == 422
        assert f"deeper than {MAX_DEPTH}" in detail(response)
    assert filled.submitter.calls == []


def test_a_spec_within_the_depth_bound_is_accepted(filled: Filled) -> None:
    spec = good_spec(filled)
    accepted = filled.client.post("/api/shots", json=spec, headers=AUTH)
    assert accepted.status_code == 202
    nested = {**spec, "tiling": {"tile": {"a": [[[[1]]]]}}}  # deep, but well within the bound
    refused = filled.client.post("/api/shots", json=nested, headers=AUTH)
    assert (refused.status_code, "tiling" in detail(refused)) == (422, True)


def test_nesting_depth_ignores_brackets_in_strings() -> None:
    assert nesting_depth('{"a": [1, {"b": []}]}') == 4
    assert nesting_depth('["[[[[", "\\"[[[", "\\\\"]') == 1
    assert nesting_depth('"{{{{{"') == 0
    assert nesting_depth("[" * 40) == 40


def test_a_body_over_the_size_cap_is_413(filled: Filled) -> None:
    padding = " " * MAX_BODY_BYTES
    declared = post_body(filled, f'{{"shot": "sh1"{padding}}}'.encode())
    assert declared.status_code == 413
    assert str(MAX_BODY_BYTES) in detail(declared)

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"shot": "sh1"'
        for _ in range(MAX_BODY_BYTES // 65536 + 1):
            yield b" " * 65536
        yield b"}"

    streamed = post_body(filled, chunked())
    assert streamed.status_code == 413
    assert filled.submitter.calls == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"shot": "\xff\xfe"}', "not UTF-8"),
        (b'{"frames": ' + b"1" * 5000 + b"}", "not JSON"),
        (b'{"plate": "/x/\\u0000.exr"}', "body.plate holds control characters"),
        (b'{"show": "\\ud800"}', "body.show holds control characters"),
        (b'{"checkpoints": {"a\\u0000": "x"}}', "a key in body.checkpoints holds"),
        (b'{"passes": ["normal", "\\u001b[31m"]}', "body.passes[1] holds control characters"),
    ],
)
def test_bodies_that_are_not_text_are_422(filled: Filled, body: bytes, reason: str) -> None:
    response = post_body(filled, body)
    assert response.status_code == 422
    assert reason in detail(response)


def test_nul_in_a_good_spec_is_422_not_500(filled: Filled) -> None:
    spec = good_spec(filled)
    for field in ("plate", "output_root", "colorspace", "frames", "submitter"):
        response = filled.client.post("/api/shots", json={**spec, field: "/x\x00y"}, headers=AUTH)
        assert response.status_code == 422, (field, response.text)
        assert f"body.{field}" in detail(response)
    assert filled.submitter.calls == []
    assert filled.client.get(f"/api/shots/{A}").status_code == 200
