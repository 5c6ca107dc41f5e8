"""Models stay resident in each worker process: loaded once, keyed by checkpoint sha256.

A module-level cache in an importable module (stack-notes.md section 3.1): every chunk a
worker runs after the first finds its models already on the device.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping

import torch

from sapiens.loading import load_model
from sapiens.model import model_info
from sapiens.predictor import Predictor
from schemas.passes import model_task
from tasks.checkpoints.files import CheckpointRef
from tasks.compiled_models import compile_for_worker, compile_wanted
from tasks.node_threads import worker_torch_threads
from tasks.precision import PrecisionChoice, choose_precision

_LOCK = threading.Lock()
_MODELS: dict[tuple[str, str, str], torch.nn.Module] = {}
_PREDICTORS: dict[tuple, Predictor] = {}
# model key -> "compiled: why" or "not compiled: why", for provenance (`compile_note`)
_COMPILED: dict[tuple[str, str, str], str] = {}
log = logging.getLogger("svfx.worker")


def pick_device() -> torch.device:
    """The worker's accelerator: CUDA device 0 (dask-cuda gives each worker its own GPU as
    device 0), else the CPU. ``SVFX_DEVICE`` overrides."""
    explicit = os.environ.get("SVFX_DEVICE")
    if explicit:
        return torch.device(explicit)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def worker_precision(precision: str) -> PrecisionChoice:
    """What ``precision`` becomes on this worker's device, and why (``tasks.precision``;
    ``get_predictor`` asks after setting the worker's threads, so a gate it runs uses them)."""
    return choose_precision(precision, pick_device())


def get_predictor(
    checkpoints: Mapping[str, CheckpointRef],
    *,
    precision: str = "auto",
    batch_size: int = 4,
) -> tuple[Predictor, float]:
    """The predictor for these pass -> checkpoint choices, and the seconds spent loading now
    (0 when every model was already resident)."""
    _limit_threads()
    device = pick_device()
    dtype = worker_precision(precision).dtype
    key = (
        tuple(sorted((name, ref.sha256) for name, ref in checkpoints.items())),
        str(device),
        str(dtype),
        batch_size,
    )
    with _LOCK:
        cached = _PREDICTORS.get(key)
        if cached is not None:
            return cached, 0.0
        start = time.perf_counter()
        models = {}
        for name, ref in checkpoints.items():
            model_key = _model_key(ref, device, dtype)
            if model_key not in _MODELS:
                model = load_model(
                    ref.path, device, dtype, sha256=ref.sha256, expect_task=model_task(name)
                )
                label = f"{name} ({ref.sha256[:12]})"
                wanted, why = compile_wanted(device, model_info(model).input_hw)
                if wanted:
                    model = compile_for_worker(model, label)
                _COMPILED[model_key] = f"{'compiled' if wanted else 'not compiled'}: {why}"
                # once per model and process, at the precision line's level (always shown)
                log.warning("%s: %s", label, _COMPILED[model_key])
                _MODELS[model_key] = model
            models[name] = _MODELS[model_key]
        tasks = {name: model_task(name) for name in models}
        predictor = Predictor(
            models, device=device, dtype=dtype, batch_size=batch_size, expected_tasks=tasks
        )
        _PREDICTORS[key] = predictor
        return predictor, time.perf_counter() - start


def _model_key(
    ref: CheckpointRef, device: torch.device, dtype: torch.dtype
) -> tuple[str, str, str]:
    """A resident model's key in ``_MODELS`` and ``_COMPILED``: one per checkpoint, device and
    dtype."""
    return ref.sha256, str(device), str(dtype)


def compile_note(predictor: Predictor, checkpoints: Mapping[str, CheckpointRef]) -> str:
    """Which of the predictor's models this worker compiled, and why, for provenance:
    ``normal, seg: compiled: auto: ...; pose: not compiled: ...`` (empty for a predictor
    that did not come from `get_predictor`: benchmarks' stand-ins)."""
    by_note: dict[str, list[str]] = {}
    with _LOCK:
        for name, ref in checkpoints.items():
            key = _model_key(ref, predictor.device, predictor.dtype)
            if key not in _COMPILED or predictor.models.get(name) is not _MODELS.get(key):
                return ""  # not this worker's resident model
            by_note.setdefault(_COMPILED[key], []).append(name)
    return "; ".join(f"{', '.join(names)}: {note}" for note, names in by_note.items())


def _limit_threads() -> None:
    """A CPU worker runs its node plan's torch threads (`tasks.node_threads`: what the command
    that started it handed on, else the rule); a GPU worker only SVFX_TORCH_THREADS."""
    threads = worker_torch_threads(on_cpu=pick_device().type == "cpu")
    if threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def resident_models() -> list[str]:
    """sha256 prefixes of the models resident in this process (for tests and status)."""
    with _LOCK:
        return sorted({sha[:12] for sha, _device, _dtype in _MODELS})
