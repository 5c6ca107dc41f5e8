"""End-to-end pipeline figures on the embedded default (LocalCluster, SQLite, local disk):

- frames/s end to end for a shot (default 48 frames at 1920x1080, the 0.1b size, CPU);
- the model's share of worker wall time (target >= 85%: the rest hides behind the model);
- peak worker memory for a short and a long shot (target: within 10%, memory flat in length);
- the flow's own overhead per frame (planning, dispatch, catalog writes, shot-level files).

Weights are UNTRAINED (random, built once): speed does not depend on them.

    python -m bench.pipeline                                  # 48 and 240 frames, 1080p, 0.1b
    python -m bench.pipeline --frames 12 --size 640x360 --model-size tiny --long 0
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def run(frames: int, size: tuple[int, int], model_size: str, workers: int, home: Path) -> dict:
    from flows.cluster import dask_client
    from flows.demo import DEMO_COLORSPACE, write_demo_plate
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot
    from schemas.catalog import open_catalog
    from schemas.settings import Settings
    from schemas.spec import parse_spec

    settings = Settings(home=home, allowed_roots=[str(home)], local_workers=workers)
    pattern = write_demo_plate(home / f"plate{frames}", frames, *size)
    spec = parse_spec(
        {
            "plate": pattern,
            "show": "bench",
            "sequence": "sq",
            "shot": f"sh{frames}",
            "colorspace": DEMO_COLORSPACE,
            "model_size": model_size,
            "output_root": str(home / "out"),
            "chunk_frames": 8,
            "review_clips": False,
        }
    )
    catalog = open_catalog(settings.catalog)
    with dask_client(settings) as client:
        # warm the workers (imports, model load) on a one-frame shot, outside the timing
        warm = parse_spec({**spec.model_dump(mode="json"), "shot": "warm", "frames": "1001"})
        run_planned_shot(plan_shot(warm, settings), catalog, client)
        start = time.perf_counter()
        plan = plan_shot(spec, settings)
        result = run_planned_shot(plan, catalog, client)
        wall = time.perf_counter() - start
    busy = result.chunk_wall_s  # summed over workers
    return {
        "frames": frames,
        "size": f"{size[0]}x{size[1]}",
        "model_size": model_size,
        "workers": workers,
        "status": result.status,
        "wall_s": round(wall, 2),
        "frames_per_s": round(frames / wall, 3),
        "model_share_of_worker_time": round(result.model_s / busy, 3) if busy else None,
        "peak_worker_rss_mb": round(result.peak_worker_rss_mb, 1),
        # wall time the workers were not busy, per frame (planning, dispatch, catalog, finalize)
        "flow_overhead_s_per_frame": round(max(0.0, wall - busy / workers) / frames, 4),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--frames", type=int, default=48)
    p.add_argument("--long", type=int, default=240, help="second, longer shot (0: skip)")
    p.add_argument("--size", default="1920x1080")
    p.add_argument("--model-size", default="0.1b")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SVFX_HOME"] = tmp
        for frames in [args.frames] + ([args.long] if args.long else []):
            r = run(frames, (w, h), args.model_size, args.workers, Path(tmp))
            results.append(r)
            print(json.dumps(r), flush=True)
    if len(results) == 2:
        a, b = results[0]["peak_worker_rss_mb"], results[1]["peak_worker_rss_mb"]
        print(f"peak worker memory {a:.0f} MB vs {b:.0f} MB: {100 * (b - a) / a:+.1f}%")


if __name__ == "__main__":
    main()
