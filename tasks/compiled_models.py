"""``torch.compile`` on a worker (``SVFX_COMPILE=1``): where its compiled code is kept, and
never a crash because of it.

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
from sapiens.torch_compile import compile_model

COMPILE_ENV = "SVFX_COMPILE"
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # torch's own name for where inductor keeps code
log = logging.getLogger("svfx.worker")


def compile_wanted() -> bool:
    """Whether this worker compiles its models (``SVFX_COMPILE=1``; off by default)."""
    return os.environ.get(COMPILE_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


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
