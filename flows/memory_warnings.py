"""Dask's memory warnings, said once per worker in our words, with what to do about them.

A Dask worker logs "Unmanaged memory use is high. This may indicate a memory leak ...",
"Worker is at 81% memory usage. Pausing worker ..." (and "Resuming worker") and "full garbage
collections took 12% CPU time" as raw log lines, on the terminal of whoever started the
cluster, again and again. Most of a worker's memory is its resident models and the buffers
of the frames in flight, which Dask cannot see and calls unmanaged, so the hint about leaks
sends the user the wrong way. `OurMemoryWarning` is a logging filter for the loggers those
lines come from: it drops them, and the first one of a worker becomes one line of ours (on
``svfx.worker.memory``) naming the worker, its memory and its limit, and what to do.
"""

from __future__ import annotations

import logging
import threading

DASK_MEMORY_LOGGERS = ("distributed.worker.memory", "distributed.gc", "distributed.utils_perf")
OUR_LOGGER = "svfx.worker.memory"
ADVICE = (
    "it holds its models and the buffers of the frames in flight, which Dask counts as "
    "unmanaged memory, and Dask pauses a worker at 80% of its limit until its memory falls. "
    "Give each worker more memory (`svfx worker --memory-limit`, or fewer workers per "
    "machine), load the models in bf16 (precision bf16), or use fewer or smaller models per "
    "run. Dask's own memory warnings for this worker are not shown"
)


class OurMemoryWarning(logging.Filter):
    """Drops Dask's memory warnings; the first becomes one line of ours."""

    def __init__(self, worker_name: str) -> None:
        super().__init__()
        self.worker_name = worker_name
        self.dropped = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            self.dropped += 1
            first = self.dropped == 1
        if first:
            logging.getLogger(OUR_LOGGER).warning(
                "worker %s is short of memory%s: %s", self.worker_name, _figures(record), ADVICE
            )
        return False


def _figures(record: logging.LogRecord) -> str:
    """'(9.4 GiB of its 11.5 GiB limit)' from a pause record's arguments, else ''."""
    args = record.args
    if str(record.msg).startswith("Worker is at") and isinstance(args, tuple) and len(args) == 3:
        return f" ({args[1]} of its {args[2]} limit)"
    return ""


def quiet_dask_memory_warnings(worker_name: str) -> OurMemoryWarning:
    """Put one `OurMemoryWarning` on every Dask memory logger of this process."""
    ours = OurMemoryWarning(worker_name)
    for name in DASK_MEMORY_LOGGERS:
        logging.getLogger(name).addFilter(ours)
    return ours


def restore_dask_memory_warnings(ours: OurMemoryWarning) -> None:
    for name in DASK_MEMORY_LOGGERS:
        logging.getLogger(name).removeFilter(ours)
