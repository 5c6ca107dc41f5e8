"""A throwaway Kitsu server of the test's own: zou (Kitsu's server, from PyPI) in a virtual
environment of its own, never a dependency of the project (it pins ~55 packages exactly), on
a throwaway PostgreSQL (`tests.pg_server`) and a redis-server started here, both on free
loopback ports; gunicorn serves it (gevent, one worker). Everything is started here and
stopped by PID; every file lives in a temporary folder.

The venv is made once, under ``$SVFX_ZOU_VENV`` (default ``~/.cache/svfx-tests/zou-venv``),
with ``pip install zou==ZOU_VERSION`` from the package index (minutes, ~600 MB); later runs
reuse it. Facts this follows: stack-notes "Kitsu (zou), ShotGrid, OpenJD" (it refuses the
default SECRET_KEY; ``upgrade-db`` would post telemetry, ``init-db`` does not; gazu's host has
no ``/api`` suffix without nginx; movie previews need ffmpeg and ffprobe on zou's PATH).
Tests skip, saying why, where something it needs is missing or does not start."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.common import free_port
from tests.pg_server import PgServer

ZOU_VERSION = "1.0.97"
START_TIMEOUT_S = 90.0
INSTALL_TIMEOUT_S = 1800.0


def zou_venv() -> Path:
    explicit = os.environ.get("SVFX_ZOU_VENV")
    if explicit:
        return Path(explicit).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "svfx-tests" / "zou-venv"


def ensure_zou(venv: Path) -> Path:
    """The venv's ``zou`` command, installing zou there first if it is missing."""
    zou = venv / "bin" / "zou"
    if zou.exists():
        return zou
    python = shutil.which("python3") or sys.executable
    log = venv.parent / "zou-install.log"
    venv.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
        with log.open("wb") as out:
            subprocess.run(
                [str(venv / "bin" / "pip"), "install", "-q", f"zou=={ZOU_VERSION}"],
                check=True, stdout=out, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S,
            )  # fmt: skip
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(venv, ignore_errors=True)
        pytest.skip(f"zou {ZOU_VERSION} could not be installed into {venv}: {exc} (see {log})")
    return zou


@dataclass
class KitsuServer:
    host: str  # for gazu.set_host: no /api suffix
    email: str
    password: str
    preview_folder: Path
    log: Path  # gunicorn's (zou's) log

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"zou exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with _LOOPBACK.open(url, timeout=2):
                return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:  # it answers
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"zou did not answer {url} within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def ffmpeg_dir(folder: Path) -> Path | None:
    """A folder with the system's ffmpeg and ffprobe for zou's PATH, or None."""
    ffmpeg, ffprobe = shutil.which("ffmpeg"), shutil.which("ffprobe")
    if not ffmpeg or not ffprobe:
        return None
    folder.mkdir(exist_ok=True)
    for tool in (ffmpeg, ffprobe):
        (folder / Path(tool).name).symlink_to(tool)
    return folder


def kitsu_server() -> Iterator[KitsuServer]:
    """For a module-scoped fixture: ``kitsu = pytest.fixture(scope="module")(kitsu_server)``."""
    redis = shutil.which("redis-server")
    if redis is None:
        pytest.skip("redis-server is not installed (Debian: redis-server)")
    venv = zou_venv()
    zou = ensure_zou(venv)
    pg = PgServer()  # skips, saying why, without PostgreSQL
    folder = Path(tempfile.mkdtemp(prefix="svfx-kitsu-"))
    redis_proc = gunicorn = None
    try:
        pg.start()
        redis_port = free_port()
        redis_proc = subprocess.Popen(
            [redis, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        tools = ffmpeg_dir(folder / "bin")
        if tools is None:
            pytest.skip("ffmpeg and ffprobe are not installed (Debian: ffmpeg): zou needs them")
        path = os.pathsep.join(
            p for p in (str(tools or ""), str(venv / "bin"), "/usr/bin", "/bin") if p
        )
        env = {
            "PATH": path,
            "HOME": str(folder),
            "DB_HOST": "127.0.0.1",
            "DB_PORT": str(pg.port),
            "DB_USERNAME": "postgres",
            "DB_PASSWORD": "",
            "DB_DATABASE": "postgres",
            "KV_HOST": "127.0.0.1",
            "KV_PORT": str(redis_port),
            "SECRET_KEY": secrets.token_hex(32),
            "PREVIEW_FOLDER": str(folder / "previews"),
            "TMP_DIR": str(folder / "tmp"),
            "MAIL_ENABLED": "false",
            "INDEXER_HOST": "127.0.0.1",
            "INDEXER_PORT": str(free_port()),  # no indexer: nothing answers there
        }
        (folder / "tmp").mkdir()
        setup_log = folder / "setup.log"
        email, password = "admin@example.com", secrets.token_urlsafe(12)
        with setup_log.open("ab") as out:
            for args in (
                ["init-db"],
                ["init-data"],
                ["create-admin", email, "--password", password],
            ):
                done = subprocess.run([str(zou), *args], env=env, stdout=out,
                                      stderr=subprocess.STDOUT, timeout=300)  # fmt: skip
                if done.returncode != 0:
                    pytest.fail(f"zou {args[0]} failed:\n{setup_log.read_text()[-3000:]}")
        port = free_port()
        log = folder / "gunicorn.log"
        with log.open("ab") as out:
            gunicorn = subprocess.Popen(
                [str(venv / "bin" / "gunicorn"), "--worker-class", "gevent", "--workers", "1",
                 "--bind", f"127.0.0.1:{port}", "--timeout", "120", "zou.app:app"],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=folder,
            )  # fmt: skip
        host = f"http://127.0.0.1:{port}"
        _wait_http(f"{host}/api", gunicorn, log)
        yield KitsuServer(host, email, password, folder / "previews", log)
    finally:
        _stop(gunicorn)
        _stop(redis_proc)
        pg.remove()
        shutil.rmtree(folder, ignore_errors=True)
