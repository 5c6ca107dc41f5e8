"""What a worker's memory holds when it loads a model, against the weights' own bytes.

For each model and precision, in a fresh process started as the platform starts its workers
(the allocator settings of `flows.allocator`, unless ``--default-allocator``):

- ``base``: RSS once torch and the package are imported (what every worker pays first);
- ``verify``: the peak RSS above ``base`` of `verify_checkpoint` alone (the up-front check the
  flow runs), in a process of its own;
- ``load``: RSS above ``base`` after `load_model`, split into anonymous memory (the heap) and
  file pages (a memory-mapped checkpoint counts there), its peak during the load, and the same
  after the model has run once on one tile of its input size (the frame buffers);
- ``ratio``: the resident size after the load over the weights' bytes in the loaded precision
  (the goal is at most 1.3; the frame buffers come on top).

Weights are random (UNTRAINED); the files are written once under ``--dir`` in the precision
the released checkpoints come in (fp32), and removed at the end unless ``--keep``.

    python -m bench.memory                                  # Sapiens2 0.4b, v1 0.3b; fp32, bf16
    python -m bench.memory --models sapiens2_1b:normal --dtypes bf16
    python -m bench.memory --default-allocator              # glibc's own malloc settings
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_MODELS = ("sapiens2_0.4b:normal", "sapiens_0.3b:depth")
MIB = 2**20


def proc_status() -> dict[str, float]:
    """This process's RSS, its anonymous and file-backed parts, and its peak, in MiB."""
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "VmHWM": "peak"}
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in fields:
                out[fields[name]] = int(value.split()[0]) / 1024
    return out


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def child(phase: str, path: str, dtype_name: str, frame: tuple[int, int] | None) -> dict[str, Any]:
    import gc

    import torch

    import sapiens  # noqa: F401 (imported before the baseline, as on a worker)
    from sapiens.loading import load_model, verify_checkpoint
    from tasks.dtypes import PRECISIONS

    torch.set_num_threads(int(os.environ.get("SVFX_TORCH_THREADS", "2")))
    gc.collect()
    reset_peak()
    base = proc_status()
    if phase == "verify":
        start = time.perf_counter()
        verify_checkpoint(path)
        seconds = time.perf_counter() - start
        now = proc_status()
        return {"verify_s": seconds, "verify_peak_mb": now["peak"] - base["rss"]}
    dtype = PRECISIONS[dtype_name]
    start = time.perf_counter()
    model = load_model(path, "cpu", dtype)
    seconds = time.perf_counter() - start
    gc.collect()
    loaded = proc_status()
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    info = model.info
    with torch.inference_mode():
        x = torch.randn(1, 3, *(frame or info.input_hw), dtype=dtype)
        model(x)
        del x
    gc.collect()
    warmed = proc_status()
    return {
        "weights_mb": weights / MIB,
        "load_s": seconds,
        "base_mb": base["rss"],
        "load_mb": loaded["rss"] - base["rss"],
        "load_anon_mb": loaded["anon"] - base["anon"],
        "load_file_mb": loaded["file"] - base["file"],
        "load_peak_mb": loaded["peak"] - base["rss"],
        "warm_mb": warmed["rss"] - base["rss"],
        "warm_peak_mb": warmed["peak"] - base["rss"],
        "input_hw": list(info.input_hw),
    }


def make_checkpoint(directory: Path, name: str) -> Path:
    """A random-weight fp32 file of this model (``arch:task``), written once, in a process of
    its own (so building a big model leaves nothing behind here)."""
    arch, _, task = name.partition(":")
    path = directory / f"{arch}_{task or 'pretrain'}_fp32.safetensors"
    if not path.is_file():
        code = (
            "import sys, torch; from sapiens import build_model, save_model;"
            "m = build_model(sys.argv[1], sys.argv[2] or None, seed=0, dtype=torch.float32);"
            "save_model(m, sys.argv[3])"
        )
        subprocess.run([sys.executable, "-c", code, arch, task, str(path)], check=True)
    return path


def run_child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.memory", "--child", *args]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_env(default_allocator: bool) -> dict[str, str]:
    from flows.allocator import allocator_env

    env = dict(os.environ)
    if not default_allocator:
        env.update(allocator_env())
    return env


def measure(
    models: list[str], dtypes: list[str], directory: Path, frame: str, default_allocator: bool
) -> list[dict[str, Any]]:
    env = child_env(default_allocator)
    rows = []
    for name in models:
        path = make_checkpoint(directory, name)
        file_mb = path.stat().st_size / MIB
        verify = run_child(["verify", str(path), "fp32", frame], env)
        for dtype in dtypes:
            row = {"model": name, "dtype": dtype, "file_mb": file_mb, **verify}
            row.update(run_child(["load", str(path), dtype, frame], env))
            row["ratio"] = row["load_mb"] / row["weights_mb"]
            rows.append(row)
            print(
                json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}),
                file=sys.stderr,
            )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'model':24} {'dtype':5} {'weights':>8} {'verify pk':>9} {'load':>7} {'anon':>7} "
        f"{'file':>7} {'load pk':>8} {'+frame':>7} {'frame pk':>8} {'ratio':>6} {'load s':>6}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['model']:24} {r['dtype']:5} {r['weights_mb']:8.0f} {r['verify_peak_mb']:9.0f} "
            f"{r['load_mb']:7.0f} {r['load_anon_mb']:7.0f} {r['load_file_mb']:7.0f} "
            f"{r['load_peak_mb']:8.0f} {r['warm_mb']:7.0f} {r['warm_peak_mb']:8.0f} "
            f"{r['ratio']:6.2f} {r['load_s']:6.1f}"
        )
    print("MiB above the process's RSS once torch is imported; ratio = load / weights")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="arch:task ...")
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--dir", type=Path, default=Path("/tmp/svfx-bench-memory"))
    p.add_argument("--frame", default="native", help="HxW of the warm-up input (a tile)")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint files")
    p.add_argument("--default-allocator", action="store_true")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        phase, path, dtype, frame = args.child
        hw = None if frame == "native" else tuple(int(v) for v in frame.lower().split("x"))
        print(json.dumps(child(phase, path, dtype, hw)))  # type: ignore[arg-type]
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    try:
        rows = measure(args.models, args.dtypes, args.dir, args.frame, args.default_allocator)
    finally:
        if not args.keep:
            for file in args.dir.glob("*.safetensors"):
                file.unlink()
    print_table(rows)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
