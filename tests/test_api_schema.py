"""The OpenAPI document against the answers, property-based (schemathesis): every documented
operation with generated valid and invalid input on SQLite (every phase) and PostgreSQL
(examples and fuzzing), the write endpoints with the token and without it, a fake
submitter. Every check schemathesis runs by default must pass: no 5xx, every status code,
content type, header and body documented.

The number of examples is bounded and derandomized so that a run is repeatable and short."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from pydantic import ValidationError
from schemathesis.openapi.checks import RejectedPositiveData
from sqlalchemy import create_engine

from api.app import create_app
from schemas.settings import Settings
from schemas.spec import TilingSpec
from tests import catalog_fixtures
from tests.api_fixtures import AUTH, Filled, make_filled
from tests.catalog_fixtures import opened_catalog, pg_schema_url

pg_database_url = catalog_fixtures.pg_database_url

BOUNDED = settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,  # one filled catalog per operation, not per example
    ],
)


def _document() -> dict[str, Any]:
    """The OpenAPI document, which depends on no catalog. schemathesis needs it when the module
    is collected, before any fixture exists (its fixture-based loader,
    ``schemathesis.pytest.from_fixture``, fails on pytest 9: it reads ``Function._nodeid``);
    each test then sends its cases to its own app over a filled catalog (RunningApp)."""
    unused = create_engine("sqlite://")  # never connected: building the document reads nothing
    return create_app(Settings(home=Path("/nonexistent")), engine=unused).openapi()


class RunningApp:
    """The app of the running test, behind the schema loaded at collection time (every request
    schemathesis sends, its own probes included, goes through the schema's app)."""

    app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


RUNNING = RunningApp()
# Every phase (the coverage phase's boundary and negative cases too) on SQLite; the same
# operations fuzzed on PostgreSQL, where what can differ is the database's answer to odd
# values, not the document's shapes. The coverage phase is two thirds of the time.
schema = schemathesis.openapi.from_dict(_document())
schema.app = RUNNING
fuzzed = schemathesis.openapi.from_dict(_document())
fuzzed.config.phases.update(phases=["examples", "fuzzing"])
fuzzed.app = RUNNING


def breaks_only_the_tiling_rule(body: Any) -> bool:
    """Whether ``body``'s tiling matches its schema but breaks TilingSpec's cross-field rule
    (both tile sides or neither; an overlap under half the shorter side)."""
    tiling = body.get("tiling") if isinstance(body, dict) else None
    if not isinstance(tiling, dict):
        return False
    try:
        TilingSpec.model_validate(tiling)
    except ValidationError as exc:
        return all(not error["loc"] for error in exc.errors())  # the model's rule alone
    return False


@schema.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but one: a schema-valid body refused (422) for TilingSpec's
    cross-field rule and nothing else. JSON Schema cannot state that rule, the document says
    it in words, and refusing such a body is right; any other refusal still fails the test."""
    if not isinstance(failure, RejectedPositiveData) or response.status_code != 422:
        return True
    problems = str(response.json().get("detail", "")).splitlines()[1:]
    only_tiling = bool(problems) and all(p.strip().startswith("tiling:") for p in problems)
    return not (only_tiling and breaks_only_the_tiling_rule(case.body))


@contextmanager
def serving(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Filled]:
    with opened_catalog(url) as catalog:
        filled = make_filled(catalog, tmp_path, monkeypatch)
        RUNNING.app = filled.client.app
        try:
            yield filled
        finally:
            RUNNING.app = None


@pytest.fixture
def on_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Filled]:
    with serving(f"sqlite:///{tmp_path}/db/catalog.db", tmp_path, monkeypatch) as filled:
        yield filled


@pytest.fixture
def on_postgresql(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Filled]:
    with serving(pg_schema_url(request), tmp_path, monkeypatch) as filled:
        yield filled


@schema.parametrize()
@BOUNDED
def test_every_operation_answers_as_documented(case: Any, on_sqlite: Filled) -> None:
    case.call_and_validate(headers=AUTH)


@fuzzed.parametrize()
@BOUNDED
def test_every_operation_answers_as_documented_on_postgresql(
    case: Any, on_postgresql: Filled
) -> None:
    case.call_and_validate(headers=AUTH)


@schema.include(method="POST").parametrize()
@BOUNDED
def test_write_operations_without_the_token_answer_as_documented(
    case: Any, on_sqlite: Filled
) -> None:
    case.call_and_validate()
