"""The error of choosing checkpoints, in a module of its own so that code which only needs to
recognise it (the CLI's refusals) does not import torch through `tasks.checkpoints`."""

from __future__ import annotations


class CheckpointChoiceError(ValueError):
    """No usable checkpoint for a pass; the message says what was looked for and found."""
