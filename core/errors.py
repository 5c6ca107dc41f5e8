"""The root of every error a user (or operator) can cause and act on: a bad spec, plate,
template, cut or checkpoint, a catalog that is damaged or away, a scheduler or orchestrator
that does not answer, a live job on the same outputs. Each one's message already names the
file, frame or service and the reason, so a command prints it as is, with no traceback, and
exits with the code it carries (docs/reference/exit-codes.md: 2, failed or refused).

Programming errors (bugs) are not among them: they keep their traceback. Subclasses keep the
builtin base their callers catch (``ValueError``, ``OSError``, ``RuntimeError``) beside this
one, so recognising them as refusals changes nothing else.

Imports nothing, so every package (`sapiens` and `storage` included) may derive from it."""

from __future__ import annotations

from typing import ClassVar


class SvfxError(Exception):
    """An error the user can act on; ``message`` is what to print, ``exit_code`` how a
    command ends on it."""

    exit_code: ClassVar[int] = 2  # 2: failed or the input refused (docs/reference/exit-codes.md)

    @property
    def message(self) -> str:
        """What the user reads: the file, frame or service, and the reason."""
        return str(self)


def missing_extra(module: str, extra: str) -> str | None:
    """None when ``module`` can be imported; else what to install: the optional extra of
    pyproject.toml that brings it (S3's s3fs, PostgreSQL's psycopg), named for the user."""
    from importlib.util import find_spec

    if find_spec(module) is not None:
        return None
    return f'{module} is not installed: pip install "sapiens-vfx[{extra}]"'
