"""The Prefect API an svfx command runs its flows against.

With ``PREFECT_API_URL`` set (a Prefect server, as in production) that server is used, after
checking it answers within a bounded time. Without one, the command starts an embedded Prefect
server itself, as a child process (`flows.prefect_child`) on a free loopback port, instead of
letting Prefect start its own ephemeral one: ours

- waits as long as ``SVFX_PREFECT_START_TIMEOUT_S`` says (Prefect's own gives up after 20 s,
  too little on a busy machine) and, when it fails, says why (the child's log) instead of a
  traceback;
- ends with its parent, however the parent ends: the child reads a pipe from the parent and
  exits at end of file, which comes even when the parent is killed with SIGKILL.

Its database is Prefect's usual one under ``PREFECT_HOME`` (``$SVFX_HOME/prefect``), so every
command on this host sees the same runs (a scan knows what a submit is running). Commands
started together therefore start their servers one at a time (a file lock in that folder,
held from the choice of the port until the server answers): a server's startup migrates that
database and registers Prefect's block types in it, and two doing so at once fail each other
(Alembic's "Online migration expected to match one row", a CircularDependencyError, then
"Application startup failed"). Once started, the servers share the database as Prefect's
ephemeral ones do.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

from core.errors import SvfxError

log = logging.getLogger("svfx.orchestrator")

HEALTH_TIMEOUT_S = 10.0  # a configured server must answer /health within this
# Held, in PREFECT_HOME, by the command whose embedded server is starting (see above).
STARTUP_LOCK = "embedded-server-startup.lock"
# What to do about a configured server that does not answer: commands that run a flow here
# can fall back on an embedded server; `svfx serve` cannot (its runs outlive it).
EMBEDDED_HINT = "Start it (`prefect server start`), or unset PREFECT_API_URL to use an embedded one"
SERVE_HINT = (
    "Start it (`prefect server start`), or point PREFECT_API_URL at the server the studio's "
    "tools submit to"
)


class OrchestratorError(SvfxError, RuntimeError):
    """No Prefect API to run flows against: the message says why and what to set."""


def configured_api_url() -> str | None:
    """PREFECT_API_URL as Prefect sees it now (environment, profile or a test harness)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url) if url else None


@contextmanager
def prefect_api(home: Path, start_timeout_s: float) -> Iterator[str]:
    """Yield the URL of a Prefect API that answers: the configured one, or an embedded
    server started for the duration of the block (see the module docstring)."""
    url = configured_api_url()
    if url:
        check_answers(url, HEALTH_TIMEOUT_S)
        yield url
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        EmbeddedPrefect(home, start_timeout_s) as server,
        temporary_settings(updates={PREFECT_API_URL: server.api_url}),
    ):
        try:
            yield server.api_url
        finally:
            drain_prefect_workers()


def drain_prefect_workers() -> None:
    """Send the flow's buffered logs and events before the server they go to stops (else
    Prefect prints "Error logging to API" at exit), as Prefect's own test harness does."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            result = APILogWorker.instance().drain()
            if inspect.isawaitable(result):
                await result
        except RuntimeError:
            pass  # never started: nothing was logged
        result = EventsWorker.drain_all()
        if inspect.isawaitable(result):
            await result

    try:
        run_coro_as_sync(drain())
    except Exception as exc:  # the logs are lost, the run is not
        log.warning("could not send the last Prefect logs: %s", exc)


def served_api_url(timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
    """The Prefect API `svfx serve` registers its deployments with: the configured one once
    it answers (so a server that is down is one line and exit 2, not a traceback from deep in
    Prefect's client after its retries), or None when none is configured."""
    url = configured_api_url()
    if url:
        check_answers(url, timeout_s, hint=SERVE_HINT)
    return url


def check_answers(url: str, timeout_s: float, *, hint: str = EMBEDDED_HINT) -> None:
    """OrchestratorError, naming ``url``, unless its /health answers 200 within about
    ``timeout_s`` (httpx's timeout, per connect and per read)."""
    import httpx

    health = f"{url.rstrip('/')}/health"
    try:
        response = httpx.get(health, timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is not an HTTPError
        raise OrchestratorError(
            f"the Prefect API at {url} (PREFECT_API_URL) does not answer: "
            f"{str(exc).rstrip('.') or type(exc).__name__}. {hint}"
        ) from None
    if response.status_code != 200:
        raise OrchestratorError(
            f"the Prefect API at {url} (PREFECT_API_URL) answered {response.status_code} to "
            f"{health}: is it a Prefect server's /api URL?"
        )


class EmbeddedPrefect:
    """A Prefect server child process on loopback that dies with this process."""

    def __init__(self, home: Path, start_timeout_s: float) -> None:
        self.home = home
        self.start_timeout_s = start_timeout_s
        self.port = 0  # chosen when it starts
        self.log_path = home / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def __enter__(self) -> EmbeddedPrefect:
        self.home.mkdir(parents=True, exist_ok=True)
        # No timeout: whoever holds the lock lets go within its own start timeout (its server
        # answers, or is stopped), and the kernel releases it when that process dies.
        with FileLock(self.home / STARTUP_LOCK):
            self._start()
        assert self.process is not None
        log.info("embedded Prefect server on %s (pid %d)", self.api_url, self.process.pid)
        return self

    def _start(self) -> None:
        """Start the child and wait until it answers; stopped again when it does not."""
        from prefect.settings import get_current_settings

        self.port = free_loopback_port()
        env = {
            **os.environ,
            **get_current_settings().to_environment_variables(exclude_unset=True),
            "PREFECT_UI_ENABLED": "0",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        env.pop("PREFECT_API_URL", None)
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "flows.prefect_child", str(self.port)],
                stdin=subprocess.PIPE,  # the child exits when this pipe closes
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(Path(__file__).resolve().parent.parent),
            )
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _wait_until_healthy(self) -> None:
        import httpx

        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise OrchestratorError(
                        f"the embedded Prefect server exited with code "
                        f"{self.process.returncode} while starting: {self._log_tail()}"
                    )
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise OrchestratorError(
            f"the embedded Prefect server did not answer within {self.start_timeout_s:.0f} s "
            f"(log: {self.log_path}); on a busy machine raise SVFX_PREFECT_START_TIMEOUT_S, or "
            "point PREFECT_API_URL at a running Prefect server"
        )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()  # the child's cue to shut down
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return f"(no log at {self.log_path})"
        return " | ".join(text[-lines:]) or "(empty log)"


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
