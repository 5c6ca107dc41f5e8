"""Checks that need a CUDA device (``pytest -m cuda tests/cuda``); skipped, with the reason,
elsewhere. They import only torch, numpy, safetensors and the platform's readers and writers,
so they run on a GPU node from the GPU kit (``python -m bench.gpu_kit``)."""

from __future__ import annotations

import pytest
import torch

if torch.cuda.is_available():
    _REASON = ""
elif torch.version.cuda is None:
    _REASON = f"no CUDA device: torch {torch.__version__} is a CPU-only build"
else:
    _REASON = f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none"

CUDA = [pytest.mark.cuda, pytest.mark.skipif(bool(_REASON), reason=_REASON)]
