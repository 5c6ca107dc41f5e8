"""The stabilise worker on CUDA writes what it writes on the CPU (issue 24, part 4: the warps and
the fusion run on the worker's device, the flow on the host either way).

A 6-frame per-frame version (tiny UNTRAINED models on the GPU; every pass in the EXR: relative
depth from Sapiens v1, the rest from Sapiens2), then the same chunk stabilised twice by
``tasks.stabilise.worker`` through ``process_chunk``, as a worker runs it: once with the
worker's device set to the CPU, once to CUDA, each into a version of its own. Every frame of
both is done and recorded with the device that fused it, and every EXR channel agrees within
float rounding (a few half ulps) but at a few stray pixels (``STRAYS``) and, in a channel that
names a class, where two classes' fused probabilities (nearly) tie: either may take the label
and the Cryptomatte rank. A warp or fusion gone wrong on one device differs at most pixels (the
stabilised version differs from the per-frame one at 15-98% of each channel's pixels); the
largest differences are printed.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import numpy as np
import OpenEXR
import pytest

from bench.io import write_plates
from schemas import passes as pass_table
from schemas.spec import parse_spec
from tasks.chunk_worker import process_chunk
from tasks.frame_records import read_frame_record
from tasks.stabilise.settings import METHOD as FUSION_METHOD
from tests.cuda import CUDA
from tests.shot_helpers import SMALL, small_chunk_job, spec_data

pytestmark = CUDA

FRAMES = (1001, 1002, 1003, 1004, 1005, 1006)
# every pass written to the EXR, both families; not pose: its boxes and its smoother run on the
# host whatever the device (and need SciPy, which the GPU kit does not carry)
PASSES = ",".join(spec.name for spec in pass_table.PASSES if spec.exr)
ON = {"v002": "cpu", "v003": "cuda"}  # stabilised version -> the device that fuses it
ROUNDING = 4e-3  # a few half ulps at values near 1 (normals, mattes): |a - b| <= r * max(1, |a|)
TIE = 1e-4  # two fused class probabilities this close may take either order
# The share of a channel's pixels that may differ beyond rounding anyway: a sample position a
# rounding away from halfway between two pixels may take either as its nearest (the samples'
# certainty), an ID may tie with the seventh class (the six Cryptomatte ranks do not store it)
STRAYS = 5e-4
LAYERS = [layer for spec in pass_table.PASSES for layer in spec.exr]
CRYPTOMATTES = [layer.part for layer in LAYERS if layer.cryptomatte]
LABELS = [layer.part for layer in LAYERS if layer.class_names]


@pytest.fixture(scope="module")
def stabilised(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda-stabilise")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SVFX_HOME", str(root))
        # the stand-ins' figure, moving sideways (the demo plate needs scikit-image, which the
        # GPU kit does not carry)
        pattern = write_plates(root / "plates", SMALL[1], SMALL[0], len(FRAMES), "figure")
        data = spec_data(pattern, root / "out", passes=PASSES, chunk_frames=len(FRAMES))
        spec = parse_spec(data)
        source = small_chunk_job(root, pattern, spec, FRAMES)
        made = process_chunk(source)  # the models on the GPU (the worker's default device)
        assert [f.status for f in made.frames] == ["done"] * len(FRAMES), made.frames
        jobs = {}
        for version, device in ON.items():
            mp.setenv("SVFX_DEVICE", device)
            stable = parse_spec(
                {
                    **data,
                    "temporal": "stabilize",
                    "source_version": "v001",
                    "fusion_method": FUSION_METHOD,
                    "version": version,
                }
            )
            job = small_chunk_job(root, pattern, stable, FRAMES, version=version)
            job = replace(job, source=source.paths, checkpoints=source.checkpoints)
            summary = process_chunk(job)
            assert [f.status for f in summary.frames] == ["done"] * len(FRAMES), summary.frames
            jobs[version] = job
        yield jobs


def _channels(path: str) -> dict[str, np.ndarray]:
    with OpenEXR.File(path, separate_channels=True) as exr:
        return {
            f"{part.name()}/{name}": np.array(channel.pixels, dtype=np.float64)
            for part in exr.parts
            for name, channel in part.channels.items()
        }


def _ranks(channels: dict[str, np.ndarray], part: str) -> tuple[list[str], list[np.ndarray]]:
    """A Cryptomatte's ID channels and its coverages, rank by rank (``part00.R`` and ``.G``
    the first, ``.B`` and ``.A`` the second, then ``part01``...)."""
    ids, coverages = [], []
    for layer in sorted(n for n in channels if n.startswith(f"{part}/") and n.endswith(".R")):
        stem = layer.removesuffix(".R")
        ids += [f"{stem}.R", f"{stem}.B"]
        coverages += [channels[f"{stem}.G"], channels[f"{stem}.A"]]
    return ids, coverages


def _near_ties(channels: dict[str, np.ndarray]) -> tuple[set[str], np.ndarray]:
    """The channels that name a class (Cryptomatte IDs, labels) and the pixels where two of the
    stored ranks' probabilities are within ``TIE`` (any Cryptomatte)."""
    named = {n for n in channels if n.split("/")[0] in LABELS}
    tied = np.zeros(next(iter(channels.values())).shape, dtype=bool)
    for part in CRYPTOMATTES:
        ids, coverages = _ranks(channels, part)
        named.update(ids)
        for higher, lower in pairwise(coverages):
            tied |= np.abs(higher - lower) < TIE
    return named, tied


def test_each_version_was_fused_on_its_device(stabilised):
    for version, device in ON.items():
        job = stabilised[version]
        for frame in FRAMES:
            record, context = read_frame_record(job.paths.at(job.paths.frame_record(frame)))
            assert record.status == "done"
            assert context.environment["device"].split(":")[0] == device, (frame, context)


def test_every_channel_fused_on_cuda_equals_the_cpus_within_rounding_and_ties(stabilised):
    cpu, cuda = (stabilised[v] for v in ON)
    worst: dict[str, tuple[float, float]] = {}
    for frame in FRAMES:
        on_cpu = _channels(cpu.paths.at(cpu.paths.exr(frame)).uri)
        on_cuda = _channels(cuda.paths.at(cuda.paths.exr(frame)).uri)
        assert on_cuda.keys() == on_cpu.keys(), frame
        named, tied = _near_ties(on_cpu)
        assert named and any(n.endswith(".u") for n in on_cpu), "labels, IDs and motion written"
        for name, a in on_cpu.items():
            b = on_cuda[name]
            assert a.shape == b.shape, (frame, name)
            differ = np.abs(a - b)
            far = differ > ROUNDING * np.maximum(1.0, np.abs(a))
            if name in named:  # a class's name: either of two tied classes may take it
                far &= ~tied
                differ = np.where(tied, 0.0, differ)
            share, largest = float(far.mean()), float(differ.max(where=~far, initial=0.0))
            assert share <= STRAYS, (frame, name, int(far.sum()), float(differ.max()))
            before = worst.get(name, (0.0, 0.0))
            worst[name] = (max(before[0], share), max(before[1], largest))
    print("\nstabilised on CUDA against the CPU, per channel: the largest share of a frame's")
    print("pixels beyond rounding (ties aside), the largest difference of the others:")
    for name, (share, largest) in sorted(worst.items()):
        print(f"  {name}: {share:.2g}, {largest:.3g}")
