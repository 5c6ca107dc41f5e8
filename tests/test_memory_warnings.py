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


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def caught(monkeypatch: pytest.MonkeyPatch) -> Records:
    """What these loggers emit, caught on the loggers themselves: whatever logging an earlier
    test in the process configured (Dask's own config, distributed's rate limiter, levels,
    propagation) is set aside for them here."""
    records = Records()
    for name in (*DASK_MEMORY_LOGGERS, OUR_LOGGER):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "disabled", False)
        monkeypatch.setattr(logger, "propagate", False)
        monkeypatch.setattr(logger, "level", logging.DEBUG)
        monkeypatch.setattr(logger, "filters", [])
        monkeypatch.setattr(logger, "handlers", [records])
    logging.getLogger().manager._clear_cache()
    return records


@pytest.fixture
def quieted():
    ours = quiet_dask_memory_warnings("tcp://127.0.0.1:4242")
    yield ours
    restore_dask_memory_warnings(ours)


def test_dask_memory_warnings_become_one_line_of_ours(caught, quieted) -> None:
    memory = logging.getLogger("distributed.worker.memory")
    pause = "Worker is at %d%% memory usage. Pausing worker.  Process memory: %s -- limit: %s"
    for _ in range(5):
        memory.warning(pause, 81, "9.40 GiB", "11.50 GiB")
        memory.warning("Unmanaged memory use is high. This may indicate a memory leak ...")
    logging.getLogger("distributed.gc").warning("full garbage collections took %d%%", 12)
    memory.debug("a debug line passes")

    ours = [r for r in caught.records if r.name == OUR_LOGGER]
    raw = [r for r in caught.records if r.name in DASK_MEMORY_LOGGERS]
    assert len(ours) == 1
    line = ours[0].getMessage()
    assert "tcp://127.0.0.1:4242" in line and "9.40 GiB of its 11.50 GiB limit" in line
    assert "--memory-limit" in line and "bf16" in line and "memory leak" not in line
    assert [r.getMessage() for r in raw] == ["a debug line passes"]
    assert quieted.dropped == 11


def test_restoring_lets_dask_speak_again(caught) -> None:
    ours = quiet_dask_memory_warnings("w")
    restore_dask_memory_warnings(ours)
    logging.getLogger("distributed.worker.memory").warning("Unmanaged memory use is high")
    assert [r.name for r in caught.records] == ["distributed.worker.memory"]
