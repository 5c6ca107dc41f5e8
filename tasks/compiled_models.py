"""``torch.compile`` on a worker: whether it compiles a model, where its compiled code is kept,
and never a crash because of it.

``SVFX_COMPILE`` unset (or ``auto``): a CPU worker compiles each model whose input is a real
model's (at least 1024x768 pixels; the tiny stand-ins run eagerly) when the node has a C++
compiler; a GPU worker does not (not yet measured through the flow).
``1`` compiles every model, ``0`` none. On a CPU a model then sees one input shape only (one
input per call: ``sapiens.predictor.sub_batch``), so it compiles once. Measured on a 2-core
Xeon with AMX, bf16: a 1080p shot of every pass at Sapiens2-0.1b through the flow in 261.9 s
against 366.4 eager (1.40x), after 108 s of compiling six models cold in each worker
(``python -m bench.shot --frames 4 --chunk-frames 2 --model-size 0.1b --compile``); the 1b
backbone 9.35 against 12.65 s per image (``python -m bench.model --sizes 1b --compile``).

Compiled code is kept under ``$SVFX_HOME/compile-cache/torch-<version>`` (torch's default,
a folder under /tmp, when SVFX_HOME is unset), so a worker's later processes, and the next
shot's, load it instead of compiling again, and a cache made by another torch version is
never read. A cache of ours that fails to load (corrupt, half-written) is deleted and the
code compiled again, once (one the user chose with TORCHINDUCTOR_CACHE_DIR is left alone); a
part that still does not compile (no C++ compiler on the node) runs eagerly, and the
worker's log says why (``sapiens.torch_compile``).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch

from sapiens.model import SapiensModel
from sapiens.predictor import CPU_PIXELS_PER_CALL
from sapiens.torch_compile import compile_model

COMPILE_ENV = "SVFX_COMPILE"
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # torch's own name for where inductor keeps code
log = logging.getLogger("svfx.worker")


ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def compile_wanted(device: torch.device, input_hw: tuple[int, int]) -> tuple[bool, str]:
    """Whether this worker compiles a model of ``input_hw`` on ``device``, and why."""
    value = os.environ.get(COMPILE_ENV, "auto").strip().lower()
    if value in ON:
        return True, f"{COMPILE_ENV}={value}"
    if value in OFF:
        return False, f"{COMPILE_ENV}={value}"
    if value not in ("", "auto"):
        return False, f"{COMPILE_ENV}={value!r} is not 1, 0 or auto"
    if device.type != "cpu":
        return False, f"auto: compiling is chosen on CPU workers only ({COMPILE_ENV}=1 forces it)"
    if input_hw[0] * input_hw[1] < CPU_PIXELS_PER_CALL:  # a stand-in's input
        return False, f"auto: a {input_hw[1]}x{input_hw[0]} (w x h) stand-in runs eagerly"
    compiler = cpp_compiler()
    if compiler is None:
        return False, "auto: no C++ compiler on this node (g++, c++ or clang++, or CXX)"
    return True, f"auto: a CPU worker, {compiler} found"


def cpp_compiler() -> str | None:
    """The C++ compiler inductor's CPU backend would use, when the node has one."""
    named = os.environ.get("CXX")
    for candidate in ([named] if named else []) + ["g++", "c++", "clang++"]:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def compile_cache_dir() -> Path | None:
    home = os.environ.get("SVFX_HOME")
    if not home:
        return None
    return Path(home) / "compile-cache" / f"torch-{torch.__version__}"


def compile_for_worker(model: SapiensModel, label: str) -> SapiensModel:
    """``model`` compiled in place, its cache under SVFX_HOME, guarded as above."""
    cache = compile_cache_dir()
    if cache is not None and CACHE_ENV not in os.environ:
        cache.mkdir(parents=True, exist_ok=True)
        os.environ[CACHE_ENV] = str(cache)

    def heal() -> None:
        if cache is None or os.environ.get(CACHE_ENV) != str(cache):
            log.warning("%s: compiled code failed to load; compiling again", label)
            return  # a cache the user chose is theirs to clear
        log.warning("%s: compiled code failed to load; clearing %s, compiling again", label, cache)
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True, exist_ok=True)

    def on_eager(reason: str) -> None:
        log.warning("%s: runs uncompiled (torch.compile failed twice): %s", label, reason)

    return compile_model(model, heal=heal, on_eager=on_eager)
