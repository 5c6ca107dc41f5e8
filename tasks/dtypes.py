"""The ``--precision`` words and the torch dtypes they name (``tasks.precision`` chooses
among them; the accuracy gate and the benchmarks name them)."""

from __future__ import annotations

import torch

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_word(dtype: torch.dtype) -> str:
    """The ``--precision`` word for ``dtype`` (bf16, fp32, fp16), else torch's own name."""
    words = {value: word for word, value in PRECISIONS.items()}
    return words.get(dtype, str(dtype).removeprefix("torch."))
