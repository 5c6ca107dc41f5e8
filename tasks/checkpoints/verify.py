"""Verify the checkpoints chosen for a run once, in the flow, before any frame is sent.

A checkpoint with NaN weights, or one whose tensors do not fit the model they describe, would
otherwise be found on a Dask worker after every frame had been dispatched. `verify_checkpoints`
runs the checks `load_model` makes (header, shapes against the inferred model, every floating
tensor finite; `sapiens.loading.verify_checkpoint`) up front, streaming each file off disk
(its speed: docs/design/checkpoints.md, `python -m bench.checkpoint_verify`).

A success is remembered per (resolved path, size, mtime_ns, sha256) in
``$SVFX_HOME/checkpoint-verified.json``, next to the sha256 cache, so a re-run costs a stat and
a small JSON read per file. Failures are not remembered: a fixed file is checked again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from sapiens.errors import CheckpointError

from .caches import JsonFileCache, cached_sha256, file_identity
from .errors import CheckpointChoiceError
from .files import CheckpointRef

# Bump when the checks change, so files verified by an older version are checked again.
VERIFY_VERSION = 1
VERIFIED_CACHE = JsonFileCache("checkpoint-verified.json")
MAX_PARALLEL_FILES = 4  # reading and the numpy check release the GIL

log = logging.getLogger("svfx.checkpoints")


def verify_checkpoints(refs: Mapping[str, CheckpointRef]) -> None:
    """Verify every file in `refs` (pass -> checkpoint), each once; CheckpointChoiceError
    listing every bad file, the passes it was chosen for and why."""
    passes_of: dict[str, list[str]] = {}
    files: dict[str, CheckpointRef] = {}
    for name, ref in refs.items():
        passes_of.setdefault(ref.path, []).append(name)
        files[ref.path] = ref
    if not files:
        return
    workers = min(MAX_PARALLEL_FILES, len(files), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        errors = [e for e in pool.map(_verify_or_error, files.values()) if e is not None]
    if errors:
        lines = [f"{len(errors)} checkpoint file(s) failed verification:"]
        lines += [f"  {', '.join(passes_of[e.path])}: {e}" for e in errors]
        raise CheckpointChoiceError("\n".join(lines))


def verify_checkpoint(path: str) -> None:
    """`sapiens.loading.verify_checkpoint`, imported when a file is to be verified: it needs
    torch, which a plan whose files all passed before (a resubmit) does not."""
    from sapiens.loading import verify_checkpoint as verify

    verify(path)


def verify_checkpoint_once(ref: CheckpointRef) -> None:
    """`verify_checkpoint` unless this exact file (same path, size, mtime and sha256) passed
    before; CheckpointError naming the file otherwise."""
    try:
        identity = file_identity(ref.path)
    except OSError as exc:
        raise CheckpointError(ref.path, f"cannot read it: {exc.strerror or exc}") from None
    key = f"{identity}|{ref.sha256}"
    if VERIFIED_CACHE.get(key) == VERIFY_VERSION:
        return
    if cached_sha256(ref.path) != ref.sha256:
        raise CheckpointError(ref.path, "the file changed since it was chosen; submit again")
    start = time.perf_counter()
    verify_checkpoint(ref.path)
    log.info("verified %s in %.2f s", ref.path, time.perf_counter() - start)
    if file_identity(ref.path) == identity:  # not rewritten while it was being read
        VERIFIED_CACHE.put(key, VERIFY_VERSION)


def _verify_or_error(ref: CheckpointRef) -> CheckpointError | None:
    try:
        verify_checkpoint_once(ref)
    except CheckpointError as exc:
        return exc
    return None
