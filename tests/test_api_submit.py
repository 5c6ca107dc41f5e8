"""The API never starts an orchestrator by itself. Without a Prefect API configured, a submit
or a retry answers 503 saying what to set, and no server or child process is started (Prefect
would otherwise start an ephemeral server inside the API process on the first submit and
leave it behind). With one, the run goes to that API. A 503 always says why. A read-only
server never imports Prefect."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from api.context import prefect_api_url
from tests import api_fixtures, catalog_fixtures
from tests.api_fixtures import AUTH, TOKEN, A, FakeSubmitter, Filled, detail, good_spec

catalog_url = catalog_fixtures.catalog_url
catalog = catalog_fixtures.catalog
pg_database_url = catalog_fixtures.pg_database_url
filled = api_fixtures.filled

REPO = Path(__file__).resolve().parents[1]


def children() -> set[int]:
    """Ids of this process's child processes (from /proc: psutil is not a dependency)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        if int(ppid) == os.getpid():
            found.add(int(entry))
    return found


@pytest.fixture
def no_prefect_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """No PREFECT_API_URL anywhere (environment or Prefect's settings), ephemeral mode on as
    it is by default; yields the calls made to start Prefect's ephemeral server (refused)."""
    from prefect.server.api import server
    from prefect.settings import PREFECT_API_URL, temporary_settings

    started: list[Any] = []

    def refuse_to_start(*args: Any, **kwargs: Any) -> None:
        started.append(args)
        raise RuntimeError("the API started Prefect's ephemeral server")

    monkeypatch.setattr(server.SubprocessASGIServer, "start", refuse_to_start)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_ENABLED", "true")
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert prefect_api_url() is None
        yield started


def test_without_a_prefect_api_submits_are_503_and_start_nothing(
    filled: Filled, no_prefect_api: list[Any]
) -> None:
    before = children()
    client = filled.app(submitter=None, token=TOKEN)  # the default submitter
    for response in (
        client.post("/api/shots", json=good_spec(filled), headers=AUTH),
        client.post(f"/api/jobs/{filled.jobs[A]}/retry", headers=AUTH),
        client.post("/api/shots", json=good_spec(filled), headers=AUTH),  # and again
    ):
        assert response.status_code == 503, response.text
        reason = detail(response)
        assert "PREFECT_API_URL" in reason and "svfx serve" in reason, reason
        assert not reason.endswith(": None")
    assert no_prefect_api == []
    assert children() - before == set()


def test_a_configured_prefect_api_is_the_one_the_run_goes_to(
    filled: Filled, monkeypatch: pytest.MonkeyPatch, no_prefect_api: list[Any]
) -> None:
    """Prefect reads its settings once, at import: a PREFECT_API_URL in the environment
    must still be the API that the run is created on (never an ephemeral one)."""
    from prefect.settings import get_current_settings

    url = "http://prefect.example:4200/api"
    asked: list[str] = []

    def run_deployment(name: str, **kwargs: Any) -> Any:
        asked.append(str(get_current_settings().api.url))
        return SimpleNamespace(id="0b5e1c2e-run")

    monkeypatch.setattr("prefect.deployments.run_deployment", run_deployment)
    monkeypatch.setenv("PREFECT_API_URL", url)
    client = filled.app(submitter=None, token=TOKEN)
    response = client.post("/api/shots", json=good_spec(filled), headers=AUTH)
    assert (response.status_code, response.json()["run_id"]) == (202, "0b5e1c2e-run")
    assert asked == [url]
    assert no_prefect_api == []


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (RuntimeError(None), "RuntimeError"),
        (TimeoutError(), "TimeoutError"),
        (ConnectionError(""), "ConnectionError"),
        (ValueError("deployment 'process-shot/process-shot' not found"), "not found"),
    ],
)
def test_a_503_always_says_why(filled: Filled, error: Exception, said: str) -> None:
    client = filled.app(submitter=FakeSubmitter(error=error), token=TOKEN)
    response = client.post("/api/shots", json=good_spec(filled), headers=AUTH)
    assert response.status_code == 503
    reason = detail(response)
    assert said in reason and not reason.rstrip().endswith(":"), reason
    assert not reason.endswith("None"), reason


def test_a_503_names_the_cause(filled: Filled) -> None:
    try:
        try:
            raise OSError("connection refused")
        except OSError as exc:
            raise RuntimeError() from exc
    except RuntimeError as wrapped:
        error = wrapped
    client = filled.app(submitter=FakeSubmitter(error=error), token=TOKEN)
    response = client.post("/api/shots", json=good_spec(filled), headers=AUTH)
    assert "RuntimeError (caused by OSError: connection refused)" in detail(response)


def test_a_read_only_server_never_imports_prefect(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from fastapi.testclient import TestClient
        from api.app import create_app
        from schemas.settings import Settings

        settings = Settings(home={str(tmp_path)!r}, allowed_roots=[{str(tmp_path)!r}])
        client = TestClient(create_app(settings, token="t"))
        for url in ("/", "/api/shots", "/api/search", "/openapi.json", "/api/jobs/1"):
            client.get(url)
        client.post("/api/shots", json={{}})  # refused before any submitter is made
        loaded = sorted(m for m in sys.modules if m == "prefect" or m.startswith("prefect."))
        print(loaded)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    ran = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[-1] == "[]", ran.stdout
