"""Every exception class of `sapiens`, in one module that imports nothing but `core.errors`, so
that code which only needs to recognise them (the CLI's refusals, the flow process) does not
import torch."""

from __future__ import annotations

from core.errors import SvfxError


class CheckpointError(SvfxError, ValueError):
    """A checkpoint that cannot be used; the message names the file and, where known, the
    tensor."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


WRAPPER_PREFIXES = ("module.", "model.", "state_dict.", "ema.")


def refuse_wrapped_keys(path: str, keys: list[str], layout: str) -> None:
    """CheckpointError when every key carries one training wrapper's prefix (a whole training
    state saved instead of the state dict); ``layout`` says what the keys should read."""
    for wrapper in WRAPPER_PREFIXES:
        if keys and all(k.startswith(wrapper) for k in keys):
            raise CheckpointError(path, f"every key starts with {wrapper!r}: {layout}")


class InputError(ValueError):
    """An input batch the network cannot take (wrong shape, too small, NaN/Inf)."""


class NotSafetensors(Exception):
    """The bytes do not parse as a safetensors header; `reason` says what was wrong.

    Never leaves `sapiens`: `read_tensor_index` turns it into a CheckpointError that says what
    the file is instead."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DeviceMemoryError(SvfxError, RuntimeError):
    """The model did not fit in the device's memory even one input at a time; the message
    names the pass and the input size (a frame's problem: the worker goes on)."""
