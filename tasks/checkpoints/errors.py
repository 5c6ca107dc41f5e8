"""The checkpoint errors a run can refuse with, in a module of their own so that code which
only needs to recognise them (`cli.models`) imports neither torch nor the rest of the room:
choosing (`CheckpointChoiceError`, raised by `tasks.checkpoints.choice` and the modules it
calls) and a file that is not a usable checkpoint (`sapiens.errors.CheckpointError`, which
needs no torch)."""

from __future__ import annotations

from core.errors import SvfxError
from sapiens.errors import CheckpointError

__all__ = ["CheckpointChoiceError", "CheckpointError"]


class CheckpointChoiceError(SvfxError, ValueError):
    """No usable checkpoint for a pass; the message says what was looked for and found."""
