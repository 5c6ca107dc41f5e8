"""A stand-in accelerator for measuring the flow on a CPU: the chunk worker's model stage
takes a known time and leaves the CPU free, so the host's work (reading, colour, encoding,
writing, the flow) is real and the device's busy time is known exactly.

On a GPU the model stage's work (upload, tiles, networks, blending, finishing) is the
device's; the host only queues it. On a CPU that work would run on the host's cores and
swamp everything else, so ``SleepInference`` stands in for ``tasks.frame_inference.
FrameInference`` as a GPU would run it: the first group of a frame size runs the real stage
once, with ``CountingNetwork`` stand-ins of a real model size's input (a 1B's 1024x768, so
a frame is tiled as for that model; realistic outputs, ``bench.standins.StandInNetwork``'s),
which counts the model inputs a frame takes and keeps the finished arrays; every later group
sleeps ``seconds_per_input`` per input of its frames, the GIL released as a GPU's host thread
is while the device works, and hands those arrays to the writers. Every sleep's (start, end)
is logged on ``monotonic`` (one clock for every process of the machine), and so is each
chunk's start: the device's busy share and where its idle time falls come from them.

``SleepDevice`` is the Dask worker plugin the bench registers to put it into a cluster's
workers: it replaces ``get_predictor`` and ``FrameInference`` in ``tasks.chunk_worker`` of
the worker process (the flow's own code runs unchanged otherwise). Product code has no seam
for it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

H100_1B_S_PER_INPUT = 0.26 / 8  # Sapiens2-1B at batch 8 on one H100: 30.8 images/s

_LOCK = threading.Lock()
CALLS: list[tuple[float, float]] = []  # (start, end) of each group's sleep, monotonic seconds
CHUNKS: list[float] = []  # when each chunk asked for its predictor
_PREDICTORS: dict[tuple[str, ...], Any] = {}
_FINISHED: dict[tuple, tuple[dict[str, torch.Tensor], float | None, int]] = {}


class CountingNetwork(nn.Module):
    """A ``task`` network of ``arch``'s input size: realistic outputs, made once per input
    shape; counts the inputs it is called on."""

    def __init__(self, task: str, arch: str) -> None:
        super().__init__()
        from bench.standins import StandInNetwork
        from sapiens.model import build_model

        self.info = build_model(arch, task, device="meta").info
        self.content = StandInNetwork(task, "realistic")
        self.inputs = 0
        self._outputs: dict[tuple[int, ...], Any] = {}

    def forward(self, x: torch.Tensor) -> Any:
        key = tuple(x.shape)
        if key not in self._outputs:
            self._outputs[key] = self.content(x)
        self.inputs += x.shape[0]
        return self._outputs[key]


def sleep_predictor(passes: Sequence[str], arch: str) -> Any:
    """A predictor of ``CountingNetwork`` per pass, on the CPU in fp32 (one per passes)."""
    from sapiens.predictor import Predictor
    from schemas.passes import model_task

    key = (*passes, arch)
    with _LOCK:
        if key not in _PREDICTORS:
            models = {name: CountingNetwork(model_task(name), arch) for name in passes}
            _PREDICTORS[key] = Predictor(models, device="cpu", dtype=torch.float32)
        return _PREDICTORS[key]


def sleep_inference(seconds_per_input: float) -> type:
    """A ``FrameInference`` stand-in class whose device takes ``seconds_per_input``."""
    from tasks.frame_inference import FrameInference, InferredFrame
    from tasks.host_transfer import HostTransfer

    class SleepInference(FrameInference):
        def run(self, group: Sequence[Any]) -> list[Any]:
            key = (group[0].rgb.shape, tuple(self.spec.model_passes), id(self.predictor))
            if key not in _FINISHED:  # the real stage once, on one frame
                models = self.predictor.models.values()
                before = sum(m.inputs for m in models)
                (frame,) = super().run(group[:1])
                inputs = sum(m.inputs for m in models) - before
                arrays = {k: torch.from_numpy(v) for k, v in frame.arrays.wait().items()}
                _FINISHED[key] = (arrays, frame.focal, inputs)
            arrays, focal, inputs = _FINISHED[key]
            with self.predictor.timer.measure():
                began = time.monotonic()
                time.sleep(seconds_per_input * inputs * len(group))
                with _LOCK:
                    CALLS.append((began, time.monotonic()))
            for read in group:
                read.summary.timings["infer"] = seconds_per_input * inputs
            return [InferredFrame(read, HostTransfer(arrays), [], focal) for read in group]

    return SleepInference


def log_chunk_start() -> None:
    with _LOCK:
        CHUNKS.append(time.monotonic())


def take_log() -> dict[str, list]:
    """This process's calls and chunk starts so far, and the log emptied."""
    with _LOCK:
        out = {"calls": list(CALLS), "chunks": list(CHUNKS)}
        CALLS.clear()
        CHUNKS.clear()
    return out


try:
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError:  # the in-process run needs no Dask
    WorkerPlugin = object  # type: ignore[assignment,misc]


class SleepDevice(WorkerPlugin):
    """Puts ``sleep_predictor`` and ``sleep_inference`` in place of the resident models and
    the model stage of every chunk the worker runs, and sizes OpenEXR's pool as a GPU
    worker's (every core), not by a CPU worker's plan."""

    name = "svfx-bench-sleep-device"

    def __init__(self, arch: str, seconds_per_input: float) -> None:
        self.arch = arch
        self.seconds_per_input = seconds_per_input

    def setup(self, worker: Any) -> None:
        import tasks.chunk_worker as chunk_worker

        chunk_worker.size_encoder_threads(on_cpu=False)  # once per process: the first size holds
        arch = self.arch

        def get_predictor(
            checkpoints: Mapping[str, Any], *, precision: str = "auto", batch_size: int = 4
        ) -> tuple[Any, float]:
            log_chunk_start()
            return sleep_predictor(tuple(checkpoints), arch), 0.0

        chunk_worker.get_predictor = get_predictor
        chunk_worker.FrameInference = sleep_inference(self.seconds_per_input)


def busy_figures(log: dict[str, list], start: float, end: float) -> dict[str, float]:
    """The device's busy share of [start, end], and its idle seconds by where they fall: before
    the first call, in gaps with a chunk start in them (a chunk's tail, the flow between chunks,
    the next chunk's setup and first reads), in other gaps (within a chunk), after the last call
    (the last chunk's tail and the flow's finishing work)."""
    calls = sorted((max(a, start), min(b, end)) for a, b in log["calls"] if b > start and a < end)
    chunks = sorted(log["chunks"])
    busy = sum(b - a for a, b in calls)
    wall = end - start
    out = {"wall_s": wall, "busy_s": busy, "busy_share": busy / wall if wall else 0.0}
    if not calls:
        return out
    between = within = 0.0
    for (_, previous_end), (next_start, _) in itertools.pairwise(calls):
        gap = max(0.0, next_start - previous_end)
        if any(previous_end <= c <= next_start for c in chunks):
            between += gap
        else:
            within += gap
    out.update(
        idle_before_first_s=calls[0][0] - start,
        idle_at_chunk_boundaries_s=between,
        idle_within_chunks_s=within,
        idle_after_last_s=end - calls[-1][1],
        chunks=len([c for c in chunks if start <= c <= end]),
    )
    return out
