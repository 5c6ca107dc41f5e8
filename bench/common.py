"""What the benchmark scripts (and the catalog tests) share: running as a worker runs, a free
loopback port, a throwaway PostgreSQL database, and a made-up plate to record jobs against."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas.summaries import PlateInfo

DEFAULT_PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def as_a_worker_runs(module: str, default_allocator: bool, argv: list[str] | None) -> None:
    """Run ``python -m module`` again with the allocator settings of the workers the platform
    starts (``flows.allocator.ALLOCATOR_ENV``; glibc reads them when a process starts), unless
    ``default_allocator`` or they are all set already."""
    from flows.allocator import allocator_env

    missing = allocator_env()
    if default_allocator or not missing:
        return
    args = sys.argv[1:] if argv is None else argv
    os.execve(sys.executable, [sys.executable, "-m", module, *args], {**os.environ, **missing})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def pg_database(admin: str, database: str) -> Iterator[str]:
    """A fresh database ``database`` on the server at ``admin`` (a libpq URL), dropped after;
    yields its SQLAlchemy URL."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    user = conninfo_to_dict(admin).get("user") or "postgres"
    host = admin.split("@", 1)[-1].split("/", 1)[0]
    name = sql.Identifier(database)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    try:
        yield f"postgresql+psycopg://{user}@{host}/{database}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


def full_frame_plate(
    pattern: str,
    frames: Iterable[int],
    size: tuple[int, int],
    colorspace: str,
    *,
    guessed: bool = False,
    fingerprints: dict[int, tuple[int, str]] | None = None,
) -> PlateInfo:
    """A plate of ``frames`` with no holes whose data and display windows are the whole
    ``size`` (width, height), square pixels: what a catalog needs to register a job."""
    from schemas.summaries import PlateInfo

    width, height = size
    window = (0, 0, width - 1, height - 1)
    return PlateInfo(
        pattern=pattern,
        frames=tuple(frames),
        holes=(),
        width=width,
        height=height,
        data_window=window,
        display_window=window,
        pixel_aspect=1.0,
        colorspace=colorspace,
        colorspace_guessed=guessed,
        fingerprints=dict(fingerprints or {}),
    )
