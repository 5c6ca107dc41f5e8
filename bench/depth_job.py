"""Issue 27's depth job, as a user runs it: `svfx submit --passes depth` with Sapiens v1 0.3b
depth and seg files (random weights, UNTRAINED, written once under ``--dir``), two 320x180
demo frames, the embedded LocalCluster. Reports each process's peak RSS (sampled every
0.25 s), whether a worker was short of memory (our one line for Dask's pause), the exit code
and the wall time. The worker memory limit is Dask's "auto" share of the machine.

    python -m bench.depth_job                      # fp32, as the issue ran it
    python -m bench.depth_job --precision bf16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.memory import make_checkpoint

SVFX = "import sys; from cli.main import main; sys.argv[0] = 'svfx'; sys.exit(main())"


def peak_rss_mb(proc: subprocess.Popen[str], interval: float = 0.25) -> dict[int, float]:
    """Peak RSS in MiB of every process under `proc` until it ends."""
    import psutil

    root = psutil.Process(proc.pid)
    peaks: dict[int, float] = {}
    while proc.poll() is None:
        try:
            children = root.children(recursive=True)
        except psutil.Error:
            break
        for child in children:
            try:
                rss = child.memory_info().rss / 2**20
            except psutil.Error:
                continue
            peaks[child.pid] = max(rss, peaks.get(child.pid, 0.0))
        time.sleep(interval)
    return peaks


def run(checkpoints: Path, precision: str) -> dict[str, object]:
    from flows.demo import DEMO_COLORSPACE, write_demo_plate

    depth = make_checkpoint(checkpoints, "sapiens_0.3b:depth")
    seg = make_checkpoint(checkpoints, "sapiens_0.3b:seg")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "home" / "prefect").mkdir(parents=True)
        env = {
            **os.environ,
            "SVFX_HOME": str(home / "home"),
            "PREFECT_HOME": str(home / "home" / "prefect"),
            "SVFX_ALLOWED_ROOTS": f"{home},{checkpoints}",
        }
        plate = write_demo_plate(home / "plate", 2, 320, 180)
        cmd = [
            sys.executable, "-c", SVFX, "submit", plate, "--shot", "demo/sq01/sh010",
            "--colorspace", DEMO_COLORSPACE, "--passes", "depth", "--family", "sapiens1",
            "--model-size", "0.3b", "--checkpoint", f"depth={depth}", "--checkpoint",
            f"seg={seg}", "--precision", precision, "--output", str(home / "out"),
            "--no-previews", "--json",
        ]  # fmt: skip
        start = time.perf_counter()
        # to files, not pipes: nothing reads them while the job runs
        with open(home / "out.txt", "w+") as out, open(home / "err.txt", "w+") as err:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
            peaks = peak_rss_mb(proc)
            proc.wait()
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        wall = time.perf_counter() - start
    status = json.loads(stdout).get("status") if proc.returncode == 0 else None
    return {
        "exit_code": proc.returncode,
        "status": status,
        "wall_s": round(wall, 1),
        "peak_rss_mb": sorted((round(v) for v in peaks.values()), reverse=True)[:3],
        "short_of_memory": [line for line in stderr.splitlines() if "short of memory" in line],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", type=Path, default=Path("/tmp/svfx-bench-memory"))
    p.add_argument("--precision", default="fp32")
    args = p.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(args.dir.resolve(), args.precision)))


if __name__ == "__main__":
    main()
