"""A frame's final arrays on their way from the model's device to the host.

On CUDA the copies run on a stream of their own (one per device, ``copy_stream``), so the
copy engine moves frame n to the host while the GPU computes frame n+1 on the compute stream:

1. the copy stream waits for what the compute stream has queued so far (the arrays' kernels);
2. each tensor is copied into page-locked (pinned) host memory with ``non_blocking=True`` on
   the copy stream, and marked as used there (``record_stream``), so the caching allocator
   does not hand its device memory to frame n+1 before the copy has read it;
3. an event recorded on the copy stream after the copies marks when they are done.

Nothing on the host waits here: whoever uses the arrays (a writer thread) waits for that
event, never the thread that feeds the GPU. Pinned blocks come from torch's caching host
allocator (the copy, made on the copy stream, is what it waits for before reusing a block), so
a worker reuses the same few blocks frame after frame. ``copy_started`` and ``copied`` are
timing events on the copy stream: ``tests/cuda`` reads them to show the copy of one frame runs
beside the compute of the next. On the CPU the tensors already are host memory: they are handed
over as they are (other accelerators copy, waiting).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

_STREAMS: dict[int, torch.cuda.Stream] = {}
_STREAMS_LOCK = threading.Lock()


def copy_stream(device: torch.device) -> torch.cuda.Stream:
    """The device's stream for copies to the host, made once per process."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _STREAMS_LOCK:
        stream = _STREAMS.get(index)
        if stream is None:
            stream = torch.cuda.Stream(device=index)
            _STREAMS[index] = stream
        return stream


class HostTransfer:
    def __init__(self, tensors: Mapping[str, Tensor]) -> None:
        self.copy_started: torch.cuda.Event | None = None
        self.copied: torch.cuda.Event | None = None
        cuda = [t.device for t in tensors.values() if t.device.type == "cuda"]
        if cuda:
            self._tensors = self._copy_from_cuda(tensors, cuda[0])
        else:  # the CPU (as they are) or another accelerator (copied, waiting for it)
            self._tensors = {name: tensor.detach().cpu() for name, tensor in tensors.items()}

    def _copy_from_cuda(self, tensors: Mapping[str, Tensor], device: torch.device):
        stream = copy_stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        self.copy_started = torch.cuda.Event(enable_timing=True)
        self.copied = torch.cuda.Event(enable_timing=True)
        host = {}
        with torch.cuda.stream(stream):
            self.copy_started.record(stream)
            for name, tensor in tensors.items():
                pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                pinned.copy_(tensor, non_blocking=True)
                if tensor.device.type == "cuda":
                    tensor.record_stream(stream)
                host[name] = pinned
            self.copied.record(stream)
        return host

    def wait(self) -> dict[str, np.ndarray]:
        """The arrays on the host (after the copies are done); numpy views of the tensors."""
        if self.copied is not None:
            self.copied.synchronize()
        return {name: tensor.numpy() for name, tensor in self._tensors.items()}
