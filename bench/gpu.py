"""Every GPU figure docs/performance/gpu.md lists, in one command, each with the name
of the device it was measured on (weights are random, UNTRAINED: speed does not depend on
them). Sections, in the order they run (the most wanted first, so a run cut short still
brings those back):

    model      Sapiens2-1B at 1024x768: bf16 batch 8 images/s, TFLOP/s (FLOPs counted by
               torch on the meta device) and the share of the device's dense bf16 peak,
               against the upstream way (fp32, batch 1, straightforward maths) on the same GPU
    4k         Sapiens2-1B-4K at 4096x3072 (the 4K tokenizer): frames/s and peak memory
    attention  what each SDPA kernel (flash, memory-efficient, cuDNN, plain maths) gives
    graphs     CUDA graphs (capture once, replay) against eager launches, batch 1 and 8
    shot       a 48-frame 4096x2160 shot through the real worker stages (``bench.io``'s
               worker: reader thread, device stage, writer pool; every dense pass) with five
               1B models: frames/s, the models' share of wall time, host core-s per frame
    temporal   temporal stabilisation of every dense pass (``bench.temporal``'s synthetic
               shot, 8 frames of 4096x2160, no pose): host core-s and wall s per frame, flow
               on the host, warps and fusion on the device
    compile    ``torch.compile`` of the blocks and head (``sapiens.torch_compile``): compile
               time and images/s against eager

The process runs with the glibc allocator settings of the platform's workers, as ``bench.io``
does (``--default-allocator`` to leave them). Each section's figures are printed as they come
and written after each section to ``OUT/gpu.json`` and ``OUT/gpu.md`` (default
``bench/results/gpu``); a section that fails is recorded with its error and the next one
runs. Every section but ``shot`` and ``temporal`` needs only torch, numpy and safetensors;
``shot`` needs the platform's readers and writers, ``temporal`` OpenCV and the platform's
modules (the GPU kit, ``python -m bench.gpu_kit``).

    python -m bench.gpu                          # everything (6.3 minutes on an H100, and
                                                 # 75 s for the temporal section)
    python -m bench.gpu --smoke                  # small sizes, few frames: a quick check
    python -m bench.gpu --sections model,4k --out /tmp/gpu
    python -m bench.gpu --device cpu --smoke     # the script itself, on a machine without GPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import torch

from bench.common import as_a_worker_runs
from schemas.passes import model_task

SECTIONS = ("model", "4k", "attention", "graphs", "shot", "temporal", "compile")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu"
SHOT_PASSES = ("normal", "pointmap", "albedo", "matte", "seg")


@dataclass(frozen=True)
class Sizes:
    """What a run measures: the full figures, or small stand-ins of them (``--smoke``)."""

    arch: str  # the model figures' size
    hw: tuple[int, int]
    batch: int
    arch_4k: str
    hw_4k: tuple[int, int]
    shot_arch: str
    shot_frames: int
    shot_hw: tuple[int, int]  # (height, width)
    temporal_frames: int
    temporal_hw: tuple[int, int]  # (height, width)
    repeats: int
    warmup: int


FULL = Sizes("1b", (1024, 768), 8, "1b-4k", (4096, 3072), "1b", 48, (2160, 4096), 8,
             (2160, 4096), 5, 2)  # fmt: skip
SMOKE = Sizes("tiny", (256, 192), 2, "tiny-4k", (512, 384), "tiny", 3, (270, 480), 4, (270, 1280),
              2, 1)  # fmt: skip


@dataclass
class Figure:
    section: str
    what: str
    value: float | str | None
    unit: str = ""
    note: str = ""


@dataclass
class Report:
    """The figures so far, written to JSON and markdown after every section."""

    out: Path
    device: dict[str, Any]
    smoke: bool
    command: str = "python -m bench.gpu"
    figures: list[Figure] = field(default_factory=list)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, section: str, what: str, value: Any, unit: str = "", note: str = "") -> None:
        figure = Figure(section, what, value, unit, note)
        self.figures.append(figure)
        print(f"  {what}: {_shown(value)} {unit}{f'  ({note})' if note else ''}", flush=True)

    def fragment(self, name: str) -> dict[str, Any]:
        """What one section's child process hands back."""
        figures = [asdict(f) for f in self.figures if f.section == name]
        return {"figures": figures, "section": self.sections[name]}

    def merge(self, name: str, fragment: dict[str, Any]) -> None:
        self.figures.extend(Figure(**f) for f in fragment["figures"])
        self.sections[name] = fragment["section"]

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        data = {
            "device": self.device,
            "smoke": self.smoke,
            "command": self.command,
            "weights": "random (UNTRAINED): speed does not depend on them",
            "sections": self.sections,
            # each figure names the device it was measured on, so one can be quoted alone
            "figures": [{**asdict(f), "device": self.device["name"]} for f in self.figures],
        }
        (self.out / "gpu.json").write_text(json.dumps(data, indent=2) + "\n")
        (self.out / "gpu.md").write_text(self.markdown())

    def markdown(self) -> str:
        d = self.device
        lines = [
            f"# bench.gpu on {d['name']}{' (smoke: small sizes)' if self.smoke else ''}",
            "",
            f"{d['date']}; torch {d['torch']}, CUDA {d['cuda']}; {d['memory_gib']} GiB; "
            f"host: {d['host_cores']} cores. Weights random (UNTRAINED): speed does not "
            f"depend on them. Command: `{self.command}`.",
            "",
            "| section | figure | value | note |",
            "|---|---|---|---|",
        ]
        for f in self.figures:
            value = f"{_shown(f.value)} {f.unit}".strip()
            lines.append(f"| {f.section} | {f.what} | {value} | {f.note} |")
        for name, info in self.sections.items():
            if info.get("error"):
                lines.append(f"| {name} | **failed** | | {info['error']} |")
        return "\n".join(lines) + "\n"


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return "" if value is None else str(value)


# ----------------------------------------------------------------------------- the device


def device_facts(device: torch.device) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host_cores": os.cpu_count(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
        )
    else:
        facts.update(name=f"CPU ({platform.processor() or platform.machine()})", memory_gib="-")
    return facts


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(
    fn: Callable[[], object], device: torch.device, repeats: int, warmup: int
) -> tuple[float, float]:
    """Median seconds of ``fn`` and its peak memory (MiB), as ``bench.model`` times a path."""
    from bench.model import time_paths

    return time_paths({"fn": fn}, device, repeats, warmup)["fn"]


@contextmanager
def peak_memory(device: torch.device) -> Iterator[dict[str, float]]:
    """Peak device memory (MiB) allocated inside the block above what was allocated before."""
    result = {"mib": float("nan")}
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    yield result
    if device.type == "cuda":
        synchronize(device)
        result["mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20


def model_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


def build(arch: str, hw: tuple[int, int], device: torch.device, task: str | None = None):
    import sapiens

    return sapiens.build_model(
        arch, task, input_hw=hw, device=device, dtype=model_dtype(device), seed=0
    )


def label(arch: str, hw: tuple[int, int], batch: int, dtype: torch.dtype) -> str:
    return f"Sapiens2-{arch} {hw[0]}x{hw[1]} {dtype_name(dtype)} batch {batch}"


# ----------------------------------------------------------------------------- sections


def section_model(report: Report, device: torch.device, sizes: Sizes) -> None:
    from bench.model import bench_one

    dtype = model_dtype(device)
    args = SimpleNamespace(
        dtype=dtype_name(dtype), task=None, batch=sizes.batch, compile=False, reference=True,
        channels_last=True,
        repeats=sizes.repeats, warmup=sizes.warmup,
    )  # fmt: skip
    fast, reference = bench_one(sizes.arch, sizes.hw, args, device)
    name = label(sizes.arch, sizes.hw, sizes.batch, dtype)
    report.add("model", f"{name}: images/s", fast.images_per_s, "images/s")
    report.add("model", f"{name}: peak memory", fast.peak_mem_mib, "MiB")
    if fast.tflops is not None:
        peak_figures(report, "model", name, fast.tflops)
    ref = f"Sapiens2-{sizes.arch} {sizes.hw[0]}x{sizes.hw[1]} fp32 batch 1, upstream way"
    how = "straightforward maths of bench/reference_model.py, TF32 off (torch's default)"
    report.add("model", f"{ref}: images/s", reference.images_per_s, "images/s", how)
    report.add("model", "speed-up over the upstream way", fast.speedup_vs_reference, "x")


def peak_figures(report: Report, section: str, name: str, tflops: float) -> None:
    """TFLOP/s, and their share of the device's dense bf16 peak where the data sheet's peak is
    known for its name; otherwise the share is said to be unknown, never guessed."""
    from bench.model import peak_for_name

    report.add(section, f"{name}: TFLOP/s", tflops, "TFLOP/s")
    device = report.device["name"]
    peak = peak_for_name(device)
    if peak is None:
        note = f"no data-sheet peak known for {device!r}"
        report.add(section, f"{name}: share of dense bf16 peak", "unknown", "", note)
        return
    note = f"peak {peak:g} TFLOP/s (data sheet)"
    report.add(section, f"{name}: share of dense bf16 peak", tflops / peak, "", note)


def section_4k(report: Report, device: torch.device, sizes: Sizes) -> None:
    from bench.model import count_flops

    model = build(sizes.arch_4k, sizes.hw_4k, device)
    x = torch.rand(1, 3, *sizes.hw_4k, device=device, dtype=model_dtype(device))
    with torch.inference_mode():
        seconds, peak = seconds_per_call(lambda: model(x), device, max(2, sizes.repeats - 2), 1)
    name = label(sizes.arch_4k, sizes.hw_4k, 1, model_dtype(device))
    report.add("4k", f"{name}: frames/s", 1.0 / seconds, "frames/s")
    if device.type == "cuda":
        report.add("4k", f"{name}: peak memory", peak, "MiB", "above the weights")
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    report.add("4k", f"{name}: weights", weights, "MiB")
    if device.type == "cuda":
        flops = count_flops(sizes.arch_4k, None, sizes.hw_4k, 1)
        peak_figures(report, "4k", name, flops / seconds / 1e12)


def section_attention(report: Report, device: torch.device, sizes: Sizes) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = build(sizes.arch, sizes.hw, device)
    x = torch.rand(sizes.batch, 3, *sizes.hw, device=device, dtype=model_dtype(device))
    name = label(sizes.arch, sizes.hw, sizes.batch, model_dtype(device))
    kernels = {
        "torch's choice": None,
        "flash": SDPBackend.FLASH_ATTENTION,
        "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cuDNN": SDPBackend.CUDNN_ATTENTION,
        "plain maths": SDPBackend.MATH,
    }
    with torch.inference_mode():
        for kernel, backend in kernels.items():
            try:
                with sdpa_kernel([backend]) if backend is not None else nullcontext():
                    seconds, _ = seconds_per_call(
                        lambda: model(x), device, sizes.repeats, sizes.warmup
                    )
            except RuntimeError as exc:  # this kernel does not take these inputs here
                report.add("attention", f"{name}, SDPA {kernel}", "not available", "",
                           str(exc).splitlines()[0][:160])  # fmt: skip
                continue
            report.add("attention", f"{name}, SDPA {kernel}", sizes.batch / seconds, "images/s")


def section_graphs(report: Report, device: torch.device, sizes: Sizes) -> None:
    if device.type != "cuda":
        report.add("graphs", "CUDA graphs", "skipped", "", "they need a CUDA device")
        return
    model = build(sizes.arch, sizes.hw, device)
    for batch in sorted({1, sizes.batch}):
        name = label(sizes.arch, sizes.hw, batch, model_dtype(device))
        static = torch.rand(batch, 3, *sizes.hw, device=device, dtype=model_dtype(device))
        with torch.inference_mode():
            eager, _ = seconds_per_call(
                lambda static=static: model(static), device, sizes.repeats, sizes.warmup
            )
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # warm-up on a side stream, as capture wants
                for _ in range(2):
                    model(static)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model(static)
            replay, _ = seconds_per_call(graph.replay, device, sizes.repeats, sizes.warmup)
        report.add("graphs", f"{name}: eager", batch / eager, "images/s")
        report.add("graphs", f"{name}: CUDA graph replay", batch / replay, "images/s",
                   f"x{eager / replay:.3f} over eager")  # fmt: skip
        del graph


def section_compile(report: Report, device: torch.device, sizes: Sizes) -> None:
    from sapiens.torch_compile import compile_model

    name = label(sizes.arch, sizes.hw, sizes.batch, model_dtype(device))
    x = torch.rand(sizes.batch, 3, *sizes.hw, device=device, dtype=model_dtype(device))
    with torch.inference_mode():
        eager = _eager_seconds(sizes, device, x)
        compiled = compile_model(build(sizes.arch, sizes.hw, device))
        started = time.perf_counter()
        compiled(x)
        synchronize(device)
        compile_s = time.perf_counter() - started
        seconds, _ = seconds_per_call(lambda: compiled(x), device, sizes.repeats, sizes.warmup)
    report.add("compile", f"{name}: eager", sizes.batch / eager, "images/s")
    report.add("compile", f"{name}: torch.compile (blocks and head)", sizes.batch / seconds,
               "images/s", f"x{eager / seconds:.3f} over eager")  # fmt: skip
    report.add("compile", "first call (compiling)", compile_s, "s")


def _eager_seconds(sizes: Sizes, device: torch.device, x: torch.Tensor) -> float:
    model = build(sizes.arch, sizes.hw, device)
    return seconds_per_call(lambda: model(x), device, sizes.repeats, sizes.warmup)[0]


def section_shot(report: Report, device: torch.device, sizes: Sizes) -> None:
    import sapiens
    from bench.io import chunk_job, worker_figures, write_plates
    from schemas.spec import ShotSpec

    height, width = sizes.shot_hw
    frames = sizes.shot_frames
    models = {name: build(sizes.shot_arch, sizes.hw, device, model_task(name))
              for name in SHOT_PASSES}  # fmt: skip
    batch = ShotSpec.model_fields["batch_size"].default
    predictor = sapiens.Predictor(models, device=device, dtype=model_dtype(device),
                                  batch_size=batch)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="svfx-bench-gpu-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        pattern = write_plates(root / "plates", height, width, frames, "realistic")
        plates_s = time.perf_counter() - started
        job = chunk_job(pattern, root / "out", frames, (width, height), list(SHOT_PASSES),
                        previews=True, review_clips=False)  # fmt: skip
        with peak_memory(device) as peak:
            figures = worker_figures(job, predictor)
        exr_mb = sum(Path(job.paths.exr(n)).stat().st_size for n in job.frames) / frames / 1e6
    what = (
        f"{frames} frames {width}x{height}, {', '.join(SHOT_PASSES)}, Sapiens2-{sizes.shot_arch} "
        f"{dtype_name(model_dtype(device))} batch {batch}"
    )
    how = f"wall {figures['wall_s']:.1f} s, one worker, reader/device/writers overlapped"
    report.add("shot", f"{what}: frames/s", figures["frames_per_s"], "frames/s", how)
    report.add("shot", "the models' share of wall time", figures["model_share"], "",
               "time inside the networks (CUDA events) / wall")  # fmt: skip
    report.add("shot", "host core-s per frame", figures["host_core_s_per_frame"], "core-s",
               "every thread of the worker process, user + kernel")  # fmt: skip
    if device.type == "cuda":
        report.add("shot", "peak device memory", peak["mib"], "MiB", "above the five models")
    report.add("shot", "EXR per frame", exr_mb, "MB")
    report.add("shot", "plates written first (not timed above)", plates_s, "s")


def section_temporal(report: Report, device: torch.device, sizes: Sizes) -> None:
    """The stabiliser as ``python -m bench.temporal --cost-only --device ...`` runs it (one
    torch thread: host core-s are the figure), without the keypoint smoother."""
    from bench.temporal import run_shot
    from bench.temporal_scene import Scene

    height, width = sizes.temporal_hw
    frames = sizes.temporal_frames
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with peak_memory(device) as peak, torch.no_grad():
            run = run_shot(Scene(width, height, frames), device=str(device), metrics=False,
                           pose=False)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    what = f"{frames} frames {width}x{height}, every dense pass"
    report.add("temporal", f"{what}: host core-s per frame", run.core_seconds / frames,
               "core-s", "flow on the host, warps and fusion on the device")  # fmt: skip
    report.add("temporal", f"{what}: wall per frame", run.wall_seconds / frames, "s")
    report.add("temporal", "share of pixels fused at the plate's size", run.plate_size_share)
    if device.type == "cuda":
        report.add("temporal", "peak device memory", peak["mib"], "MiB", "the window's passes")


RUNNERS: dict[str, Callable[[Report, torch.device, Sizes], None]] = {
    "model": section_model,
    "4k": section_4k,
    "attention": section_attention,
    "graphs": section_graphs,
    "shot": section_shot,
    "temporal": section_temporal,
    "compile": section_compile,
}


def run_section(report: Report, name: str, device: torch.device, sizes: Sizes) -> None:
    """One section in this process; a failure is recorded in ``report``, not raised."""
    started = time.perf_counter()
    try:
        RUNNERS[name](report, device, sizes)
        report.sections[name] = {"seconds": round(time.perf_counter() - started, 1)}
    except Exception as exc:
        traceback.print_exc()
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        report.sections[name] = {
            "seconds": round(time.perf_counter() - started, 1),
            "error": error[:300],
        }
        print(f"  {name} failed: {error[:300]}", flush=True)


def section_in_child(name: str, args: argparse.Namespace, started: float) -> dict[str, Any]:
    """Run one section in a process of its own and bring back its fragment of the report.

    Each section gets a fresh CUDA context: a failed CUDA graph capture, a compile gone
    wrong or memory left behind stays in that process (a capture that failed once left the
    CUDA generator unusable for every later section of the same process, on an H100)."""
    with tempfile.TemporaryDirectory() as tmp:
        fragment = Path(tmp) / "fragment.json"
        command = [
            sys.executable, "-m", "bench.gpu", "--sections", name, "--out", str(args.out),
            "--child-fragment", str(fragment), "--default-allocator",
            *(["--device", args.device] if args.device else []),
            *(["--smoke"] if args.smoke else []),
        ]  # fmt: skip
        done = subprocess.run(command, check=False)
        if fragment.is_file():
            return json.loads(fragment.read_text())
    seconds = round(time.perf_counter() - started, 1)
    error = f"its process ended with exit code {done.returncode} before reporting (log above)"
    return {"figures": [], "section": {"seconds": seconds, "error": error}}


# ----------------------------------------------------------------------------- command


def refuse(message: str) -> NoReturn:
    print(f"bench.gpu: {message}", file=sys.stderr)
    raise SystemExit(2)


def pick_device(name: str | None) -> torch.device:
    """The device asked for; without CUDA only ``--device cpu`` runs (one line, exit 2)."""
    if name is None or name.startswith("cuda"):
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "a CUDA build"
            refuse(
                f"no CUDA device here (torch {torch.__version__} is {build} and sees none); "
                "run it on a GPU node, or with --device cpu to check the script itself"
            )
        device = torch.device(name or "cuda")
        if device.index is not None and device.index >= torch.cuda.device_count():
            refuse(f"{name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return device
    if name != "cpu":
        refuse(f"unknown device {name!r}: use cuda, cuda:N or cpu")
    return torch.device("cpu")


def main(argv: list[str] | None = None) -> Report:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default=None, help="cuda (default), cuda:N, or cpu")
    p.add_argument("--smoke", action="store_true", help="small sizes and few frames")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, in order")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for gpu.json, gpu.md")
    p.add_argument(
        "--default-allocator",
        action="store_true",
        help="glibc's default malloc settings, not the ones the platform's workers run with",
    )
    p.add_argument("--child-fragment", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    as_a_worker_runs("bench.gpu", args.default_allocator, argv)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in RUNNERS]
    if unknown:
        refuse(f"unknown section {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    device = pick_device(args.device)
    sizes = SMOKE if args.smoke else FULL
    command = " ".join(["python -m bench.gpu", *(sys.argv[1:] if argv is None else argv)])
    report = Report(args.out, device_facts(device), args.smoke, command=command)
    if args.child_fragment is not None:  # this process is one section's child
        (name,) = wanted
        run_section(report, name, device, sizes)
        args.child_fragment.write_text(json.dumps(report.fragment(name)))
        return report
    d = report.device
    print(
        f"bench.gpu on {d['name']} ({d['device']}), torch {d['torch']}, CUDA {d['cuda']}; "
        "weights: random (UNTRAINED)",
        flush=True,
    )
    for name in wanted:
        print(f"[{name}]", flush=True)
        started = time.perf_counter()
        report.merge(name, section_in_child(name, args, started))
        report.write()
        print(f"  ({report.sections[name]['seconds']} s)", flush=True)
    print(f"written: {args.out / 'gpu.json'}, {args.out / 'gpu.md'}")
    return report


if __name__ == "__main__":
    # exit 1 when a section failed (its error is in the report), as a partial run
    raise SystemExit(1 if any("error" in s for s in main().sections.values()) else 0)
