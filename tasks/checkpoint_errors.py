"""The checkpoint errors a run can refuse with, in a module of their own so that code which
only needs to recognise them (the refusals of `flows`) imports neither torch nor `sapiens`
through `tasks.checkpoints`: choosing (`CheckpointChoiceError`, raised there and in
`tasks.checkpoint_choice`) and a file that is not a usable checkpoint
(`sapiens.errors.CheckpointError`, which needs no torch)."""

from __future__ import annotations

from core.errors import SvfxError
from sapiens.errors import CheckpointError

__all__ = ["CheckpointChoiceError", "CheckpointError"]


class CheckpointChoiceError(SvfxError, ValueError):
    """No usable checkpoint for a pass; the message says what was looked for and found."""
