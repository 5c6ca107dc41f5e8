"""A real Prefect server for tests, set up as production runs it (stack-notes 2.1): `prefect
server start` on a free loopback port, backed by a throwaway PostgreSQL database (with
``pg_trgm``) on the local server at 127.0.0.1:5432, analytics and UI off, and a PREFECT_HOME
of its own in a temporary folder so nothing touches the user's profile or ``~/.prefect``.

    with running_prefect_server() as server:   # server.api_url: http://127.0.0.1:PORT/api

On exit the server's process group is stopped and the database dropped. PostgreSQL must be
reachable with trust auth (as ``postgres`` or ``root``): when it is not, the tests fail
saying so (CI has a server), like the catalog's PostgreSQL tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
from psycopg import sql

from bench.common import free_port
from tests.catalog_fixtures import PG_HOST, pg_admin
from tests.slurm_server import terminate_all

START_TIMEOUT_S = 120.0  # migrations on a fresh database take ~7 s on an idle 2-core machine
STOP_TIMEOUT_S = 20.0


@contextlib.contextmanager
def throwaway_database(prefix: str, extensions: Sequence[str] = ()) -> Iterator[tuple[str, str]]:
    """A new database ``<prefix>_<random>`` with ``extensions`` created in it, dropped after
    (connections still open are closed by the drop); yields (user, database name)."""
    user, admin = pg_admin()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")  # which pytest-xdist worker made it
    name = f"{prefix}_{worker}_{uuid.uuid4().hex[:12]}"
    ident = sql.Identifier(name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        with psycopg.connect(f"postgresql://{user}@{PG_HOST}/{name}", autocommit=True) as conn:
            for extension in extensions:
                conn.execute(
                    sql.SQL("CREATE EXTENSION IF NOT EXISTS {}").format(sql.Identifier(extension))
                )
        yield user, name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def server_environment(home: Path, database_url: str) -> dict[str, str]:
    """The server's environment: this process's without any PREFECT_* (a profile, a test
    harness's API URL), plus the database, a home of its own, no analytics and no UI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_DATABASE_CONNECTION_URL=database_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="false",
        PREFECT_SERVER_LOGGING_LEVEL="WARNING",
    )
    return env


@dataclass(frozen=True)
class PrefectServer:
    api_url: str  # http://127.0.0.1:PORT/api, for PREFECT_API_URL
    log: Path  # the server's output: its services' errors show only there
    database: str

    def log_tail(self, lines: int = 30) -> str:
        return f"Prefect server log ({self.log}):\n{log_tail(self.log, lines)}"


@contextlib.contextmanager
def running_prefect_server(start_timeout_s: float = START_TIMEOUT_S) -> Iterator[PrefectServer]:
    """`prefect server start` on PostgreSQL, answering /api/health; yields its API URL and
    log. The log is in the server's temporary folder, quoted when the server does not come up,
    and removed with the folder."""
    folder = Path(tempfile.mkdtemp(prefix="svfx-prefect-server-"))
    try:
        with throwaway_database("svfx_prefect", extensions=["pg_trgm"]) as (user, name):
            url = f"postgresql+asyncpg://{user}@{PG_HOST}/{name}"
            port = free_port()
            log_path = folder / "server.log"
            command = [
                sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                "--port", str(port), "--no-ui", "--analytics-off",
            ]  # fmt: skip
            with open(log_path, "wb") as log_file:
                process = subprocess.Popen(
                    command,
                    env=server_environment(folder / "home", url),
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group, stopped as one
                )
            api_url = f"http://127.0.0.1:{port}/api"
            try:
                wait_until_healthy(api_url, process, log_path, start_timeout_s)
                yield PrefectServer(api_url, log_path, name)
            finally:
                stop_process_group(process)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def wait_until_healthy(
    api_url: str, process: subprocess.Popen[bytes], log_path: Path, timeout_s: float
) -> None:
    """Poll ``/api/health`` until it answers 200; fail with the log's tail when the server
    exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(
                    f"prefect server start exited with code {process.returncode}: "
                    f"{log_tail(log_path)}",
                    pytrace=False,
                )
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{api_url}/health").status_code == 200:
                    return
            time.sleep(0.25)
    pytest.fail(
        f"the Prefect server at {api_url} did not answer /health within {timeout_s:.0f} s: "
        f"{log_tail(log_path)}",
        pytrace=False,
    )


def stop_process_group(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGTERM to the process group ``process`` leads (it was started in a session of its
    own), SIGKILL to whatever is left of it after a bounded wait; then the same, by pid, for
    descendants that had moved to a group of their own (Prefect's runner may start flow runs
    that way)."""
    try:
        family = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        family = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    terminate_all(family, STOP_TIMEOUT_S)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:]) or "(empty log)"
