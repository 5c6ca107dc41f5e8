"""SHA-256 checksums of plate frames (they feed the cache key), local paths and `s3://` alike."""

from __future__ import annotations

import hashlib

from storage.errors import reading
from storage.location import Where, as_location

# 8 MiB: few round trips on S3, small enough to keep memory flat however big the file.
BLOCK_SIZE = 8 * 1024 * 1024


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    """Hex SHA-256 of bytes already in memory (e.g. a frame fetched once for decoding)."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(where: Where, *, frame: int | None = None) -> str:
    """Hex SHA-256 of a file, read in `BLOCK_SIZE` blocks so memory stays flat.

    Raises FrameError (naming the URI and `frame`) when the file cannot be read.
    """
    where = as_location(where)
    fs, path = where.fs_and_path()
    digest = hashlib.sha256()
    with (
        reading(where.uri, frame, prefix="cannot checksum: ", failed="read failed"),
        fs.open(path, "rb", block_size=BLOCK_SIZE) as handle,
    ):
        while block := handle.read(BLOCK_SIZE):
            digest.update(block)
    return digest.hexdigest()
