"""How busy the flow keeps a GPU worker's device, on any machine: the same shot (a) as one
``process_chunk`` of every frame in this process (the worker's stages alone, as ``bench.gpu``'s
shot section runs them) and (b) through the real flow (``flows.shot_runner``, as ``svfx
submit`` and ``bench.shot``: SQLite catalog, a LocalCluster of one GPU worker, the chunks
dispatched with the GPU resource) at each chunk size asked for.

Without ``--real`` the device is ``bench.sleep_device``'s stand-in: model calls that sleep a
known time per input (by default the H100's Sapiens2-1B rate) with realistic outputs, so every
host cost is real and the device's busy share is exact; it goes into the flow's worker through
a Dask worker plugin the bench registers. With ``--real`` the worker runs the models the flow
plans (untrained, ``--model-size``) on its own device: on a GPU node, the figures of the issue
(frames/s, the networks' share of wall time from the predictor's device timer).

Per run: frames/s; the device's busy share of the run's wall time and where its idle time
falls (before the first call, at chunk boundaries, within chunks, after the last call: the last
chunk's tail and the shot's finishing work); the flow's overhead against the direct run; host
core-s per frame (this process and the worker); the worker's RSS over the shot.

    python -m bench.flow_idle --frames 16 --size 1920x1080 --chunk-frames 8,2 --device-s 0.15
    python -m bench.flow_idle --frames 48 --size 4096x2160 --chunk-frames 8,2   # stand-in
    python -m bench.flow_idle --frames 48 --size 4096x2160 --real --model-size 1b --chunk-frames 8

The last on a GPU node (the worker stages alone, for the flow's overhead: ``python -m bench.gpu
--sections shot`` in the same session). On a machine whose host is slower than the stand-in
device, raise ``--device-s`` so the device stays the bottleneck, as on a GPU node.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.io import DENSE, chunk_job, write_plates

COLORSPACE = "lin_rec709"  # bench.io's plate


def direct(pattern: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """(a): one process_chunk of every frame in this process."""
    import tasks.chunk_worker as chunk_worker
    from bench import sleep_device
    from tasks.chunk_worker import process_chunk, size_encoder_threads

    size_encoder_threads(on_cpu=False)  # a GPU worker's pool (once per process)
    size = _size(args.size)
    job = chunk_job(pattern, root / "direct", args.frames, size, _passes(args), **_spec(args))
    predictor = sleep_device.sleep_predictor(tuple(job.checkpoints), args.arch)
    chunk_worker.FrameInference = sleep_device.sleep_inference(args.device_s)
    warm = chunk_job(pattern, root / "direct-warm", 1, size, _passes(args), **_spec(args))
    process_chunk(warm, predictor=predictor)  # the real model stage once (a frame's arrays)
    sleep_device.take_log()
    usage = _cpu_s()
    start = time.monotonic()
    summary = process_chunk(job, predictor=predictor)
    end = time.monotonic()
    failed = [f.error for f in summary.frames if f.status != "done"]
    if failed:
        raise RuntimeError(f"{len(failed)} frames failed: {failed[:2]}")
    out = _figures(args.frames, end - start, _cpu_s() - usage)
    out["device"] = sleep_device.busy_figures(sleep_device.take_log(), start, end)
    out["peak_rss_mb"] = round(summary.peak_rss_mb)
    return out


def through_flow(pattern: str, root: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """(b): the shot through ``run_planned_shot`` at each chunk size, on one warm cluster."""
    from distributed import Client

    from bench.shot import RssSampler
    from flows.cluster import start_local_cluster
    from flows.worker_memory import return_freed_memory
    from schemas.catalog import open_catalog
    from schemas.settings import Settings

    settings = Settings(home=root, allowed_roots=[str(root)], local_workers=1)
    catalog = open_catalog(settings.catalog)
    cluster = start_local_cluster(gpus=None if args.real else 1)
    runs = []
    with Client(cluster) as client:
        return_freed_memory(client)
        if not args.real:
            from bench.sleep_device import SleepDevice

            client.register_plugin(SleepDevice(args.arch, args.device_s))
        warm_start = time.monotonic()
        _flow_shot(client, catalog, settings, pattern, root, args, 1, "warm")
        warm_s = time.monotonic() - warm_start
        for chunk in (int(c) for c in args.chunk_frames.split(",")):
            _take_logs(client)
            with RssSampler(client) as sampler:
                run = _flow_shot(client, catalog, settings, pattern, root, args, chunk, f"c{chunk}")
            run["worker_rss"] = sampler.summary()
            run["warm_up_s"] = round(warm_s, 1)
            runs.append(run)
    cluster.close()
    return runs


def _flow_shot(client, catalog, settings, pattern, root, args, chunk, name) -> dict[str, Any]:
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot
    from schemas.spec import parse_spec

    frames = 1 if name == "warm" else args.frames
    spec = parse_spec(
        {
            "plate": pattern,
            "frames": f"1001-{1000 + frames}",
            "show": "bench",
            "sequence": "idle",
            "shot": name,
            "colorspace": COLORSPACE,
            "model_size": args.model_size,
            "output_root": str(root / "out"),
            "chunk_frames": chunk,
            "passes": ",".join(_passes(args)),
            **_spec(args),
        }
    )
    usage = _cpu_s() + _worker_cpu_s(client)
    start = time.monotonic()
    plan = plan_shot(spec, settings)
    result = run_planned_shot(plan, catalog, client)
    end = time.monotonic()
    if result.status != "complete":
        raise RuntimeError(f"{name}: {result.status}: {result.failed}")
    out = _figures(frames, end - start, _cpu_s() + _worker_cpu_s(client) - usage)
    out.update(chunk_frames=chunk, worker_stages_s=round(result.chunk_wall_s, 2))
    out["model_share_of_chunks"] = {
        worker: round(model / spent, 3) if spent else None
        for worker, (spent, model) in result.worker_time.items()
    }
    models = sum(model for _spent, model in result.worker_time.values())
    out["networks_share_of_wall"] = round(models / (end - start), 3)
    out["peak_device_mb"] = client.run(_peak_device_mb)
    if not args.real:
        from bench.sleep_device import busy_figures

        out["device"] = busy_figures(_take_logs(client), start, end)
    return out


def _take_logs(client) -> dict[str, list]:
    from bench.sleep_device import take_log

    merged: dict[str, list] = {"calls": [], "chunks": []}
    for log in client.run(take_log).values():
        for key in merged:
            merged[key] += log[key]
    return merged


def _peak_device_mb() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def _worker_cpu_s(client) -> float:
    return sum(client.run(_cpu_s).values())


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _figures(frames: int, wall: float, cpu: float) -> dict[str, Any]:
    return {
        "frames": frames,
        "wall_s": round(wall, 2),
        "frames_per_s": round(frames / wall, 3),
        "host_core_s_per_frame": round(cpu / frames, 2),
    }


def _size(text: str) -> tuple[int, int]:
    w, h = (int(v) for v in text.lower().split("x"))
    return w, h


def _passes(args: argparse.Namespace) -> list[str]:
    return [p.strip() for p in args.passes.split(",")]


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    spec = {"review_clips": False, "tiles": "all", "batch_size": args.batch_size}
    return {**spec, "precision": "auto" if args.real else "fp32"}


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def main(argv: list[str] | None = None) -> None:
    from bench.common import as_a_worker_runs
    from bench.sleep_device import H100_1B_S_PER_INPUT

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--frames", type=int, default=48)
    p.add_argument("--size", default="4096x2160")
    p.add_argument("--chunk-frames", default="8,2", help="comma-separated: one flow run each")
    p.add_argument("--passes", default=",".join(DENSE))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--device-s",
        type=float,
        default=H100_1B_S_PER_INPUT,
        help="the stand-in device's seconds per model input (default: an H100's 1B rate)",
    )
    p.add_argument("--arch", default="1b", help="the model size whose input the stand-in takes")
    p.add_argument("--real", action="store_true", help="the planned models on the worker's device")
    p.add_argument("--model-size", default="tiny", help="the planned checkpoints' size")
    p.add_argument("--no-direct", action="store_true", help="skip (a), the in-process run")
    p.add_argument("--no-flow", action="store_true", help="skip (b), the runs through the flow")
    args = p.parse_args(argv)
    as_a_worker_runs("bench.flow_idle", False, argv)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["SVFX_HOME"] = tmp
        w, h = _size(args.size)
        pattern = write_plates(root / "plate", h, w, args.frames, "realistic")
        out: dict[str, Any] = {"size": args.size, "frames": args.frames}
        out["device_s_per_input"] = None if args.real else args.device_s
        if not (args.no_direct or args.real):
            out["direct"] = direct(pattern, root, args)
            print(json.dumps(_rounded(out["direct"])), flush=True)
        if not args.no_flow:
            out["flow"] = through_flow(pattern, root, args)
        print(json.dumps(_rounded(out)), flush=True)


if __name__ == "__main__":
    main()
