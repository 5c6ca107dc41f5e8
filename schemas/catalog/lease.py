"""Who runs a job, and whether it still does: a job row names its owner run
(``host:pid:start:nonce``) and carries a heartbeat the owner refreshes while it runs.

On the owner's own host the process itself is asked (is the pid alive, and is it the same
process: its start time guards against a reused pid; in this very process, is that run still
going); from another host only the heartbeat can tell, and a heartbeat older than the lease
means the owner is gone (a lost machine, a SIGKILL, a flow that died with the database
away)."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from datetime import datetime

HEARTBEAT_S = 10.0  # how often a running job says it is alive
LEASE_S = 60.0  # a job silent for longer than this, on another host, is taken for dead

_RUNS_HERE: set[str] = set()  # owners of the runs in progress in this process
_LOCK = threading.Lock()


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), '' where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()  # field 22 of stat(5), counted after "pid (comm)"
    except (OSError, IndexError):
        return ""


def start_run() -> str:
    """A new owner for a run in this process; `end_run` when the run is over."""
    pid = os.getpid()
    owner = f"{socket.gethostname()}:{pid}:{process_start(pid)}:{uuid.uuid4().hex[:12]}"
    with _LOCK:
        _RUNS_HERE.add(owner)
    return owner


def end_run(owner: str) -> None:
    with _LOCK:
        _RUNS_HERE.discard(owner)


def owner_alive(
    owner: str, heartbeat_at: datetime | None, now: datetime, lease_s: float = LEASE_S
) -> bool:
    parts = owner.rsplit(":", 3)
    if len(parts) != 4 or not parts[1].isdigit() or parts[0] != socket.gethostname():
        return _recent(heartbeat_at, now, lease_s)
    pid, start = int(parts[1]), parts[2]
    if pid == os.getpid():
        with _LOCK:
            return owner in _RUNS_HERE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return not start or process_start(pid) in ("", start)


def _recent(heartbeat_at: datetime | None, now: datetime, lease_s: float) -> bool:
    return heartbeat_at is not None and (now - heartbeat_at).total_seconds() < lease_s
