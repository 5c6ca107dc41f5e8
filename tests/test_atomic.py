"""Atomic writes: readers see the old or the new complete file, even when the writer is killed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import s3fs

from storage.atomic import (
    atomic_open,
    atomic_upload_file,
    atomic_write_bytes,
    remove_stale_temp_files,
)
from storage.errors import StorageError
from storage.location import Location

REPO = Path(__file__).resolve().parents[1]
OLD = b"old-complete-version\n" * 1000

# A writer that streams through atomic_open in slow chunks and never finishes on its own; it
# says when it is part way through, so the test can kill it there.
SLOW_WRITER = textwrap.dedent(
    """
    import json, sys, time
    from storage.atomic import atomic_open
    from storage.location import Location
    uri, options = sys.argv[1], json.loads(sys.argv[2])
    with atomic_open(Location(uri, options or None)) as handle:
        index = 0
        while True:
            handle.write(b"N" * 65536)
            handle.flush()
            index += 1
            if index == 5:
                print("writing", flush=True)
            time.sleep(0.01)
    """
)

# Starts an s3fs multipart upload (two 5 MiB parts sent) and then hangs before completing it.
HANGING_MULTIPART = textwrap.dedent(
    """
    import json, sys, time
    import s3fs
    options, path = json.loads(sys.argv[1]), sys.argv[2]
    fs = s3fs.S3FileSystem(**options)
    handle = fs.open(path, "wb", block_size=5 * 2**20)
    handle.write(b"P" * (11 * 2**20))
    handle.flush()
    assert handle.mpu is not None, "expected a multipart upload in progress"
    print("parts-uploaded", flush=True)
    time.sleep(600)
    """
)


def _start(script: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line not in ("writing", "parts-uploaded"):
        process.kill()
        pytest.fail(
            f"writer did not start: {line!r} {process.stderr.read() if process.stderr else ''}"
        )
    return process


def _kill(process: subprocess.Popen[str]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL


def test_write_bytes_local_returns_checksum_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "frame.1001.exr"
    first = atomic_write_bytes(str(target), b"first")
    second = atomic_write_bytes(str(target), b"second version")
    assert target.read_bytes() == b"second version"
    assert second.sha256 == hashlib.sha256(b"second version").hexdigest()
    assert second.size == len(b"second version")
    assert first.sha256 != second.sha256
    assert sorted(p.name for p in target.parent.iterdir()) == ["frame.1001.exr"]


def test_new_file_gets_umask_permissions(tmp_path: Path) -> None:
    target = tmp_path / "perm.bin"
    atomic_write_bytes(str(target), b"x")
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


def test_atomic_open_commit_and_failure_local(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    writer = atomic_open(str(target))
    with writer as handle:
        handle.write(b"abc")
        handle.seek(0)
        handle.write(b"X")
    assert target.read_bytes() == b"Xbc"
    assert writer.result is not None
    assert writer.result.sha256 == hashlib.sha256(b"Xbc").hexdigest()
    assert writer.result.size == 3

    failing = atomic_open(str(target))
    with pytest.raises(RuntimeError), failing as handle:
        handle.write(b"half")
        raise RuntimeError("encoder crashed")
    assert target.read_bytes() == b"Xbc"
    assert failing.result is None
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_upload_file_local(tmp_path: Path) -> None:
    source = tmp_path / "source.mp4"
    source.write_bytes(os.urandom(10_000))
    result = atomic_upload_file(source, str(tmp_path / "copy" / "clip.mp4"))
    assert (tmp_path / "copy" / "clip.mp4").read_bytes() == source.read_bytes()
    assert result.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()


def test_unwritable_destination_names_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_bytes(b"")
    uri = str(blocker / "frame.exr")
    with pytest.raises(StorageError, match=r"not_a_dir/frame\.exr"):
        atomic_write_bytes(uri, b"x")
    with pytest.raises(StorageError, match=r"not_a_dir/frame\.exr"), atomic_open(uri) as handle:
        handle.write(b"x")


def test_unsupported_protocol_is_refused() -> None:
    with pytest.raises(StorageError, match="atomic writes"):
        atomic_write_bytes("ftp://example.invalid/x.bin", b"x")


@pytest.mark.parametrize("previous", [True, False])
def test_killed_local_writer_leaves_old_file_or_nothing(tmp_path: Path, previous: bool) -> None:
    target = tmp_path / "shot.1001.exr"
    if previous:
        atomic_write_bytes(str(target), OLD)
    process = _start(SLOW_WRITER, str(target), "{}")
    try:
        # While the writer runs, a reader only ever sees the complete old version.
        for _ in range(20):
            seen = target.read_bytes() if target.exists() else None
            assert seen == (OLD if previous else None)
    finally:
        _kill(process)
    if previous:
        assert target.read_bytes() == OLD
    else:
        assert not target.exists()
    visible = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert visible == (["shot.1001.exr"] if previous else [])
    hidden = [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert len(hidden) == 1 and hidden[0].name.endswith(".tmp")
    assert remove_stale_temp_files(tmp_path, older_than_s=3600) == 0  # too young to remove
    assert remove_stale_temp_files(tmp_path, older_than_s=-1) == 1
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_s3_round_trip_and_failed_block(s3_bucket: tuple[str, dict[str, Any]]) -> None:
    root, options = s3_bucket
    uri = f"{root}/shot/frame.1001.exr"
    result = atomic_write_bytes(Location(uri, options), b"payload")
    fs = s3fs.S3FileSystem(**options)
    assert fs.cat_file(uri) == b"payload"
    assert result.sha256 == hashlib.sha256(b"payload").hexdigest()

    writer = atomic_open(Location(uri, options))
    with writer as handle:
        handle.write(b"new payload")
    assert fs.cat_file(uri) == b"new payload"
    assert writer.result is not None and writer.result.size == len(b"new payload")

    with (
        pytest.raises(ValueError),
        atomic_open(Location(f"{root}/shot/other.exr", options)) as handle,
    ):
        handle.write(b"partial")
        raise ValueError("stop")
    assert fs.ls(f"{root}/shot", refresh=True) == [f"{root[5:]}/shot/frame.1001.exr"]


def test_killed_s3_writer_leaves_old_object_and_no_temp_key(
    s3_bucket: tuple[str, dict[str, Any]],
) -> None:
    root, options = s3_bucket
    uri = f"{root}/shot/frame.1001.exr"
    atomic_write_bytes(Location(uri, options), OLD)
    process = _start(SLOW_WRITER, uri, json.dumps(options))
    _kill(process)
    fs = s3fs.S3FileSystem(**options)
    assert fs.cat_file(uri) == OLD
    assert fs.find(root, refresh=True) == [uri[5:]]


def test_s3_multipart_upload_is_invisible_until_completed(
    s3_bucket: tuple[str, dict[str, Any]],
) -> None:
    """The premise of atomic.py on S3: a killed multipart upload never becomes an object."""
    root, options = s3_bucket
    path = f"{root[5:]}/shot/big.exr"
    process = _start(HANGING_MULTIPART, json.dumps(options), path)
    fs = s3fs.S3FileSystem(**options)
    try:
        uploads = fs.call_s3("list_multipart_uploads", Bucket=root[5:])
        assert [upload["Key"] for upload in uploads.get("Uploads", [])] == ["shot/big.exr"]
        fs.invalidate_cache()
        assert not fs.exists(path)
    finally:
        _kill(process)
    assert fs.find(root, refresh=True) == []
