"""A frame's final arrays on their way from the model's device to the host.

On CUDA the copies start at once, without waiting: each tensor is copied into page-locked
(pinned) host memory with ``non_blocking=True``, which lets the copy engine run while the GPU
goes on with the next frame, and an event recorded after the copies marks when they are done.
Whoever uses the arrays (a writer thread) waits for that event, never the thread that feeds
the GPU. Pinned blocks come from torch's caching host allocator, so a worker reuses the same
few blocks frame after frame (at most the frames in flight between the model and the
writers). On the CPU the tensors already are host memory: they are handed over as they are
(other accelerators copy, waiting).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor


class HostTransfer:
    def __init__(self, tensors: Mapping[str, Tensor]) -> None:
        self._event: torch.cuda.Event | None = None
        if any(t.device.type == "cuda" for t in tensors.values()):
            host = {}
            for name, tensor in tensors.items():
                pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                pinned.copy_(tensor, non_blocking=True)
                host[name] = pinned
            self._event = torch.cuda.Event()
            self._event.record()
            self._tensors = host
        else:  # the CPU (as they are) or another accelerator (copied, waiting for it)
            self._tensors = {name: tensor.detach().cpu() for name, tensor in tensors.items()}

    def wait(self) -> dict[str, np.ndarray]:
        """The arrays on the host (after the copies are done); numpy views of the tensors."""
        if self._event is not None:
            self._event.synchronize()
        return {name: tensor.numpy() for name, tensor in self._tensors.items()}
