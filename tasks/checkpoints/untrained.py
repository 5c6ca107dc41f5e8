"""The small untrained models: random weights of a size, task and family, built once with a
fixed seed and saved, so a run without checkpoints goes through the same loading code as one
with them and every output can name its weights by sha256."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sapiens.arch import NATIVE_INPUT_HW
from sapiens.v1_arch import FAMILY as SAPIENS1

from .families import SAPIENS2, wanted_arch
from .files import CheckpointRef, describe_checkpoint

UNTRAINED_SEED = 20260401  # fixed: every untrained model's bytes, so its sha256, follow it
# The tiny test size is built with a small native input so a CPU run of it stays quick.
UNTRAINED_INPUT_HW = {"sapiens2_tiny": (256, 192), "sapiens1_tiny": (256, 192)}

_BUILD_LOCK = threading.Lock()


def untrained_checkpoint(
    model_size: str, task: str, directory: str | os.PathLike[str], family: str = SAPIENS2
) -> CheckpointRef:
    """A random-weight model of this size, task and family, built once (fixed seed), saved.

    Built under a file lock next to it, so submits started together build it once: the others
    wait, then take the file as it is. A file already there is never rewritten (another
    process may have chosen it and be checking its sha256). Its bytes are the same whichever
    process builds it (`sapiens.loading.save_model`), so a lost home rebuilds the same files."""
    arch = wanted_arch(model_size, family)
    path = Path(directory) / f"{arch}_{task}_UNTRAINED.safetensors"
    if path.is_file():  # the common case, and no lock to create in a read-only folder
        return describe_checkpoint(path)
    from filelock import FileLock

    from sapiens.loading import save_model  # torch: only to build one
    from sapiens.model import build_model

    path.parent.mkdir(parents=True, exist_ok=True)
    with _BUILD_LOCK, FileLock(path.with_name(f"{path.name}.lock")):
        if not path.is_file():  # built while this process waited for the lock
            input_hw = UNTRAINED_INPUT_HW.get(arch, NATIVE_INPUT_HW)
            name = arch if family == SAPIENS1 else model_size
            model = build_model(name, task, seed=UNTRAINED_SEED, input_hw=input_hw)
            temp = path.with_suffix(f".{os.getpid()}.building")
            save_model(model, temp, trained=False)
            os.replace(temp, path)  # atomic: a concurrent reader never sees half a file
    return describe_checkpoint(path)
