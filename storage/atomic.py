"""Atomic writes: a reader sees the previous complete file or the new complete file, never a part.

Local paths: the bytes go to a hidden temporary file in the destination's own directory
(`.<name>.<random>.tmp`), are flushed and fsync'ed, and `os.replace` renames it over the
destination (atomic on POSIX within one filesystem); the directory is fsync'ed so the rename
survives a crash. A writer killed with SIGKILL can leave only its hidden temporary file behind,
which `remove_stale_temp_files` clears; the destination is untouched.

Object stores (S3 and the like): an object becomes visible only when the request that creates
it completes. The S3 PutObject reference says "Amazon S3 never adds partial objects; if you
receive a success response, Amazon S3 added the entire object", and a multipart upload
produces no object until CompleteMultipartUpload succeeds (a killed or aborted upload leaves
invisible parts that a bucket lifecycle rule `AbortIncompleteMultipartUpload` should reclaim;
s3fs aborts the upload itself on a Python exception). Since 2020 S3 is strongly consistent, so a
reader sees the old or the new object, never a mix. We therefore write the final key directly
in one request (s3fs `pipe_file`/`put_file`: a single PUT for small files, a multipart upload
for large ones) and never create a temporary key that could be left behind or be picked up by
a prefix listing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fsspec.core import split_protocol
from fsspec.implementations.local import LocalFileSystem

from storage.errors import StorageError
from storage.location import Where, as_location

# fsspec protocols whose "write one object" is all-or-nothing (see the module docstring).
_OBJECT_STORE_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "az", "memory"})
_TEMP_SUFFIX = ".tmp"
_HASH_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True)
class WriteResult:
    """What was committed: where, its SHA-256 (hex) and its size in bytes."""

    uri: str
    sha256: str
    size: int


def atomic_write_bytes(where: Where, data: bytes | bytearray | memoryview) -> WriteResult:
    """Write `data` to `where` so that readers never see a partial file."""
    where = as_location(where)
    uri = where.uri
    _require_supported(uri)
    payload = bytes(data)
    digest = hashlib.sha256(payload).hexdigest()
    fs, path = where.fs_and_path()
    try:
        if isinstance(fs, LocalFileSystem):
            _commit_local(Path(path), lambda handle: handle.write(payload))
        else:
            fs.pipe_file(path, payload)
    except Exception as exc:
        raise StorageError(f"{uri}: write failed: {exc}") from exc
    return WriteResult(uri=uri, sha256=digest, size=len(payload))


class AtomicOpen:
    """Context manager behind `atomic_open`; `result` holds the WriteResult after commit."""

    def __init__(self, where: Where) -> None:
        where = as_location(where)
        self.uri = where.uri
        self.result: WriteResult | None = None
        _require_supported(where.uri)
        self._fs, self._path = where.fs_and_path()
        self._local = isinstance(self._fs, LocalFileSystem)
        self._temp_path: Path | None = None
        self._handle: IO[bytes] | None = None

    def __enter__(self) -> IO[bytes]:
        try:
            if self._local:
                final = Path(self._path)
                final.parent.mkdir(parents=True, exist_ok=True)
                self._temp_path, self._handle = _open_temp_beside(final)
            else:
                # Spool to local disk, then upload the final key in one request on commit.
                spool = tempfile.NamedTemporaryFile(prefix="svfx-upload-", delete=False)
                self._temp_path, self._handle = Path(spool.name), spool
        except OSError as exc:
            raise StorageError(f"{self.uri}: cannot open for writing: {exc}") from exc
        return self._handle

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        assert self._handle is not None and self._temp_path is not None
        temp_path, handle = self._temp_path, self._handle
        try:
            if exc_type is not None:
                handle.close()
                return
            try:
                handle.flush()
                if self._local:
                    os.fsync(handle.fileno())
                handle.close()
                digest, size = _hash_file(temp_path)
                if self._local:
                    final = Path(self._path)
                    os.replace(temp_path, final)
                    _fsync_directory(final.parent)
                else:
                    self._fs.put_file(str(temp_path), self._path)
            except Exception as err:
                raise StorageError(f"{self.uri}: write failed: {err}") from err
            self.result = WriteResult(uri=self.uri, sha256=digest, size=size)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp_path.unlink()


def atomic_open(where: Where) -> AtomicOpen:
    """Open `where` for writing as a binary file that appears only when the block succeeds.

    Usage: `writer = atomic_open(uri)`, `with writer as handle: handle.write(...)`, then
    `writer.result` is the WriteResult. An exception inside the block leaves nothing behind
    (the previous version, if any, stays). The handle is a real seekable file.
    """
    return AtomicOpen(where)


def atomic_upload_file(local_path: str | os.PathLike[str], where: Where) -> WriteResult:
    """Copy a finished local file to `where` atomically (for encoders that need a real path)."""
    where = as_location(where)
    uri = where.uri
    _require_supported(uri)
    fs, path = where.fs_and_path()
    if not isinstance(fs, LocalFileSystem):  # one upload straight from the finished file
        digest, size = _hash_file(Path(local_path))
        try:
            fs.put_file(str(local_path), path)
        except Exception as exc:
            raise StorageError(f"{uri}: upload failed: {exc}") from exc
        return WriteResult(uri=uri, sha256=digest, size=size)
    writer = atomic_open(where)
    with writer as handle, open(local_path, "rb") as source:
        while block := source.read(_HASH_BLOCK):
            handle.write(block)
    assert writer.result is not None
    return writer.result


def remove_stale_temp_files(directory: str | os.PathLike[str], older_than_s: float = 3600) -> int:
    """Delete hidden `.name.*.tmp` files that killed writers left in a local directory.

    Only files older than `older_than_s` are removed, so writers still running are safe.
    Returns how many were removed.
    """
    removed = 0
    cutoff = time.time() - older_than_s
    for candidate in Path(directory).glob(f".*{_TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            if candidate.is_file() and candidate.stat().st_mtime < cutoff:
                candidate.unlink()
                removed += 1
    return removed


def _require_supported(uri: str) -> None:
    """Refuse filesystems without an atomic write before connecting to them."""
    protocol, _ = split_protocol(uri)
    if protocol in (None, "file", "local") or protocol in _OBJECT_STORE_PROTOCOLS:
        return
    raise StorageError(
        f"{uri}: atomic writes are supported on local paths and object stores "
        f"({', '.join(sorted(_OBJECT_STORE_PROTOCOLS))}), not on {protocol!r}"
    )


def _open_temp_beside(final: Path) -> tuple[Path, IO[bytes]]:
    """Create a hidden temporary file next to `final`, honouring the umask for its mode."""
    for _ in range(100):
        candidate = final.with_name(f".{final.name}.{secrets.token_hex(6)}{_TEMP_SUFFIX}")
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        return candidate, os.fdopen(fd, "w+b")
    raise StorageError(f"{final}: could not create a temporary file beside it")


def _commit_local(final: Path, write: Any) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    temp_path, handle = _open_temp_beside(final)
    try:
        with handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_path, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp_path.unlink()
        raise
    _fsync_directory(final.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hash_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size
