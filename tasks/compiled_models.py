"""``torch.compile`` on a worker: whether it compiles a model, where its compiled code is kept,
and never a crash because of it.

``SVFX_COMPILE`` unset (or ``auto``): a worker compiles each model whose input is a real
model's (at least 1024x768 pixels; the tiny stand-ins run eagerly) where the node can build
compiled code: a CPU worker with a C++ compiler, a CUDA worker with Triton and the C compiler
Triton builds its launchers with; other devices run eagerly. ``1`` compiles every model,
``0`` none. A compiled model sees one input shape per pass: the predictor pads every call to
its sub-batch size, one input on a CPU (``sapiens.predictor.sub_batch``), the batch size on
a GPU, or the halved size that fitted after an out-of-memory; so it compiles once per pass.
What it gains, on CPUs and GPUs: docs/performance/cpu-bf16.md and docs/performance/gpu.md.

Compiled code is kept under ``$SVFX_HOME/compile-cache/torch-<version>`` (torch's default,
a folder under /tmp, when SVFX_HOME is unset): inductor's FX graph cache, the AOT autograd
cache and Triton's kernels, all under ``TORCHINDUCTOR_CACHE_DIR``. A worker's later
processes, its neighbours on the node, and the next shot's load it instead of compiling again
(dynamo still traces each process's models, seconds), and a cache made by another torch
version is never read. A cache of ours that fails to load (corrupt, half-written) is deleted
and the code compiled again, once (one the user chose with TORCHINDUCTOR_CACHE_DIR is left
alone); a part that still does not compile runs eagerly, and the worker's log says why
(``sapiens.torch_compile``).
"""

from __future__ import annotations

import importlib.util
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
    if device.type not in ("cpu", "cuda"):
        return False, f"auto: {device.type} workers run eagerly ({COMPILE_ENV}=1 forces compiling)"
    if input_hw[0] * input_hw[1] < CPU_PIXELS_PER_CALL:  # a stand-in's input
        return False, f"auto: a {input_hw[1]}x{input_hw[0]} (w x h) stand-in runs eagerly"
    if device.type == "cuda":
        return gpu_compile_possible()
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


def gpu_compile_possible() -> tuple[bool, str]:
    """Whether inductor can build CUDA code on this node: Triton installed, and the C compiler
    Triton builds each kernel's launcher with (its own lookup: CC, else gcc, else clang)."""
    if importlib.util.find_spec("triton") is None:
        return False, "auto: Triton is not installed (torch's CUDA wheels bring it)"
    named = os.environ.get("CC")
    compiler = shutil.which(named) if named else shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return False, "auto: no C compiler for Triton on this node (gcc or clang, or CC)"
    return True, f"auto: a CUDA worker, Triton and {compiler} found"


def compile_cache_dir() -> Path | None:
    home = os.environ.get("SVFX_HOME")
    if not home:
        return None
    return Path(home) / "compile-cache" / f"torch-{torch.__version__}"


def users_cache_dir() -> str | None:
    """The compiled-code folder the user chose with TORCHINDUCTOR_CACHE_DIR, if any. Importing
    dynamo writes torch's default (a folder under /tmp) into that variable, which is no
    choice: it is told apart by its value."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    value = os.environ.get(CACHE_ENV)
    if not value or os.path.abspath(value) == os.path.abspath(default_cache_dir()):
        return None
    return value


def compile_for_worker(model: SapiensModel, label: str) -> SapiensModel:
    """``model`` compiled in place, its cache under SVFX_HOME, guarded as above."""
    cache = compile_cache_dir()
    if cache is not None and users_cache_dir() is None:
        cache.mkdir(parents=True, exist_ok=True)
        os.environ[CACHE_ENV] = str(cache)
    keep_compiled_code()

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


def keep_compiled_code() -> None:
    """Inductor's FX graph cache and the AOT autograd cache on (their environment switches,
    TORCHINDUCTOR_FX_GRAPH_CACHE and TORCHINDUCTOR_AUTOGRAD_CACHE, still win): without them a
    new process compiles every graph again even with the cache folder in place."""
    import torch._functorch.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True
