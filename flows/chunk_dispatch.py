"""Chunks onto the Dask cluster in a bounded window, their summaries back as they land; a
chunk the cluster lost or that raised comes back as failed frames, so a run always has a
summary for every frame it dispatched."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from schemas.summaries import ChunkSummary, FrameSummary
from tasks.chunk_job import ChunkJob

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger("svfx.flow")


def dispatch(
    client: Client,
    jobs: list[ChunkJob],
    *,
    window: int,
    resources: dict[str, float] | None,
    stop: threading.Event | None = None,
) -> Iterator[ChunkSummary]:
    """Submit chunks keeping at most `window` in flight (resource-restricted tasks skip Dask's
    own queueing, stack-notes.md 3.2); yield each summary as it lands. A chunk whose worker
    died more often than Dask allows, or that raised, comes back as failed frames. Once
    ``stop`` is set nothing more is submitted and the chunks in flight are still yielded."""
    # Dask and the worker's code (torch) only where chunks are dispatched: a run with nothing
    # to compute (flows.settled) does without them
    from distributed import as_completed

    from tasks.chunk_worker import process_chunk

    pending = iter(jobs)
    in_flight: dict[Any, ChunkJob] = {}
    run = uuid.uuid4().hex[:8]

    def submit_next(ac: Any) -> Any:
        job = None if stop is not None and stop.is_set() else next(pending, None)
        if job is None:
            return None
        future = client.submit(
            process_chunk,
            job,
            key=f"svfx-chunk-{run}-{job.index}",
            resources=resources,
            pure=False,
        )
        in_flight[future] = job
        if ac is not None:
            ac.add(future)
        return future

    first = [f for f in (submit_next(None) for _ in range(max(1, window))) if f is not None]
    if not first:
        return
    completed = as_completed(first)
    for future in completed:
        job = in_flight.pop(future)
        try:
            summary = future.result()
        except Exception as exc:
            reason = f"chunk {job.index} failed on the cluster: {type(exc).__name__}: {exc}"
            log.error(reason)
            summary = failed_chunk(
                job.index,
                {f: reason for f in job.frames},
                uris=dict(zip(job.frames, job.plate_uris, strict=True)),
            )
        future.release()  # a dead worker must not make Dask recompute finished chunks
        submit_next(completed)
        yield summary


def failed_chunk(
    index: int, reasons: dict[int, str], uris: dict[int, str] | None = None
) -> ChunkSummary:
    frames = [
        FrameSummary(frame=f, plate_uri=(uris or {}).get(f, ""), status="failed", error=why)
        for f, why in sorted(reasons.items())
    ]
    return ChunkSummary(
        chunk_index=index,
        frames=frames,
        worker="",
        environment={},
        checkpoints={},
        colour={},
        tiling={},
    )
