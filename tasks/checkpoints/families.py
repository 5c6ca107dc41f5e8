"""The two model families, their sizes, and which family has each pass.

Sapiens2, and Sapiens v1 (files made by `svfx models convert`), told apart by their tensors
(`tasks.checkpoints.files`). A pass both have (normal, seg, pose) runs on the family the job
asks for (`--family`, Sapiens2 by default); a pass only one has runs on that one: relative
depth on v1, pointmap, albedo and matte on Sapiens2 (`schemas.passes.family_of`).
"""

from __future__ import annotations

from sapiens.arch import canonical_arch
from sapiens.v1_arch import FAMILY as SAPIENS1
from sapiens.v1_arch import canonical_v1
from schemas.passes import PASSES, families_of, model_task

AUTO_SIZE = "auto"
SAPIENS2 = "sapiens2"
# The sizes `auto` may pick, smallest first; it takes the largest that covers every pass.
# The 4K variant (1b-4k) is left out: it tiles differently (whole 4K frames, padded to 64 px)
# and costs far more per frame, so it runs only when asked (--model-size or SVFX_MODEL_SIZE).
AUTO_SIZE_ORDER = ("tiny", "0.1b", "0.4b", "0.8b", "1b", "5b")
KNOWN_SIZES = (*AUTO_SIZE_ORDER, "1b-4k")
# Sapiens v1's sizes ("tiny": the untrained stand-in; the others are released).
V1_AUTO_SIZE_ORDER = ("tiny", "0.3b", "0.6b", "1b", "2b")
SIZE_ORDER = {SAPIENS2: AUTO_SIZE_ORDER, SAPIENS1: V1_AUTO_SIZE_ORDER}
FAMILY_SIZES = {SAPIENS2: KNOWN_SIZES, SAPIENS1: V1_AUTO_SIZE_ORDER}
FAMILY_NAMES = {SAPIENS2: "Sapiens2", SAPIENS1: "Sapiens v1"}
# Each pass with a model of its own: the families that have it, and its checkpoint task.
PASS_FAMILIES = {p.name: families_of(p.name) for p in PASSES if p.models}
PASS_TASKS = {name: model_task(name) for name in PASS_FAMILIES}


def wanted_arch(model_size: str, family: str = SAPIENS2) -> str:
    """The arch name of a --model-size in a family: '1b' -> 'sapiens2_1b' or 'sapiens_1b'."""
    if family == SAPIENS1:
        return canonical_v1(model_size)
    name, tokenizer = canonical_arch(model_size)
    return f"{name}_4k" if tokenizer else name


def size_label(arch: str) -> str:
    """The --model-size spelling of an arch: 'sapiens2_1b_4k' -> '1b-4k'; v1 ones too,
    without their family ('sapiens_0.3b' -> '0.3b'; `CheckpointRef.family` tells which)."""
    for prefix in ("sapiens2_", "sapiens1_", "sapiens_"):
        if arch.startswith(prefix):
            return arch.removeprefix(prefix).replace("_4k", "-4k")
    return arch.replace("_4k", "-4k")
