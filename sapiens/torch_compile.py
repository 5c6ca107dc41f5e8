"""Opt-in `torch.compile` of the parts that pay for it: the transformer blocks (compiled per
block so MHSA and GQA blocks share compiled code across depth) and the head.

Compiling can fail where running cannot: no C++ compiler on a CPU node, a compiled-code
cache left corrupt by a killed process or a full disk (torch then fails to load the cached
library, every time). Each compiled part is guarded: on a compiler failure ``heal`` is called
(the caller clears the cache it points torch at) and the part is compiled afresh once; if
that fails too, the part runs eagerly from then on and ``on_eager`` is told why. A failure of
the computation itself (bad input, out of memory) is not a compiler failure and is raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .backbone import Sapiens2Backbone
from .model import SapiensModel, SapiensTaskModel
from .v1_backbone import SapiensV1Backbone

COMPILER_FAILURES: tuple[type[BaseException], ...] = (torch._dynamo.exc.TorchDynamoException,)
# What dynamo raises when the computation itself fails while it traces (a shape mismatch):
# the module's own error, which running it eagerly raises as itself.
COMPUTATION_FAILURES: tuple[type[BaseException], ...] = (torch._dynamo.exc.TorchRuntimeError,)


def compile_model(
    model: SapiensModel,
    mode: str | None = None,
    *,
    heal: Callable[[], None] | None = None,
    on_eager: Callable[[str], None] | None = None,
) -> SapiensModel:
    """Compile ``model``'s blocks and head in place (see the module's docstring)."""
    compile_modules(compiled_parts(model), mode, heal=heal, on_eager=on_eager)
    return model


def compile_modules(
    parts: list[nn.Module],
    mode: str | None = None,
    *,
    heal: Callable[[], None] | None = None,
    on_eager: Callable[[str], None] | None = None,
) -> None:
    """Compile each module in place, guarded when ``heal`` or ``on_eager`` is given."""
    for part in parts:
        part.compile(mode=mode, dynamic=False)
        if heal is not None or on_eager is not None:
            _guard(part, mode, heal, on_eager)


def compiled_parts(model: SapiensModel) -> list[nn.Module]:
    backbone = model.backbone if isinstance(model, SapiensTaskModel) else model
    if isinstance(backbone, SapiensV1Backbone):
        parts: list[nn.Module] = list(backbone.layers)  # v1: one block shape across depth
    else:
        assert isinstance(backbone, Sapiens2Backbone)
        parts = list(backbone.blocks)
        if backbone.tokenizer is not None:
            parts += list(backbone.tokenizer.blocks)
    if isinstance(model, SapiensTaskModel):
        parts.append(model.head_module)
    return parts


def _guard(
    part: nn.Module,
    mode: str | None,
    heal: Callable[[], None] | None,
    on_eager: Callable[[str], None] | None,
) -> None:
    lock = threading.Lock()
    state: dict[str, Any] = {"compiled": part._compiled_call_impl, "healed": False}

    def attempt(args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """(True, the output), or (False, the compiler's failure)."""
        try:
            return True, state["compiled"](*args, **kwargs)
        except COMPUTATION_FAILURES:
            return True, part._call_impl(*args, **kwargs)
        except COMPILER_FAILURES as exc:
            return False, exc

    def call(*args: Any, **kwargs: Any) -> Any:
        ran, out = attempt(args, kwargs)
        if ran:
            return out
        with lock:
            if not state["healed"]:
                state["healed"] = True
                if heal is not None:
                    heal()
                torch._dynamo.reset()
                state["compiled"] = torch.compile(part._call_impl, mode=mode, dynamic=False)
                ran, out = attempt(args, kwargs)
                if ran:
                    return out
            part._compiled_call_impl = None  # eager from now on
        if on_eager is not None:
            on_eager(_first_line(out))
        return part._call_impl(*args, **kwargs)

    part._compiled_call_impl = call


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
