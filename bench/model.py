"""Model benchmark: latency, images/s, peak memory per size and resolution.

On CUDA it also reports achieved TFLOP/s and the fraction of the device's dense bf16 peak
(FLOPs = 2 x multiply-adds, counted by torch's FlopCounterMode on the meta device), and the
speed-up over the upstream way (fp32, batch 1, the straightforward maths of
`bench/reference_model.py`). On CPU it compares our fast path with that straightforward path on
the same weights, with and without `torch.compile`.

Weights are random (UNTRAINED): speed does not depend on them.

    python -m bench.model                         # defaults for the device at hand
    python -m bench.model --sizes 0.4b --resolutions 512x384 --compile
    python -m bench.model --device cuda --sizes 1b --resolutions 1024x768 --batch 8
    python -m bench.model --family sapiens1 --size 0.3b --task depth --resolutions 1024x768
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

import sapiens
from bench import reference_model_v1
from bench.reference_model import model_forward
from sapiens.predictor import channels_last_head
from sapiens.torch_compile import compile_model
from tasks.dtypes import PRECISIONS
from tasks.precision import choose_precision

# Dense bf16 tensor-core peaks (TFLOP/s, without sparsity) from the vendors' data sheets, by
# the words of the name CUDA reports; the first row whose words are all in the name wins. A
# name no row matches has no known peak: the TFLOP/s are printed and the share is not guessed.
BF16_PEAK_TFLOPS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("H100", "PCIe"), 756.0),
    (("H100", "NVL"), 835.0),
    (("H100", "SXM"), 989.4),
    (("H100", "HBM3"), 989.4),  # "NVIDIA H100 80GB HBM3" is the SXM5 board
    (("GH200",), 989.4),
    (("H200", "NVL"), 835.0),
    (("H200",), 989.4),  # "NVIDIA H200": the SXM board
    (("A100",), 312.0),
    (("L40S",), 362.0),
    (("B200",), 2250.0),
)


def peak_for_name(name: str) -> float | None:
    """The dense bf16 peak of the GPU CUDA calls ``name``, or None when it is not known."""
    words = set(name.replace("-", " ").split())
    for keys, peak in BF16_PEAK_TFLOPS:
        if all(key in words for key in keys):
            return peak
    return None


@dataclass
class Row:
    model: str
    resolution: str
    batch: int
    path: str  # "fast", "fast+compile", "reference (upstream way)"
    dtype: str
    latency_ms: float
    images_per_s: float
    peak_mem_mib: float
    tflops: float | None = None
    bf16_peak_fraction: float | None = None
    speedup_vs_reference: float | None = None


def count_flops(arch: str, task: str | None, hw: tuple[int, int], batch: int) -> float:
    model = sapiens.build_model(arch, task, device="meta", input_hw=hw)
    with FlopCounterMode(display=False) as counter:
        model(torch.empty(batch, 3, *hw, device="meta"))
    return float(counter.get_total_flops())


def device_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return peak_for_name(torch.cuda.get_device_name(device))


class PeakRSS:
    """Peak resident memory of this process above the level at start (CPU runs)."""

    def __init__(self) -> None:
        self.base = self._rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _poll(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mib(self) -> float:
        return (self.peak - self.base) / 2**20


def time_paths(
    fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int
) -> dict[str, tuple[float, float]]:
    """Median seconds and peak memory (MiB) per path. Paths run interleaved, round-robin, so a
    busy or throttling machine slows them alike and their ratio stays meaningful."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    peaks: dict[str, float] = dict.fromkeys(fns, 0.0)
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            with PeakRSS() as rss:
                start = time.perf_counter()
                fn()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times[name].append(time.perf_counter() - start)
            mem = (
                (torch.cuda.max_memory_allocated(device) - base) / 2**20
                if device.type == "cuda"
                else rss.mib
            )
            peaks[name] = max(peaks[name], mem)
    return {name: (statistics.median(times[name]), peaks[name]) for name in fns}


def bench_one(arch: str, hw: tuple[int, int], args, device: torch.device) -> list[Row]:
    dtype = PRECISIONS[args.dtype]
    task = args.task
    rows: list[Row] = []
    # made on the device: a 1B model's random init takes seconds on a host's cores
    model = sapiens.build_model(arch, task, input_hw=hw, seed=0, device=device, dtype=dtype)
    if device.type == "cpu" and args.channels_last:
        channels_last_head(model)  # as the platform's Predictor does on a CPU
    label = model.info.arch + (f" {task}" if task else "")
    res = f"{hw[0]}x{hw[1]}"
    flops = count_flops(arch, task, hw, args.batch)
    peak = device_peak(device)
    x = torch.randn(args.batch, 3, *hw, device=device)

    def row(path: str, latency: float, mem: float, batch: int, dt: str, fl: float) -> Row:
        r = Row(label, res, batch, path, dt, latency * 1e3, batch / latency, mem)
        if device.type == "cuda":
            r.tflops = fl / latency / 1e12
            r.bf16_peak_fraction = r.tflops / peak if peak else None
        return r

    with torch.inference_mode():
        xs = x.to(dtype)
        fns: dict[str, Callable[[], object]] = {"fast": lambda: model(xs)}
        if args.compile:
            fresh = sapiens.build_model(arch, task, input_hw=hw, seed=0, device=device, dtype=dtype)
            if device.type == "cpu" and args.channels_last:
                channels_last_head(fresh)
            compiled = compile_model(fresh)
            for _ in range(2):  # compile outside the timing
                compiled(xs)
            fns["fast+compile"] = lambda: compiled(xs)
        if args.reference:
            # The upstream way: fp32, batch 1, straightforward maths, same weights.
            sd = {
                k: v.float() if v.is_floating_point() and "periods" not in k else v
                for k, v in model.state_dict().items()
            }
            x1 = x[:1].float()
            if model.info.family == "sapiens1":
                spec = model.info.backbone
                kw = {
                    "num_heads": spec.num_heads,
                    "patch_padding": spec.patch_padding,
                    "pos_grid": spec.pos_grid,
                }
                fns["reference (upstream way)"] = lambda: reference_model_v1.model_forward(
                    sd, x1, **kw
                )
            else:
                fns["reference (upstream way)"] = lambda: model_forward(sd, x1)
        results = time_paths(fns, device, args.repeats, args.warmup)
    for name, (latency, mem) in results.items():
        is_ref = name.startswith("reference")
        batch = 1 if is_ref else args.batch
        fl = flops / args.batch * batch
        rows.append(row(name, latency, mem, batch, "fp32" if is_ref else args.dtype, fl))
    if args.reference:
        ref_ips = rows[-1].images_per_s
        for r in rows[:-1]:
            r.speedup_vs_reference = r.images_per_s / ref_ips
    return rows


def parse_hw(text: str) -> tuple[int, int]:
    h, w = text.lower().split("x")
    return int(h), int(w)


def main(argv: list[str] | None = None) -> list[Row]:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument(
        "--family",
        choices=("sapiens2", "sapiens1"),
        default="sapiens2",
        help="sapiens1: v1 (ECCV 2024), sizes 0.3b 0.6b 1b 2b, tasks depth normal seg pose",
    )
    p.add_argument(
        "--sizes",
        default=None,
        help="comma-separated: tiny, 0.1b, 0.4b, 0.8b, 1b, 5b, 1b-4k, 0.1b-4k ... "
        "(sapiens1: 0.3b, 0.6b, 1b, 2b)",
    )
    p.add_argument(
        "--resolutions", default="1024x768" if cuda else "512x384", help="comma-separated HxW"
    )
    p.add_argument("--task", default=None, help="a head to include (default: backbone only)")
    p.add_argument("--batch", type=int, default=8 if cuda else 1)
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", *PRECISIONS),
        help="auto: what a worker's --precision auto picks on this device (tasks.precision)",
    )
    p.add_argument(
        "--no-channels-last",
        dest="channels_last",
        action="store_false",
        help="on a CPU, keep the head's convolutions in the default layout",
    )
    p.add_argument("--repeats", type=int, default=5 if cuda else 3)
    p.add_argument("--warmup", type=int, default=2 if cuda else 1)
    p.add_argument("--compile", action="store_true", help="also time torch.compile")
    p.add_argument(
        "--no-reference",
        dest="reference",
        action="store_false",
        help="skip the straightforward upstream-way baseline",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", default=None, help="write the rows to this JSON file")
    args = p.parse_args(argv)
    if args.sizes is None:
        v1 = args.family == "sapiens1"
        args.sizes = ("1b" if cuda else "0.3b") if v1 else ("1b" if cuda else "0.4b,0.1b-4k")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    choice = choose_precision(args.dtype, device)
    args.dtype = choice.short
    print(choice.line())
    print(
        f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"
        f" ({torch.get_num_threads()} threads), torch {torch.__version__}; "
        "weights: random (UNTRAINED)"
    )
    rows: list[Row] = []
    for size in args.sizes.split(","):
        arch = size.strip()
        if args.family == "sapiens1" and not arch.startswith(("sapiens_", "sapiens1_")):
            arch = f"sapiens_{arch}"
        for res in args.resolutions.split(","):
            hw = parse_hw(res)
            if arch.endswith("4k") and (hw[0] % 64 or hw[1] % 64):
                print(f"skip {arch} at {res}: the 4K variant needs multiples of 64 px")
                continue
            for r in bench_one(arch, hw, args, device):
                rows.append(r)
                extra = ""
                if r.tflops is not None:
                    frac = (
                        f", {100 * r.bf16_peak_fraction:.0f}% of bf16 peak"
                        if r.bf16_peak_fraction
                        else ""
                    )
                    extra += f", {r.tflops:.1f} TFLOP/s{frac}"
                if r.speedup_vs_reference:
                    extra += f", x{r.speedup_vs_reference:.2f} images/s vs reference"
                print(
                    f"{r.model:>22} {r.resolution:>9} b{r.batch} {r.dtype:>4} {r.path:<25} "
                    f"{r.latency_ms:9.1f} ms {r.images_per_s:8.2f} img/s "
                    f"peak {r.peak_mem_mib:8.0f} MiB{extra}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(r) for r in rows], fh, indent=2)
    return rows


if __name__ == "__main__":
    main()
