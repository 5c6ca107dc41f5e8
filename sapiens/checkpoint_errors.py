"""Old home of `CheckpointError`, now defined in `sapiens.errors`; kept only until `flows/`
imports it from there."""

from __future__ import annotations

from .errors import CheckpointError

__all__ = ["CheckpointError"]
