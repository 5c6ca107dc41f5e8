"""A tracker's client uploads from a local path: an output on object storage is copied to a
temporary file first (and removed after)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from storage.location import Location


@contextmanager
def local_path(where: Location) -> Iterator[str]:
    fs, path = where.fs_and_path()
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="svfx-publish-") as tmp:
        local = str(Path(tmp) / Path(path).name)
        fs.get(path, local)
        yield local
