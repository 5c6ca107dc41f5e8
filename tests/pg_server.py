"""A throwaway PostgreSQL server of the test's own (initdb + pg_ctl on a free loopback port),
to stop and start under a running shot. Never the machine's own service.

As root, initdb and postgres refuse to run, so they run as the ``postgres`` user through
runuser (stack-notes 6.4). Tests skip, saying why, where the binaries or that user are
missing."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from bench.common import free_port


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


class PgServer:
    def __init__(self) -> None:
        initdb, self.pg_ctl = _bin("initdb"), _bin("pg_ctl")
        if not initdb or not self.pg_ctl:
            pytest.skip("PostgreSQL's initdb/pg_ctl are not installed")
        self.as_postgres: list[str] = []
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root without a postgres user to run initdb as")
            self.as_postgres = ["runuser", "-u", "postgres", "--"]
        self.dir = Path(tempfile.mkdtemp(prefix="svfx-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        if self.as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_postgres, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off"
        )
        self._run(self.pg_ctl, "-D", str(self.data), "-o", options, "-w", "-l",
                  str(self.dir / "log"), "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
