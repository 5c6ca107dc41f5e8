"""What the benchmark scripts share: a free loopback port and a throwaway PostgreSQL database."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

DEFAULT_PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


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
