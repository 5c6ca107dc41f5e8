"""The pipeline's own cost per frame around the model: the worker's real stages with a stand-in
network instead of Sapiens (``bench.standins.StandInNetwork``, whose own time is left out).

    read             fetch, sha256 and decode the plate EXR
    colour           OpenColorIO to the model's encoding
    tiles, pre/post  upload, desqueeze, tiles, the predictor's pre- and post-processing
                     (normalising, softmax...)                                  [device]
    blend            feathered blending into the frame's accumulators           [device]
    finish           normals, labels, Cryptomatte ranks, half, previews         [device]
    albedo colour    albedo back to scene-linear (OpenColorIO, CPU only)
    exr              the multi-part EXR (ZIP, OpenEXR's thread pool)
    zarr             the frame's Zarr region (Blosc lz4)
    other            interleaving for Zarr, previews, frame record, bookkeeping

[device] stages run on the model's device: here the CPU, so they count; on a GPU worker they
leave the host.

The process runs with the glibc allocator settings of the platform's workers
(`--default-allocator` to leave them). Two runs per size: a staged one (one stage at a time,
core-seconds per stage from ``time.process_time``, which counts every thread of the process;
per frame over the frames after the first, the first frame's total said apart: it also pays
what a worker pays once, its first tensors paged in) and the worker itself
(``process_chunk``: reader, device and writer stages overlapped) for wall frames/s.
``--content realistic`` (default) gives outputs that look like real passes (smooth normals and
depth inside a person-shaped region, a few body parts with soft edges, a soft alpha);
``noise`` is independent random values per pixel, the worst case for every codec.
``--codecs`` adds a table of every lossless EXR codec and ZIP's deflate levels on one frame's
parts. Weights: none (stand-ins); speed does not depend on them.

    python -m bench.io --sizes 4096x2160 --frames 3               # docs/performance/worker.md
    python -m bench.io --sizes 4096x2160 --frames 3 --content noise --codecs
"""

from __future__ import annotations

import argparse
import ctypes
import io
import os
import resource
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import OpenEXR
import torch

from bench.common import as_a_worker_runs
from schemas.passes import zarr_arrays

DENSE = ("normal", "pointmap", "albedo", "matte", "seg")


class Stages:
    """Core-seconds per stage (`time.process_time`), and the kernel's share of them."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.sys: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start, sys_start = time.process_time(), os.times().system
        try:
            yield
        finally:
            self.cpu[name] += time.process_time() - start
            self.sys[name] += os.times().system - sys_start

    def split(self) -> Stages:
        """The figures so far, as a Stages of their own; this one starts again from zero."""
        before = Stages()
        before.cpu.update(self.cpu)
        before.sys.update(self.sys)
        self.cpu.clear()
        self.sys.clear()
        return before

    def timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.stage(name):
                return function(*args, **kwargs)

        return wrapper


def write_plates(
    directory: Path, height: int, width: int, frames: int, content: str, figure: str = "person"
) -> str:
    """A plate sequence (half RGB, ZIP) of the stand-in's person figure (``figure``
    "distant": one 60 px figure); its pattern. Frames are made on every core (numpy and
    OpenEXR leave the GIL for the big work)."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.standins import distant_plate, person_plate

    draw = distant_plate if figure == "distant" else person_plate

    directory.mkdir(parents=True)
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}

    def write(index: int) -> None:
        rgb = draw(height, width, frame=index)
        path = directory / f"plate.{1001 + index:04d}.exr"
        OpenEXR.File(header, {"RGB": rgb.astype(np.float16)}).write(str(path))

    with ThreadPoolExecutor(min(frames, os.cpu_count() or 1)) as pool:
        list(pool.map(write, range(frames)))
    return str(directory / "plate.####.exr")


def chunk_job(
    pattern: str, out: Path, frames: int, size: tuple[int, int], passes: list[str], **spec: Any
) -> Any:
    """A chunk job of every frame, its store created, with stand-in checkpoint facts."""
    from schemas.passes import model_task
    from schemas.spec import parse_spec
    from storage.location import Location
    from storage.zarr_store import create_shot_store, shard_frames
    from tasks.checkpoints.files import CheckpointRef
    from tasks.chunk_worker import ChunkJob
    from tasks.output_paths import ShotOutputPaths

    width, height = size
    numbers = tuple(range(1001, 1001 + frames))
    shot = parse_spec(
        {
            "plate": pattern,
            "show": "bench",
            "sequence": "io",
            "shot": f"sh{width}",
            "colorspace": "lin_rec709",
            "passes": ",".join(passes),
            "output_root": str(out),
            **spec,
        }
    )
    paths = ShotOutputPaths.for_shot(str(out), "bench", "io", f"sh{width}", "v001")
    people = shot.max_people
    per_shard = shard_frames(
        height, width, zarr_arrays(shot.passes), people, shot.chunk_frames
    )  # as planned
    create_shot_store(
        paths.zarr, numbers, height, width, zarr_arrays(shot.passes), people, {}, per_shard
    )
    refs = {
        name: CheckpointRef(f"stand-in:{name}", "0" * 64, "stand-in", model_task(name),
                            trained=False, size_bytes=0)
        for name in passes
    }  # fmt: skip
    return ChunkJob(
        index=0,
        frames=numbers,
        plate_uris=tuple(pattern.replace("####", f"{n:04d}") for n in numbers),
        plate=Location(pattern),
        store_indices=tuple(range(frames)),
        spec=shot.model_dump(mode="json"),
        plate_colorspace="Linear Rec.709 (sRGB)",
        checkpoints=refs,
        paths=paths,
        frame_hw=(height, width),
    )


def staged(job: Any, predictor: Any, stages: Stages) -> Stages:
    """Each frame through the worker's stages one after another, timed per stage. Returns the
    first frame's figures, taken out of ``stages`` when there are more frames: a process's
    first frame also pays what a worker pays once (its first tensors paged in, as
    transparent huge pages with the workers' allocator settings), and the rest is the cost a
    worker pays per frame."""
    import storage.zarr_writer as zarr_writer
    import tasks.blending as blending
    import tasks.frame_inference as inference_module
    import tasks.frame_writing as writing_module
    from sapiens.seg_classes import SEG_CLASSES
    from schemas.spec import ShotSpec
    from schemas.summaries import ChunkContext, FrameSummary
    from tasks.chunk_worker import size_encoder_threads
    from tasks.colour import ColourConversion
    from tasks.frame_inference import FrameInference
    from tasks.frame_reading import FrameReader
    from tasks.frame_writing import FrameWriter

    size_encoder_threads(on_cpu=False)  # every core: as a GPU worker, the model aside
    spec = ShotSpec.model_validate(job.spec)
    colour = ColourConversion(job.plate_colorspace)
    reader = FrameReader(spec, colour, job.frame_hw, ["0" * 64], plate=job.plate)
    inference = FrameInference(spec, predictor, SEG_CLASSES)
    store = zarr_writer.ShotStoreWriter(job.paths.zarr)
    first = stages
    context = ChunkContext("bench", {}, {}, {}, {})
    writer = FrameWriter(
        spec, job.paths, store, colour, context, {"svfx/bench": "io"}, SEG_CLASSES,
        store_index=dict(zip(job.frames, job.store_indices, strict=True)),
    )  # fmt: skip
    patches = [
        (blending.FrameBlender, "add", "blend"),
        (inference_module, "finish_pass", "finish"),
        (writing_module, "write_passes_exr", "exr"),
        (colour, "albedo_to_scene_linear", "albedo colour"),
        (store, "write_prepared", "zarr"),
        (store, "prepare_frame", "zarr"),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, label in patches:
            setattr(owner, name, stages.timed(label, getattr(owner, name)))
        for number, uri in zip(job.frames, job.plate_uris, strict=True):
            summary = FrameSummary(number, uri, "done")
            started = time.process_time()
            read = reader.read(number, uri, summary)
            spent = time.process_time() - started
            wall = summary.timings["read"] + summary.timings["colour"]
            stages.cpu["read"] += spent * summary.timings["read"] / wall
            stages.cpu["colour"] += spent * summary.timings["colour"] / wall
            model_before = _stand_in_seconds(predictor)
            with stages.stage("tiles, pre/post"):
                (frame,) = inference.run([read])
                frame.arrays.wait()
            stages.cpu["tiles, pre/post"] -= _stand_in_seconds(predictor) - model_before
            with stages.stage("other"):
                result = writer.write(frame)
            if result.status != "done":
                raise RuntimeError(result.error)
            if number == job.frames[0] and len(job.frames) > 1:
                first = stages.split()
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        store.close()
    for figures in {id(s): s for s in (stages, first)}.values():
        _nest(figures, "tiles, pre/post", ("blend", "finish"))
        _nest(figures, "exr", ("albedo colour",))
        _nest(figures, "other", ("exr", "albedo colour", "zarr"))
    return first


def _stand_in_seconds(predictor: Any) -> float:
    return sum(getattr(m, "cpu_seconds", 0.0) for m in predictor.models.values())


def _nest(stages: Stages, outer: str, inner: tuple[str, ...]) -> None:
    """Take the ``inner`` stages, timed inside ``outer``, out of it: every stage then counts
    once and they add up to the whole."""
    for name in inner:
        stages.cpu[outer] -= stages.cpu.get(name, 0.0)
        stages.sys[outer] -= stages.sys.get(name, 0.0)


def run(
    height: int,
    width: int,
    frames: int,
    passes: list[str],
    root: Path,
    content: str,
    threads: int | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """``threads``: torch's (the device stages on this CPU), every core by default."""
    import sapiens
    from bench.standins import stand_in_models

    torch.set_num_threads(threads or os.cpu_count() or 1)
    pattern = write_plates(root / f"plates_{width}x{height}", height, width, frames, content)
    predictor = sapiens.Predictor(stand_in_models(passes, content), device="cpu")
    stages = Stages()
    job = chunk_job(pattern, root / "staged", frames, (width, height), passes, **spec)
    first = staged(job, predictor, stages)
    steady = max(1, frames - 1)  # the frames after the first (all of one)
    per_frame = {k: v / steady for k, v in stages.cpu.items()}
    job = chunk_job(pattern, root / "overlapped", frames, (width, height), passes, **spec)
    before = _stand_in_seconds(predictor)
    worker = worker_figures(job, predictor)
    exr_sizes = [Path(job.paths.exr(n)).stat().st_size for n in job.frames]
    return {
        "size": f"{width}x{height}",
        "frames_per_s": worker["frames_per_s"],
        "stand_in_s_per_frame": (_stand_in_seconds(predictor) - before) / frames,
        "worker_core_s_per_frame": worker["host_core_s_per_frame"]
        - (_stand_in_seconds(predictor) - before) / frames,
        "core_s_per_frame": sum(per_frame.values()),
        "first_frame_core_s": sum(first.cpu.values()),
        "all_frames_core_s": sum(first.cpu.values()) / frames
        + (sum(stages.cpu.values()) / frames if first is not stages else 0.0),
        "stages": per_frame,
        "sys_stages": {k: v / steady for k, v in stages.sys.items()},
        "exr_mb": sum(exr_sizes) / len(exr_sizes) / 1e6,
        "parts": job,
    }


def worker_figures(job: Any, predictor: Any) -> dict[str, float]:
    """The worker itself (``process_chunk``: reader, device and writer stages overlapped) over
    ``job`` with ``predictor``: wall frames/s, the seconds inside the networks (the predictor's
    device timer) and their share of the wall time, and the host's core-seconds per frame
    (every thread of this process, user and kernel). Raises if a frame failed."""
    from tasks.chunk_worker import process_chunk

    frames = len(job.frames)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    model_before = predictor.timer.seconds()
    wall = time.perf_counter()
    summary = process_chunk(job, predictor=predictor)
    wall = time.perf_counter() - wall
    model = predictor.timer.seconds() - model_before
    after = resource.getrusage(resource.RUSAGE_SELF)
    failed = [f.error for f in summary.frames if f.status != "done"]
    if failed:
        raise RuntimeError(f"{len(failed)} of {frames} frames failed: {failed[:3]}")
    host = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    return {
        "frames": frames,
        "wall_s": wall,
        "frames_per_s": frames / wall,
        "model_s": model,
        "model_share": model / wall,
        "host_core_s_per_frame": host / frames,
    }


def codec_table(job: Any) -> list[tuple[str, str, float, float]]:
    """Every lossless codec (and ZIP per deflate level) on one written frame's parts:
    (codec, level, core-s, MB)."""
    exr = OpenEXR.File(job.paths.exr(job.frames[0]), separate_channels=True)
    parts = [(part.name(), dict(part.header), dict(part.channels)) for part in exr.parts]
    core = ctypes.CDLL(OpenEXR.__file__)  # the binding carries OpenEXRCore's C API
    codecs = [("NONE", OpenEXR.NO_COMPRESSION), ("RLE", OpenEXR.RLE_COMPRESSION)]
    codecs += [("ZIPS", OpenEXR.ZIPS_COMPRESSION), ("ZIP", OpenEXR.ZIP_COMPRESSION)]
    codecs += [("PIZ", OpenEXR.PIZ_COMPRESSION), ("ZSTD", OpenEXR.ZSTD_COMPRESSION)]
    rows = []
    for name, codec in codecs:
        levels = (1, 4, 6, 9) if name in ("ZIP", "ZIPS") else (None,)
        for level in levels:
            if level is not None:
                core.exr_set_default_zip_compression_level(ctypes.c_int(level))
            out_parts = []
            for part_name, header, channels in parts:
                header = {**header, "compression": codec}
                for key in ("chunkCount", "name"):
                    header.pop(key, None)
                pixels = {key: c.pixels for key, c in channels.items()}
                out_parts.append(OpenEXR.Part(header, pixels, part_name))
            buffer = io.BytesIO()
            started = time.process_time()
            OpenEXR.File(out_parts).write(buffer)
            seconds = time.process_time() - started
            rows.append((name, "" if level is None else str(level), seconds, buffer.tell() / 1e6))
    core.exr_set_default_zip_compression_level(ctypes.c_int(4))  # OpenEXR's default
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="1920x1080,4096x2160", help="comma-separated WxH")
    p.add_argument("--frames", type=int, default=3)
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads for the device stages (default: every core); 1 keeps OpenMP's "
        "waiting threads out of the core-seconds on a machine shared with other work",
    )
    p.add_argument("--passes", default=",".join(DENSE))
    p.add_argument("--content", choices=("realistic", "noise"), default="realistic")
    p.add_argument("--previews", action="store_true", help="write the previews too")
    p.add_argument("--codecs", action="store_true", help="the EXR codec and zip-level table")
    p.add_argument(
        "--default-allocator",
        action="store_true",
        help="glibc's default malloc settings, not the ones the platform's workers run with",
    )
    args = p.parse_args(argv)
    as_a_worker_runs("bench.io", args.default_allocator, argv)
    passes = [s.strip() for s in args.passes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.lower().split("x"))
            r = run(h, w, args.frames, passes, Path(tmp) / size, args.content, args.threads,
                    previews=args.previews, review_clips=False)  # fmt: skip
            stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
            print(
                f"{r['size']:>10}: {r['core_s_per_frame']:.2f} core-s/frame ({stages}); "
                f"{r['frames_per_s']:.3f} frames/s wall with {os.cpu_count()} cores "
                f"({torch.get_num_threads()} torch threads), "
                f"overlapped; EXR {r['exr_mb']:.1f} MB; {args.content} content; "
                f"passes: {args.passes}",
                flush=True,
            )
            print(
                f"{'':>12}(the frames after the first; the first {r['first_frame_core_s']:.2f} "
                f"core-s, what a worker pays once included; all {args.frames} frames "
                f"{r['all_frames_core_s']:.2f} core-s/frame)",
                flush=True,
            )
            kernel = ", ".join(f"{k} {v:.2f}" for k, v in r["sys_stages"].items())
            print(f"{'':>12}of which in the kernel (page faults, file I/O): {kernel}", flush=True)
            print(
                f"{'':>12}(the stand-in network's own {r['stand_in_s_per_frame']:.2f} s/frame "
                "is left out; device stages run on this CPU; the overlapped worker: "
                f"{r['worker_core_s_per_frame']:.2f} core-s/frame, its first frame included)",
                flush=True,
            )
            if args.codecs:
                print(f"{'':>12}codec  level  core-s  MB   (one frame's parts, {args.content})")
                for codec, level, seconds, mb in codec_table(r["parts"]):
                    print(f"{'':>12}{codec:<6} {level:>5}  {seconds:6.2f}  {mb:6.1f}")


if __name__ == "__main__":
    main()
