"""Giving freed memory back to the kernel when a Dask worker needs it to go on.

The worker processes this platform starts keep freed blocks for reuse (``flows.allocator``'s
``ALLOCATOR_ENV``: much faster on 4K frames on the CPU), so their resident size stays at
its high-water mark. Dask pauses a worker whose resident size is above its ``pause``
fraction of the memory limit (0.8 by default) and resumes it only once the size falls again;
with nothing ever returned, a worker that once peaked above it (four real models on the CPU,
say) would stay paused for good and its chunks would wait forever (docs/design/allocator.md).
``ReturnFreedMemory`` asks glibc to return what is free (``malloc_trim``) when a task ends
above that fraction, and every second while the worker is paused, so a peak costs one trim
rather than the worker. Within a chunk, frames still reuse the kept blocks.

It also says Dask's memory warnings once per worker in our words (`flows.memory_warnings`).

It is a worker plugin the flow registers on whatever cluster it uses (``flows.cluster``):
workers that join later get it too. Where glibc's ``malloc_trim`` is missing (another C
library, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import Any

from distributed import WorkerPlugin
from distributed.core import Status

from .memory_warnings import quiet_dask_memory_warnings, restore_dask_memory_warnings

log = logging.getLogger(__name__)

PLUGIN_NAME = "svfx-return-freed-memory"
PAUSED_TRIM_INTERVAL_MS = 1000


def malloc_trim() -> bool:
    """Return the C heap's free pages to the kernel; False where glibc's call is missing."""
    trim = _glibc_malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _glibc_malloc_trim() -> Any:
    """glibc's malloc_trim, looked up once (find_library runs ldconfig: not every second in
    the worker's event loop); None where there is none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class ReturnFreedMemory(WorkerPlugin):
    """Trim the heap when a task ends above the pause fraction, and while paused."""

    name = PLUGIN_NAME
    idempotent = True  # registering it again (every flow run does) keeps the one in place

    def setup(self, worker: Any) -> None:
        from tornado.ioloop import PeriodicCallback

        self.worker = worker
        self.trims = 0
        self._warnings = quiet_dask_memory_warnings(str(worker.name or worker.address))
        self._paused_trim = PeriodicCallback(self._trim_if_paused, PAUSED_TRIM_INTERVAL_MS)
        self._paused_trim.start()

    def teardown(self, worker: Any) -> None:
        self._paused_trim.stop()
        restore_dask_memory_warnings(self._warnings)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if start == "executing" and self._above_pause():
            self._trim()

    def _trim_if_paused(self) -> None:
        if self.worker.status == Status.paused:
            self._trim()

    def _above_pause(self) -> bool:
        memory = self.worker.memory_manager
        if not memory.memory_limit or memory.memory_pause_fraction is False:
            return False
        resident = self.worker.monitor.get_process_memory()
        return bool(resident > memory.memory_limit * memory.memory_pause_fraction)

    def _trim(self) -> None:
        if malloc_trim():
            self.trims += 1


def return_freed_memory(client: Any) -> None:
    """Register `ReturnFreedMemory` on the client's cluster (workers joining later get it
    too). A cluster that refuses it runs on without it, and the log says why."""
    try:
        client.register_plugin(ReturnFreedMemory(), name=PLUGIN_NAME)
    except Exception as exc:  # workers without this module, a plugin refused by the scheduler
        log.warning(
            "workers keep freed memory without returning it when Dask pauses them: "
            "registering %s failed (%s: %s)",
            PLUGIN_NAME,
            type(exc).__name__,
            exc,
        )
