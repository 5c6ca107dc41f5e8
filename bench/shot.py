"""A whole shot through the real flow and cluster (embedded default: LocalCluster of worker
processes, SQLite, local disk), with every pass:

- frames/s end to end (after a one-frame warm-up shot that loads the models);
- the model's share of each worker's wall time (the rest is what the device would wait for,
  were reading and writing not overlapped with it);
- each worker's memory (RSS) sampled over the shot: it must stay flat in the shot's length;
- the flow's own overhead per frame (planning, dispatch, catalog writes, shot-level files).

Weights are UNTRAINED (random, built once): speed does not depend on them.

    python -m bench.shot                                   # 200 frames, 1920x1080, tiny
    python -m bench.shot --frames 48 --size 4096x2160 --model-size 0.1b
    python -m bench.shot --frames 4 --chunk-frames 2 --model-size 0.1b --precision fp32
    python -m bench.shot --default-allocator               # workers with Dask's malloc settings
    python -m bench.shot --passes normal,albedo,pointmap,seg,matte   # these passes only
    python -m bench.shot --tiles all                       # every tile (default: near people)
    python -m bench.shot --plate demo                      # the demo's astronaut

The plate is the stand-ins' person figure (``bench.standins.person_plate``), one small
distant figure (``distant_plate``, 60 px tall), or the demo's astronaut. With ``--tiles
people`` (the default, as submit) the person gate's look runs on the seg model, but untrained
weights find nobody, so its probabilities are replaced by ``bench.standins.figure_look``
(which knows where the figures are) through SVFX_PERSON_GATE: the look's cost is counted, and
the tiles that run are those a model seeing the figure would run. ``--gate model`` keeps the
untrained look (every tile runs, as the product does with untrained weights). The report
gives the model inputs per frame (tiles run and skipped, from the catalog) and the look's
seconds per frame.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def worker_rss_mb() -> tuple[str, float, float | None, float | None]:
    """This process's name as chunk summaries give it (host:pid), its resident memory, and
    the C heap's bytes in use and free but kept (glibc's ``mallinfo2``; None elsewhere), in
    MB (run on each worker): a resident size that grows while the bytes in use do not is
    the allocator keeping freed memory, not a leak."""
    import socket

    import psutil

    used, free = heap_mb()
    rss = psutil.Process().memory_info().rss / 2**20
    return f"{socket.gethostname()}:{os.getpid()}", rss, used, free


def heap_mb() -> tuple[float | None, float | None]:
    """(in use, free) bytes of the C heap in MB, from glibc's mallinfo2 (mmapped blocks count
    as in use); (None, None) without it. (The structure is made here: this module runs as
    __main__, whose functions Dask pickles by value, and a ctypes class does not pickle.)"""

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                         "uordblks", "fordblks", "keepcost")
        ]  # fmt: skip

    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None, None
    fn.restype = MallInfo2
    info = fn()
    return (info.uordblks + info.hblkhd) / 2**20, info.fordblks / 2**20


class RssSampler:
    """Every worker's RSS, every ``interval`` seconds, while the shot runs."""

    def __init__(self, client: Any, interval: float = 1.0) -> None:
        self.client = client
        self.interval = interval
        self.samples: dict[str, list[float]] = {}
        self.heap: dict[str, list[tuple[float, float]]] = {}  # (in use, free) MB
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                for worker, rss, used, free in self.client.run(worker_rss_mb).values():
                    self.samples.setdefault(worker, []).append(rss)
                    if used is not None and free is not None:
                        self.heap.setdefault(worker, []).append((used, free))
            except Exception:  # a sample lost while a worker is busy: the next one counts
                continue

    def summary(self) -> dict[str, dict[str, float]]:
        """Per worker: RSS in the first and last quarter of the shot (medians), the peak, the
        growth between the two quarters, and the median of each tenth of the shot (whether
        memory levels off or keeps rising), with the C heap's bytes in use and free per tenth."""
        out = {}
        for worker, values in self.samples.items():
            quarter = max(1, len(values) // 4)
            first = statistics.median(values[:quarter])
            last = statistics.median(values[-quarter:])
            tenths = [statistics.median(part) for part in _tenths(values)]
            out[worker] = {
                "samples": len(values),
                "first_quarter_mb": round(first, 1),
                "last_quarter_mb": round(last, 1),
                "peak_mb": round(max(values), 1),
                "growth_pct": round(100 * (last - first) / first, 1),
                "tenths_mb": [round(value) for value in tenths],
                # the goal: under 5% from the first to the last tenth
                "first_to_last_tenth_pct": round(100 * (tenths[-1] - tenths[0]) / tenths[0], 1)
                if tenths
                else None,
            }
            heap = self.heap.get(worker)
            if heap:
                for label, index in (("heap_in_use", 0), ("heap_free", 1)):
                    parts = _tenths([sample[index] for sample in heap])
                    out[worker][f"{label}_tenths_mb"] = [
                        round(statistics.median(part)) for part in parts
                    ]
        return out


def _tenths(values: list[float]) -> list[list[float]]:
    size = max(1, len(values) // 10)
    return [values[i : i + size] for i in range(0, size * (len(values) // size), size)][:10]


WARM_SIZE = (256, 192)  # width, height: one tile of the tiny stand-ins' native input


def run(
    frames: int,
    size: tuple[int, int],
    model_size: str,
    workers: int,
    home: Path,
    precision: str = "auto",
    batch_size: int = 4,
    chunk_frames: int = 8,
    passes: str | None = None,
    plate: str = "person",
    tiles: str = "people",
) -> dict:
    from flows.cluster import dask_client
    from flows.demo import DEMO_COLORSPACE, write_demo_plate
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot
    from schemas.catalog import open_catalog
    from schemas.settings import Settings
    from schemas.spec import parse_spec

    settings = Settings(home=home, allowed_roots=[str(home)], local_workers=workers)
    if plate in ("person", "distant"):
        from bench.io import write_plates

        pattern = write_plates(
            home / f"plate{frames}", size[1], size[0], frames, "realistic", figure=plate
        )
    else:
        pattern = write_demo_plate(home / f"plate{frames}", frames, *size)
    spec = parse_spec(
        {
            "plate": pattern,
            "show": "bench",
            "sequence": "sq",
            "shot": f"sh{frames}",
            "colorspace": DEMO_COLORSPACE if plate == "demo" else "lin_rec709",
            "model_size": model_size,
            "tiles": tiles,
            "output_root": str(home / "out"),
            "chunk_frames": chunk_frames,
            "review_clips": False,
            "precision": precision,
            "batch_size": batch_size,
            **({"passes": passes} if passes else {}),
        }
    )
    catalog = open_catalog(settings.catalog)
    with dask_client(settings) as client:
        # warm every worker (imports, model load) outside the timing: a small plate of one
        # single-frame chunk per worker, so that a large model's frame costs seconds here
        warm_plate = write_demo_plate(home / "warm", workers, *WARM_SIZE)
        warm = {**spec.model_dump(mode="json"), "plate": warm_plate, "shot": "warm"}
        warm = parse_spec({**warm, "chunk_frames": 1, "frames": None})
        warm_start = time.perf_counter()
        run_planned_shot(plan_shot(warm, settings), catalog, client)
        start = time.perf_counter()
        warm_s = start - warm_start
        with RssSampler(client) as sampler:
            plan = plan_shot(spec, settings)
            result = run_planned_shot(plan, catalog, client)
        wall = time.perf_counter() - start
    busy = result.chunk_wall_s  # summed over workers
    return {
        "frames": frames,
        "size": f"{size[0]}x{size[1]}",
        "model_size": model_size,
        "workers": workers,
        "precision": {"asked": precision, "ran": result.precisions},
        "compile": os.environ.get("SVFX_COMPILE", "auto"),
        "batch_size": batch_size,
        "chunk_frames": chunk_frames,
        "passes": list(spec.passes),
        "plate": plate,
        "tiles": tiles,
        "person_gate": "none: every tile"
        if tiles == "all"
        else os.environ.get("SVFX_PERSON_GATE", "the model's look"),
        **frame_tiles(catalog, result.job_id, frames),
        "status": result.status,
        "warm_up_s": round(warm_s, 2),  # model loads (and, with --compile, compiling)
        "wall_s": round(wall, 2),
        "frames_per_s": round(frames / wall, 3),
        "model_share_per_worker": {
            worker: round(model / spent, 3) if spent else None
            for worker, (spent, model) in sorted(result.worker_time.items())
        },
        "worker_rss": sampler.summary(),
        # wall time the workers were not busy, per frame (planning, dispatch, catalog, finalize)
        "flow_overhead_s_per_frame": round(max(0.0, wall - busy / workers) / frames, 4),
    }


def frame_tiles(catalog: Any, job_id: int, frames: int) -> dict[str, float | None]:
    """Per frame, from the catalog: the tiles the tiled passes ran and skipped, and the
    person gate's look in seconds (the worker's own time for it)."""
    from sqlalchemy import select

    from schemas.catalog.models import JobFrame

    with catalog.engine.connect() as conn:
        rows = conn.execute(
            select(JobFrame.tiles_run, JobFrame.tiles_skipped, JobFrame.timings).where(
                JobFrame.job_id == job_id
            )
        ).all()
    run = [r.tiles_run for r in rows if r.tiles_run is not None]
    skipped = [r.tiles_skipped for r in rows if r.tiles_skipped is not None]
    look = [r.timings.get("look") for r in rows if r.timings.get("look") is not None]
    return {
        "tiles_run_per_frame": round(sum(run) / frames, 2) if run else None,
        "tiles_skipped_per_frame": round(sum(skipped) / frames, 2) if skipped else None,
        "look_s_per_frame": round(statistics.mean(look), 4) if look else None,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--frames", type=int, default=200)
    p.add_argument("--size", default="1920x1080")
    p.add_argument("--model-size", default="tiny")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--precision", default="auto", help="auto|fp32|bf16|fp16, as `svfx submit`")
    p.add_argument("--batch-size", type=int, default=4, help="the models' sub-batch, as submit")
    p.add_argument(
        "--chunk-frames",
        type=int,
        default=8,
        help="frames per chunk, as submit: a shot of fewer chunks than workers leaves some idle",
    )
    p.add_argument("--passes", default=None, help="comma-separated, as submit (default: all)")
    p.add_argument(
        "--plate",
        choices=("person", "distant", "demo"),
        default="person",
        help="the stand-ins' person figure, one 60 px figure, or the demo's astronaut",
    )
    p.add_argument("--tiles", choices=("people", "all"), default="people", help="as submit")
    p.add_argument(
        "--gate",
        choices=("standin", "model"),
        default="standin",
        help="with --tiles people: the look's probabilities from the figure's stand-in "
        "(default; --plate person only) or the untrained model's own",
    )
    compiling = p.add_mutually_exclusive_group()
    compiling.add_argument(
        "--compile", action="store_true", help="workers compile every model (SVFX_COMPILE=1)"
    )
    compiling.add_argument(
        "--no-compile",
        action="store_true",
        help="workers compile no model (SVFX_COMPILE=0; by default real models compile on "
        "a GPU with Triton, and on a CPU with a C++ compiler)",
    )
    p.add_argument(
        "--default-allocator",
        action="store_true",
        help="workers with Dask's own malloc settings, not the ones the platform gives them",
    )
    args = p.parse_args(argv)
    if args.default_allocator:
        import flows.allocator

        flows.allocator.ALLOCATOR_ENV.clear()  # the nannies pass Dask's pre-spawn defaults alone
    if args.compile or args.no_compile:
        os.environ["SVFX_COMPILE"] = "1" if args.compile else "0"  # the workers inherit it
    if args.tiles == "people" and args.gate == "standin":
        if args.plate == "demo":
            p.error("--gate standin knows only the stand-ins' figures: --gate model")
        os.environ["SVFX_PERSON_GATE"] = "bench.standins:figure_look"  # the workers inherit it
    w, h = (int(v) for v in args.size.lower().split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SVFX_HOME"] = tmp
        out = run(
            args.frames,
            (w, h),
            args.model_size,
            args.workers,
            Path(tmp),
            args.precision,
            args.batch_size,
            args.chunk_frames,
            args.passes,
            args.plate,
            args.tiles,
        )
        print(json.dumps(out))


if __name__ == "__main__":
    main()
