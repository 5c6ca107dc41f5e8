"""The accuracy gate a reduced precision (bf16) is held to before a CPU worker runs in it.

``measure`` runs the gate's models (``tasks.gate_models``: toy models trained on synthetic
figures, not Sapiens) over its plates (``GATE_SEEDS`` of ``tasks.precision_gate_scene``, never
seen in training) twice on the same device, in fp32 and in the dtype under test, on the same
weights, through the code a worker runs: ``sapiens.loading.load_model``, the
``sapiens.predictor.Predictor`` and each pass's finishing (``tasks.frame_passes.finish_pass``:
unit normals in half, relative depth over the person, Cryptomatte ranks and labels, the parts'
sums), then pose's top-down crops, flip test and decoding (``Predictor.predict_pose``). It
compares what the files would hold, pass by pass, and ``LIMITS`` says how far the dtype under
test may be from fp32 (each bound with the reason for its value).

``gate_verdict`` is what a worker asks: whether the dtype holds on this machine. The figures
are measured once per machine kind (CPU model, its bf16 instructions, torch version, the
gate's weights) and kept in a ``JsonFileCache`` under ``$SVFX_HOME``; the verdict is made from
them against the limits given each time, so new limits need no new measurement. An entry that
is unreadable or malformed is measured again. What the gate costs: docs/performance/cpu-bf16.md.
"""

from __future__ import annotations

import hashlib
import math
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from sapiens.predictor import Predictor
from sapiens.seg_classes import SEG_CLASSES
from schemas.passes import BY_NAME, derived_from
from storage.cryptomatte import class_ids
from storage.previews import SHOWN_KEYPOINT_SCORE
from tasks.checkpoints.caches import JsonFileCache
from tasks.dtypes import dtype_word
from tasks.frame_passes import ID_SUFFIX, RANKS_SUFFIX, finish_pass
from tasks.gate_models import GATE_TASKS, WEIGHTS_DIR, gate_model_files, load_gate_models
from tasks.precision_gate_scene import GATE_SEEDS, GateScene, make_scene

# Bump when the plates, the metrics or what a cache entry holds change: older entries are then
# measured again. (New weights change the key by themselves: it holds their digest.)
GATE_REVISION = 1
# Under SVFX_HOME, or the file SVFX_PRECISION_GATE_CACHE names (the test suite shares one).
GATE_CACHE = JsonFileCache("precision-gate.json", path_env="SVFX_PRECISION_GATE_CACHE")
# The CPU flags that decide how torch runs bf16 (oneDNN's kernels): bf16 dot products
# (AVX512-BF16, Arm's BF16), AMX tiles, and the vector widths beneath them.
BF16_RELEVANT_FLAGS = frozenset(
    {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx_ne_convert", "amx_tile",
     "amx_bf16", "bf16", "sve", "sve2", "i8mm"}
)  # fmt: skip


@dataclass(frozen=True)
class Limit:
    """How far one figure of the dtype under test may be from fp32. ``worse``: "above" for an
    error (it fails above ``bound``), "below" for an agreement (it fails below)."""

    metric: str  # "<pass>.<figure>"
    label: str
    bound: float
    unit: str
    worse: Literal["above", "below"]
    why: str

    @property
    def pass_name(self) -> str:
        return self.metric.split(".", 1)[0]

    def holds(self, value: float) -> bool:
        """Whether ``value`` is within the bound (NaN never is)."""
        return value <= self.bound if self.worse == "above" else value >= self.bound


# The bounds, each with the reason for its value. They hold bf16 to what bf16 inference gives
# where it is done right (fp32 accumulation, as on CUDA, where the platform already runs bf16):
# rounding each activation to 8 significant bits costs a fraction of a percent per layer, a
# fraction of a degree or a percent at the output, and a wrong bf16 path (accumulating in bf16,
# or a broken kernel) costs far more. `python -m bench.precision` prints the figures beside
# these bounds.
LIMITS: tuple[Limit, ...] = (
    Limit("normal.angle_mean", "normal angle, mean", 1.0, "deg", "above",
          "relighting with normals 1 deg off on average is indistinguishable; a wrong bf16 "
          "path is off by degrees"),
    Limit("normal.angle_p99", "normal angle, p99", 5.0, "deg", "above",
          "silhouettes and creases turn fastest: a few degrees there, on 1% of pixels"),
    Limit("pointmap.relative_mean", "pointmap relative error, mean", 0.01, "", "above",
          "1% of the distance: 3 cm at 3 m, below what monocular depth resolves"),
    Limit("pointmap.relative_p99", "pointmap relative error, p99", 0.05, "", "above",
          "depth edges move a pixel's point between the person and the wall"),
    Limit("pointmap.focal_relative", "focal estimate relative error", 0.01, "", "above",
          "the focal turns every tile's normals; 1% of it is a fraction of a degree"),
    Limit("depth.error_mean", "relative depth error, mean", 0.02, "", "above",
          "2% of the person's depth span (0 nearest, 1 farthest): a few millimetres"),
    Limit("depth.error_p99", "relative depth error, p99", 0.08, "", "above",
          "the span is small, so the person's edge pixels move most"),
    Limit("albedo.error_mean", "albedo error, mean", 0.005, "", "above",
          "about one 8-bit code value (1/255 = 0.004) on average"),
    Limit("albedo.error_p99", "albedo error, p99", 0.03, "", "above",
          "colour edges: a few code values on 1% of pixels"),
    Limit("matte.error_mean", "matte error, mean", 0.005, "", "above",
          "about one 8-bit code value of alpha on average"),
    Limit("matte.error_p99", "matte error, p99", 0.05, "", "above",
          "the soft edge is where alpha changes fastest: 5% there, on 1% of pixels"),
    Limit("seg.agreement", "seg label agreement", 0.99, "", "below",
          "labels flip only where two classes are near a tie (part boundaries): 1% of pixels"),
    Limit("seg.coverage_mean", "Cryptomatte coverage error, mean", 0.005, "", "above",
          "a key's matte, on average about one 8-bit code value off"),
    Limit("seg.coverage_p99", "Cryptomatte coverage error, p99", 0.05, "", "above",
          "part boundaries, where a class's coverage falls from 1 to 0"),
    Limit("parts.error_mean", "part matte error, mean", 0.005, "", "above",
          "the same soft mattes as the Cryptomatte keys, summed by group"),
    Limit("parts.error_p99", "part matte error, p99", 0.05, "", "above",
          "the same soft mattes as the Cryptomatte keys, summed by group"),
    Limit("pose.distance_mean", "keypoint distance, mean", 0.5, "px", "above",
          "half a plate pixel on average: invisible on a tracked point"),
    Limit("pose.distance_p99", "keypoint distance, p99", 2.0, "px", "above",
          "a flat heatmap top lets a few keypoints slide by a pixel or two"),
)  # fmt: skip
METRICS: tuple[str, ...] = tuple(limit.metric for limit in LIMITS)


def with_bound(limits: Sequence[Limit], metric: str, bound: float) -> tuple[Limit, ...]:
    """``limits`` with one metric's bound replaced (tests, and trying a stricter gate)."""
    if metric not in {limit.metric for limit in limits}:
        raise KeyError(f"no limit on {metric!r}; known: {', '.join(METRICS)}")
    return tuple(replace(lim, bound=bound) if lim.metric == metric else lim for lim in limits)


@dataclass(frozen=True)
class GateVerdict:
    """Whether ``dtype`` holds the gate on this machine: ``reason`` is one line (the first
    failing metric with its value and bound, or that it held); ``figures`` are the measured
    metrics, ``seconds`` what measuring them took (when measured, not when cached)."""

    holds: bool
    reason: str
    dtype: str
    figures: Mapping[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False
    key: str = ""


def measure(
    device: torch.device, dtype: torch.dtype = torch.bfloat16, *, weights: Path = WEIGHTS_DIR
) -> dict[str, float]:
    """Every metric of ``LIMITS``: ``dtype`` against fp32 on the gate's weights and plates, on
    ``device``."""
    scenes = gate_scenes()
    with gate_model_files(weights) as files:
        fp32 = load_gate_models(files, device, torch.float32)
        reference = _outputs(fp32, torch.float32, scenes, device)
        tested = _outputs(load_gate_models(files, device, dtype), dtype, scenes, device)
    return compare(reference, tested)


@cache
def gate_scenes() -> tuple[GateScene, ...]:
    """The gate's plates (made once per process)."""
    return tuple(make_scene(seed) for seed in GATE_SEEDS)


def _outputs(
    models: Mapping[str, torch.nn.Module],
    dtype: torch.dtype,
    scenes: Sequence[GateScene],
    device: torch.device,
) -> dict[str, list]:
    """Every pass of every plate as a worker finishes it (brought to the host), and pose's
    keypoints and scores per plate."""
    predictor = Predictor(models, device=device, dtype=dtype, expected_tasks=GATE_TASKS)
    plates = torch.stack([scene.plate for scene in scenes]).to(device)
    out: dict[str, list] = {}
    with torch.inference_mode():
        for name in GATE_TASKS:
            spec = BY_NAME[name]
            if spec.inference == "per_person":
                continue
            values = predictor.predict_batch(plates, name)
            if name == "pointmap":
                out["pointmap.focal"] = [float(f) for f in values["focal"].cpu()]
            for i, scene in enumerate(scenes):
                person = (scene.alpha >= 0.5).to(device)
                for finished in (spec, *derived_from(name)):
                    arrays = finish_pass(
                        finished,
                        values[name][i],
                        plate_width=plates.shape[-1],
                        preview_hw=None,
                        class_names=SEG_CLASSES,
                        foreground=person,
                    )
                    for key, array in arrays.items():
                        if not key.startswith("nonfinite/"):
                            out.setdefault(key, []).append(array.cpu())
        for i, scene in enumerate(scenes):
            pose = predictor.predict_pose(plates[i], scene.box[None].numpy(), channels_first=True)
            out.setdefault("pose", []).append(torch.from_numpy(pose.keypoints[0]))
            out.setdefault("pose/scores", []).append(torch.from_numpy(pose.scores[0]))
    return out


def compare(reference: Mapping[str, list], tested: Mapping[str, list]) -> dict[str, float]:
    """The metrics of ``LIMITS`` from two runs' outputs (``_outputs``)."""

    def both(key: str) -> tuple[Tensor, Tensor]:
        a = torch.stack(list(reference[key])).double()
        b = torch.stack(list(tested[key])).double()
        return a, b

    figures: dict[str, float] = {}
    a, b = both("normal")  # (N, 3, H, W), in half as written: atan2 needs no unit length
    cross = torch.linalg.cross(a, b, dim=1).norm(dim=1)
    figures |= _mean_p99("normal.angle", torch.rad2deg(torch.atan2(cross, (a * b).sum(1))))
    a, b = both("pointmap")
    figures |= _mean_p99("pointmap.relative", (a - b).norm(dim=1) / a.norm(dim=1))
    fa = torch.tensor(reference["pointmap.focal"], dtype=torch.float64)
    fb = torch.tensor(tested["pointmap.focal"], dtype=torch.float64)
    figures["pointmap.focal_relative"] = float(((fa - fb).abs() / fa.abs()).max())
    a, b = both("depth")  # relative depth is -1 off the person in both: over the person only
    figures |= _mean_p99("depth.error", (a - b).abs()[a >= 0])
    for name in ("albedo", "matte", "parts"):
        a, b = both(name)
        figures |= _mean_p99(f"{name}.error", (a - b).abs())
    a, b = both("seg" + ID_SUFFIX)
    figures["seg.agreement"] = float((a == b).double().mean())
    a, b = both("seg" + RANKS_SUFFIX)
    figures |= _mean_p99(
        "seg.coverage", (_class_coverage(a) - _class_coverage(b)).abs().amax(dim=1)
    )
    a, b = both("pose")  # the keypoints fp32 is sure enough of to draw
    shown = torch.stack(list(reference["pose/scores"])) >= SHOWN_KEYPOINT_SCORE
    figures |= _mean_p99("pose.distance", (a - b).norm(dim=-1)[shown])
    missing = set(METRICS) - set(figures)
    assert not missing, f"metrics not measured: {sorted(missing)}"
    return {metric: figures[metric] for metric in METRICS}


def _mean_p99(name: str, values: Tensor) -> dict[str, float]:
    """``<name>_mean`` and ``<name>_p99`` of ``values`` (NaN when there are none)."""
    flat = values.reshape(-1).double()
    if flat.numel() == 0:
        return {f"{name}_mean": math.nan, f"{name}_p99": math.nan}
    return {f"{name}_mean": float(flat.mean()), f"{name}_p99": float(torch.quantile(flat, 0.99))}


def _class_coverage(planes: Tensor) -> Tensor:
    """(N, C, H, W) coverage of each class from Cryptomatte rank planes (N, 4 * layers, H, W):
    the coverages of the ranks whose ID is the class's ("no object", ID 0, counts nowhere)."""
    ids = torch.from_numpy(class_ids(SEG_CLASSES)).to(planes.dtype)
    known, order = torch.sort(ids)
    rank_ids, coverage = planes[:, 0::2], planes[:, 1::2]
    where = torch.searchsorted(known, rank_ids.contiguous()).clamp_max(len(known) - 1)
    found = known[where] == rank_ids
    covered = torch.zeros((planes.shape[0], len(ids), *planes.shape[2:]), dtype=planes.dtype)
    covered.scatter_add_(1, order[where], torch.where(found, coverage, 0.0))
    return covered


def check(figures: Mapping[str, float], limits: Sequence[Limit] = LIMITS) -> tuple[bool, str]:
    """Whether the figures are within ``limits`` and one line saying so, or naming the first
    that is not, with its value and bound."""
    for limit in limits:
        value = figures.get(limit.metric, math.nan)
        if not limit.holds(value):
            side = "above" if limit.worse == "above" else "below"
            return False, (
                f"{limit.label} {_show(value, limit.unit)} is {side} the limit "
                f"{_show(limit.bound, limit.unit)}"
            )
    passes = len({limit.pass_name for limit in limits})
    return True, f"within every limit ({len(limits)} metrics over {passes} passes)"


def _show(value: float, unit: str) -> str:
    text = f"{value:.3g}"
    return f"{text} {unit}" if unit else text


def gate_verdict(
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    *,
    limits: Sequence[Limit] = LIMITS,
    cache_file: JsonFileCache = GATE_CACHE,
) -> GateVerdict:
    """Whether ``dtype`` holds the gate on ``device``: its figures from the cache when this
    kind of machine measured them before, measured (and kept) otherwise."""
    name = dtype_word(dtype)
    if dtype == torch.float32:
        return GateVerdict(True, "fp32 is the reference", name)
    key = gate_key(device, dtype)
    entry = cache_file.get(key)
    figures = _cached_figures(entry)
    cached = figures is not None
    seconds = 0.0
    if figures is None:
        start = time.perf_counter()
        figures = measure(device, dtype)
        seconds = time.perf_counter() - start
        cache_file.put(key, {"figures": figures, "seconds": seconds})
    holds, reason = check(figures, limits)
    return GateVerdict(holds, f"{name}: {reason}", name, figures, seconds, cached, key)


def _cached_figures(entry: object) -> dict[str, float] | None:
    """The figures of a cache entry, or None when it is missing, malformed or incomplete."""
    if not isinstance(entry, dict) or not isinstance(entry.get("figures"), dict):
        return None
    figures = entry["figures"]
    if set(figures) != set(METRICS):
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in figures.values()):
        return None
    return {metric: float(figures[metric]) for metric in METRICS}


def gate_key(device: torch.device, dtype: torch.dtype) -> str:
    """What the figures depend on: the device kind (a CPU's model and bf16-relevant flags, a
    GPU's name), torch's version, the dtype, the gate's weights and its revision."""
    return "|".join(
        (
            device_identity(device),
            f"torch {torch.__version__}",
            dtype_word(dtype),
            f"weights {weights_digest()}",
            f"revision {GATE_REVISION}",
        )
    )


def device_identity(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda {torch.cuda.get_device_name(index)}"
    return cpu_identity()


@cache
def cpu_identity() -> str:
    """'<model name> [<bf16-relevant flags>]' of this machine's CPU (from /proc/cpuinfo on
    Linux; the platform's processor string elsewhere) and torch's CPU capability."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                field_name, _, value = line.partition(":")
                field_name = field_name.strip().lower()
                if field_name in ("model name", "cpu model") and value.strip():
                    name = value.strip()
                elif field_name in ("flags", "features"):
                    flags |= set(value.split())
                elif not line.strip() and flags:
                    break  # the first processor says it all
    except OSError:  # no /proc/cpuinfo (not Linux): the platform's name, no flags
        flags = set()
    relevant = " ".join(sorted(flags & BF16_RELEVANT_FLAGS))
    return f"{name} [{relevant}] {torch.backends.cpu.get_cpu_capability()}"


@cache
def weights_digest() -> str:
    """A short digest of the gate's weight files (names and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(WEIGHTS_DIR.glob("*.safetensors")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
