"""What native libraries print on the process's own output, kept off the user's terminal.

OpenEXR's Python binding prints "Warning: Exception raised reading pixel data ..." on file
descriptor 1 and its C core one "EXR_ERR_..." line per damaged chunk on descriptor 2 when
they meet a damaged file, before the binding raises. The reader already turns the raised
error into a message naming the file and frame; those lines would repeat it in a less useful
form, possibly dozens of times, from a Dask worker into the artist's terminal (or into the
middle of `--json` output).

`captured_native_output` points descriptors 1 and 2 at temporary files for the block and
hands the lines it is asked to keep back to the caller, who puts what matters into its own
message. The descriptors belong to the whole process, so the capture is serialised by a lock,
and whatever else was written meanwhile (another thread's log line) is passed on to where it
was going afterwards: late, never lost.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

_LOCK = threading.Lock()


@contextmanager
def captured_native_output(keep: Callable[[str], bool]) -> Iterator[list[str]]:
    """Yield a list that, after the block, holds the lines written to descriptors 1 and 2
    that ``keep`` accepts; the other lines go on to where they were written."""
    caught: list[str] = []
    with _LOCK, ExitStack() as stack:
        sys.stdout.flush()
        sys.stderr.flush()
        spools = {fd: stack.enter_context(tempfile.TemporaryFile()) for fd in (1, 2)}
        saved = {fd: os.dup(fd) for fd in spools}
        for fd, spool in spools.items():
            os.dup2(spool.fileno(), fd)
        try:
            yield caught
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, spool in spools.items():
                os.dup2(saved[fd], fd)
                os.close(saved[fd])
                spool.seek(0)
                for line in spool.read().decode(errors="replace").splitlines():
                    if keep(line):
                        caught.append(line)
                    elif line.strip():
                        os.write(fd, (line + "\n").encode())
