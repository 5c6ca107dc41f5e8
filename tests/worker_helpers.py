"""What tests ask of Dask worker processes (run there through `client.run`)."""

from __future__ import annotations

from pathlib import Path


def start_env() -> dict[str, str]:
    """The environment this process started with (/proc/self/environ): what glibc read its
    MALLOC_* settings from, where os.environ may have been changed since."""
    raw = Path("/proc/self/environ").read_bytes().split(b"\0")
    pairs = (item.decode().partition("=") for item in raw if item)
    return {key: value for key, _, value in pairs}
