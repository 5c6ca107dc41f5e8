"""Errors raised while reading checkpoints: each names the file and, where known, the tensor."""

from __future__ import annotations


class CheckpointError(ValueError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")
