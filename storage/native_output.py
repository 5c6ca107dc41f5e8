"""What native libraries print on the process's own output, kept off the user's terminal.

OpenEXR's Python binding prints "Warning: Exception raised reading pixel data ..." through
Python's ``sys.stdout`` and its C core prints one "EXR_ERR_..." line per damaged chunk on file
descriptor 2 when they meet a damaged file, before the binding raises. The reader already
turns the raised error into a message naming the file and frame; those lines would repeat it
in a less useful form, possibly dozens of times, from a Dask worker into the artist's terminal
(or into the middle of `--json` output).

`captured_native_output` points descriptors 1 and 2, and Python's ``sys.stdout`` and
``sys.stderr``, at buffers for the block and hands the lines it is asked to keep back to the
caller, who puts what matters into its own message. They belong to the whole process, so the
capture is serialised by a lock, and whatever else was written meanwhile (another thread's
log line) is passed on to where it was going afterwards: late, never lost.
"""

from __future__ import annotations

import ctypes
import io
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TextIO

_LOCK = threading.Lock()
_LIBC = ctypes.CDLL(None)


def _flush_all() -> None:
    """Flush Python's and C's stdout/stderr buffers, so what was printed so far lands where
    it was meant to go."""
    sys.stdout.flush()
    sys.stderr.flush()
    _LIBC.fflush(None)


def _writer(fd: int) -> Callable[[str], object]:
    return lambda text: os.write(fd, text.encode())


@contextmanager
def captured_native_output(keep: Callable[[str], bool]) -> Iterator[list[str]]:
    """Yield a list that, after the block, holds the lines printed (on descriptors 1 and 2
    or through sys.stdout/sys.stderr) that ``keep`` accepts; the other lines go on to where
    they were written."""
    caught: list[str] = []

    def sort_out(text: str, write: Callable[[str], object]) -> None:
        for line in text.splitlines():
            if keep(line):
                caught.append(line)
            elif line.strip():
                write(line + "\n")

    with _LOCK, ExitStack() as stack:
        _flush_all()
        spools = {fd: stack.enter_context(tempfile.TemporaryFile()) for fd in (1, 2)}
        saved = {fd: os.dup(fd) for fd in spools}
        streams: tuple[TextIO, TextIO] = (sys.stdout, sys.stderr)
        python_out, python_err = io.StringIO(), io.StringIO()
        for fd, spool in spools.items():
            os.dup2(spool.fileno(), fd)
        sys.stdout, sys.stderr = python_out, python_err
        try:
            yield caught
        finally:
            sys.stdout, sys.stderr = streams
            _flush_all()
            for fd, spool in spools.items():
                os.dup2(saved[fd], fd)
                os.close(saved[fd])
                spool.seek(0)
                sort_out(spool.read().decode(errors="replace"), _writer(fd))
            sort_out(python_out.getvalue(), streams[0].write)
            sort_out(python_err.getvalue(), streams[1].write)
