"""Dask's memory warnings reach the user once per worker, in our words (`flows.memory_warnings`)."""

from __future__ import annotations

import logging

import pytest

from flows.memory_warnings import (
    DASK_MEMORY_LOGGERS,
    OUR_LOGGER,
    quiet_dask_memory_warnings,
    restore_dask_memory_warnings,
)


@pytest.fixture
def quieted():
    ours = quiet_dask_memory_warnings("tcp://127.0.0.1:4242")
    yield ours
    restore_dask_memory_warnings(ours)


def test_dask_memory_warnings_become_one_line_of_ours(quieted, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    memory = logging.getLogger("distributed.worker.memory")
    pause = "Worker is at %d%% memory usage. Pausing worker.  Process memory: %s -- limit: %s"
    for _ in range(5):
        memory.warning(pause, 81, "9.40 GiB", "11.50 GiB")
        memory.warning("Unmanaged memory use is high. This may indicate a memory leak ...")
    logging.getLogger("distributed.gc").warning("full garbage collections took %d%%", 12)
    memory.debug("a debug line passes")

    ours = [r for r in caplog.records if r.name == OUR_LOGGER]
    raw = [r for r in caplog.records if r.name in DASK_MEMORY_LOGGERS]
    assert len(ours) == 1
    line = ours[0].getMessage()
    assert "tcp://127.0.0.1:4242" in line and "9.40 GiB of its 11.50 GiB limit" in line
    assert "--memory-limit" in line and "bf16" in line and "memory leak" not in line
    assert [r.getMessage() for r in raw] == ["a debug line passes"]
    assert quieted.dropped == 11


def test_restoring_lets_dask_speak_again(caplog) -> None:
    ours = quiet_dask_memory_warnings("w")
    restore_dask_memory_warnings(ours)
    with caplog.at_level(logging.WARNING):
        logging.getLogger("distributed.worker.memory").warning("Unmanaged memory use is high")
    assert [r.name for r in caplog.records] == ["distributed.worker.memory"]
