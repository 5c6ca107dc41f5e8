"""A frame's arrays go to the host on their own stream: the copy of frame n runs while the GPU
computes frame n+1 (read off CUDA events: the copy's own, ``HostTransfer.copy_started`` and
``copied``, against events around the next frame's work on the compute stream), and what
arrives is frame n's, untouched by frame n+1 reusing the device memory it was copied from."""

from __future__ import annotations

import numpy as np
import torch

import sapiens
from sapiens.seg_classes import SEG_CLASSES
from schemas.passes import model_task
from tasks.frame_inference import FrameInference
from tests.cuda import CUDA
from tests.frame_helpers import frame_spec, read_frame
from tests.model_helpers import tiny

pytestmark = CUDA

HEIGHT, WIDTH = 2160, 3840  # a UHD frame: about 600 MB of arrays to copy back
PASSES = ("normal", "albedo", "matte", "seg")


def _pinned_plate(seed: int) -> np.ndarray:
    """A random plate in page-locked memory, as the chunk worker's reader makes them."""
    rgb = torch.empty((HEIGHT, WIDTH, 3), dtype=torch.float32, pin_memory=True).numpy()
    rgb[:] = np.random.default_rng(seed).random((HEIGHT, WIDTH, 3), dtype=np.float32)
    return rgb


def _timed_event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def test_the_copy_of_one_frame_runs_beside_the_compute_of_the_next():
    models = {name: tiny(model_task(name), seed=i) for i, name in enumerate(PASSES, 1)}
    predictor = sapiens.Predictor(models, device="cuda", batch_size=8)
    spec = frame_spec(PASSES, batch_size=8, previews=False)
    inference = FrameInference(spec, predictor, SEG_CLASSES)
    first_plate, second_plate = _pinned_plate(1), _pinned_plate(2)
    # Two frames first, as a worker's first frames: they take the pinned host blocks the
    # copies land in (page-locking 600 MB took 0.7 s on the thread that feeds the GPU, on an
    # H100 host), which go back to torch's caching host allocator once the writers are done
    # with the arrays; every later frame reuses them.
    warm = [inference.run([read_frame(plate, 1000)])[0] for plate in (first_plate, second_plate)]
    expected = {key: array.copy() for key, array in warm[0].arrays.wait().items()}
    warm[1].arrays.wait()
    del warm
    torch.cuda.synchronize()

    origin = _timed_event()
    (first,) = inference.run([read_frame(first_plate, 1001)])
    compute_started = _timed_event()  # on the compute stream, after frame 1's work
    (second,) = inference.run([read_frame(second_plate, 1002)])
    compute_ended = _timed_event()
    got = first.arrays.wait()
    second.arrays.wait()
    torch.cuda.synchronize()

    copy = first.arrays
    assert copy.copy_started is not None and copy.copied is not None

    def at(event: torch.cuda.Event) -> float:
        return origin.elapsed_time(event)  # ms since origin

    copy_start, copy_end = at(copy.copy_started), at(copy.copied)
    work_start, work_end = at(compute_started), at(compute_ended)
    copied_ms = copy_end - copy_start
    overlap = min(copy_end, work_end) - max(copy_start, work_start)
    size = sum(array.nbytes for array in got.values())
    print(
        f"copy of frame 1: {copy_start:.1f}-{copy_end:.1f} ms ({size / 1e6:.0f} MB, "
        f"{size / copied_ms / 1e6:.1f} GB/s); frame 2's compute: {work_start:.1f}-{work_end:.1f} "
        f"ms; overlap {overlap:.1f} ms"
    )
    assert copied_ms > 0.5 and size > 500e6  # a real copy, not an empty one
    assert work_end - work_start > copied_ms  # the next frame's work outlasts the copy
    assert overlap >= 0.9 * copied_ms  # the copy ran beside it, not before or after it

    # frame 1's arrays, not frame 2's (another plate): the device memory they were copied
    # from was not handed to frame 2 before the copy read it (as close as two runs of the
    # same frame on the same device can be)
    assert sorted(got) == sorted(expected)
    for key, want in expected.items():
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(got[key], want, rtol=1e-3, atol=1e-3, err_msg=key)
        else:
            assert np.mean(got[key] != want) <= 1e-4, key
