"""The accuracy gate's table: bf16 (or another dtype) against fp32, every pass, on the gate's
toy models and plates (``tasks.precision_gate``; the models are trained on synthetic figures by
``bench/gate_training.py``, they are not Sapiens). Each metric with its limit beside it and
whether it holds, the CPU, torch's version and the time the gate itself took (always measured
afresh here: the worker's cache is not read).

    python -m bench.precision                  # bf16 on the CPU, torch's default threads
    python -m bench.precision --threads 1      # the gate's time on one core
    python -m bench.precision --json           # the same, as JSON
    python -m bench.precision --device cuda --dtype fp16
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from tasks.dtypes import PRECISIONS
from tasks.precision_gate import LIMITS, check, device_identity, measure


def run(device: torch.device, dtype_name: str, repeats: int) -> dict[str, object]:
    """The figures (of the last run), the verdict and the gate's time (the fastest of
    ``repeats`` runs in this process: the first includes imports and first-call warm-up, so it
    is reported apart)."""
    dtype = PRECISIONS[dtype_name]
    times = []
    figures: dict[str, float] = {}
    for _ in range(repeats):
        start = time.perf_counter()
        figures = measure(device, dtype)
        times.append(time.perf_counter() - start)
    holds, reason = check(figures)
    rows = [
        {
            "pass": limit.pass_name,
            "metric": limit.metric,
            "label": limit.label,
            "value": figures[limit.metric],
            "limit": limit.bound,
            "unit": limit.unit,
            "fails": limit.worse,
            "holds": limit.holds(figures[limit.metric]),
        }
        for limit in LIMITS
    ]
    return {
        "dtype": dtype_name,
        "reference": "fp32",
        "device": str(device),
        "machine": device_identity(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "holds": holds,
        "reason": reason,
        "gate_seconds_first": times[0],
        "gate_seconds": min(times),
        "rows": rows,
    }


def print_table(result: dict[str, object]) -> None:
    print(f"{result['dtype']} against fp32 on {result['device']}: {result['machine']}")
    print(f"torch {result['torch']}, {result['threads']} thread(s)")
    print()
    print(f"{'pass':<9} {'metric':<34} {'value':>10} {'limit':>10}  result")
    rows = result["rows"]
    assert isinstance(rows, list)
    for row in rows:
        sign = "<=" if row["fails"] == "above" else ">="
        unit = f" {row['unit']}" if row["unit"] else ""
        value = _number(row["value"])
        verdict = "pass" if row["holds"] else "FAIL"
        print(
            f"{row['pass']:<9} {row['label']:<34} {value:>10} "
            f"{sign} {_number(row['limit']):>7}{unit:<4} {verdict}"
        )
    print()
    print(f"gate: {'holds' if result['holds'] else 'fails'}: {result['reason']}")
    print(
        f"gate time: {result['gate_seconds']:.2f} s "
        f"(first run in this process: {result['gate_seconds_first']:.2f} s)"
    )


def _number(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if value == 0:
        return "0"
    return f"{value:.4f}" if abs(value) >= 1e-3 else f"{value:.2e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(PRECISIONS), default="bf16")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(torch.device(args.device), args.dtype, max(1, args.repeats))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
