"""Per-file caches under $SVFX_HOME: small JSON maps keyed by a file's identity (path, size,
mtime), so what is slow to learn about a big checkpoint (its sha256, that it was verified) is
learnt once per file version."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from sapiens.safetensors_format import sha256_file
from storage.atomic import atomic_write_bytes
from storage.errors import StorageError


class JsonFileCache:
    """A small str -> JSON map in a file under $SVFX_HOME (nothing is kept when it is unset),
    rewritten atomically. Two processes writing at once may drop each other's newest entry,
    which only costs recomputing it; a cache that cannot be written costs the same.
    Not diskcache: it keeps a SQLite folder, where each cache here is one small JSON file."""

    def __init__(self, filename: str, *, path_env: str | None = None) -> None:
        """``path_env``: an environment variable that, when set, names the file instead
        (a cache of what is true of the whole machine, shared by every SVFX_HOME on it)."""
        self.filename = filename
        self.path_env = path_env
        self._lock = threading.Lock()

    def file(self) -> Path | None:
        explicit = os.environ.get(self.path_env) if self.path_env else None
        if explicit:
            return Path(explicit)
        home = os.environ.get("SVFX_HOME")
        return Path(home) / self.filename if home else None

    def get(self, key: str) -> Any:
        with self._lock:
            return self._read().get(key)

    def put(self, key: str, value: Any) -> None:
        path = self.file()
        if path is None:
            return
        with self._lock:
            entries = self._read()
            entries[key] = value
            with contextlib.suppress(OSError, StorageError):  # costs recomputing only
                atomic_write_bytes(str(path), json.dumps(entries).encode())

    def _read(self) -> dict[str, Any]:
        path = self.file()
        if path is None or not path.is_file():
            return {}
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):  # unreadable or not JSON: every entry is learnt again
            return {}
        return entries if isinstance(entries, dict) else {}  # JSON, but not a map (a list...)


# A big checkpoint's sha256 is slow to compute; remember it per (path, size, mtime).
SHA256_CACHE = JsonFileCache("checkpoint-sha256.json")


def file_identity(path: str | os.PathLike[str]) -> str:
    """'resolved path|size|mtime_ns': changes whenever the file is replaced or rewritten."""
    stat = Path(path).stat()
    return f"{Path(path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}"


def cached_sha256(path: str | os.PathLike[str]) -> str:
    """The file's sha256, computed once per file version (`file_identity`)."""
    key = file_identity(path)
    digest = SHA256_CACHE.get(key)
    if isinstance(digest, str):
        return digest
    digest = sha256_file(path)
    SHA256_CACHE.put(key, digest)
    return digest
