"""The embedded Prefect server, run as a child of an svfx command (`flows.orchestrator`):
Prefect's API on 127.0.0.1 at the port given, no UI. It exits when its parent does: its
stdin is a pipe from the parent, and reading it returns end of file once the parent closes it
or dies, SIGKILL included (the kernel closes a dead process's files).

    python -m flows.prefect_child PORT
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def _exit_with_parent() -> None:
    sys.stdin.buffer.read()  # blocks until the parent closes the pipe or is gone
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down cleanly on SIGTERM
    time.sleep(15)
    os._exit(0)  # it did not: leave anyway


def main() -> None:
    port = int(sys.argv[1])
    threading.Thread(target=_exit_with_parent, name="exit-with-parent", daemon=True).start()
    import uvicorn

    uvicorn.run(
        "prefect.server.api.server:create_app",
        factory=True,
        host="127.0.0.1",
        port=port,
        log_level="error",
        lifespan="on",
    )


if __name__ == "__main__":
    main()
