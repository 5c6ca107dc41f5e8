"""The per-chunk worker routine on a real (tiny, UNTRAINED) model set: outputs written and read
back, bad frames failing alone with their reason, models kept resident, reruns idempotent."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import OpenEXR
import pytest
from PIL import Image

from schemas.spec import parse_spec
from storage.zarr_store import read_stored_frame
from tasks.chunk_worker import default_focal, process_chunk
from tasks.model_cache import worker_precision
from tests.shot_helpers import SMALL, make_plate, small_chunk_job, spec_data

FRAMES = (1001, 1002, 1003, 1004, 1005)


@pytest.fixture(scope="module")
def shot(tmp_path_factory):
    root = tmp_path_factory.mktemp("chunk")
    pattern = make_plate(root / "plates", frames=3)
    plates = root / "plates"
    # frame 1004: truncated EXR; frame 1005: a plate of another size
    data = (plates / "astronaut.1003.exr").read_bytes()
    (plates / "astronaut.1004.exr").write_bytes(data[: len(data) // 3])
    make_plate(root / "other", frames=1, size=(200, 100))
    shutil.copy(root / "other" / "astronaut.1001.exr", plates / "astronaut.1005.exr")
    spec = parse_spec(spec_data(pattern, root / "out", chunk_frames=8, model_size="tiny"))
    job = small_chunk_job(root, pattern, spec, FRAMES, provenance={"svfx/job": "7"})
    first = process_chunk(job)
    second = process_chunk(job)
    return job, first, second


@pytest.mark.slow
def test_good_frames_are_done_and_bad_ones_fail_alone_with_reasons(shot):
    _, summary, _ = shot
    status = {f.frame: f.status for f in summary.frames}
    assert status == {1001: "done", 1002: "done", 1003: "done", 1004: "failed", 1005: "failed"}
    errors = {f.frame: f.error for f in summary.frames if f.error}
    assert "astronaut.1004.exr" in errors[1004] and "1004" in errors[1004]
    assert "astronaut.1005.exr" in errors[1005] and "200x100" in errors[1005]
    assert "320x180" in errors[1005]


def test_exr_parts_provenance_and_values(shot):
    job, summary, _ = shot
    done = next(f for f in summary.frames if f.frame == 1002)
    exr = [o for o in done.outputs if o.kind == "exr"]
    assert {o.part for o in exr} == {"N", "P", "albedo", "matte", "CryptoBodyPart", "seg"}
    path = job.paths.exr(1002)
    assert {o.uri for o in exr} == {path}
    with OpenEXR.File(path) as f:
        names = [part.name() for part in f.parts]
        assert names == ["N", "P", "albedo", "matte", "CryptoBodyPart", "seg"]
        header = f.parts[0].header
        assert "random weights" in header["sapiens2/UNTRAINED"]
        assert header["svfx/job"] == "7"
        normals = np.stack([f.parts[0].channels[f"N.{c}"].pixels for c in "xyz"], -1)
        seg_id = f.parts[5].channels["seg.id"].pixels
    assert normals.shape == (180, 320, 3) and normals.dtype == np.float16
    np.testing.assert_allclose(np.linalg.norm(normals.astype(np.float32), axis=-1), 1, atol=2e-3)
    stored = read_stored_frame(job.paths.zarr, 1)
    np.testing.assert_array_equal(stored["normal"], normals)
    np.testing.assert_array_equal(stored["seg"], seg_id.astype(np.uint8))
    assert stored["pose"].shape == (20, 308, 3)


def test_every_output_is_recorded_with_a_checksum(shot):
    _, summary, _ = shot
    done = next(f for f in summary.frames if f.frame == 1001)
    kinds = {(o.kind, o.pass_name) for o in done.outputs}
    for name in ("normal", "pointmap", "albedo", "matte", "seg"):
        assert ("exr", name) in kinds and ("zarr", name) in kinds and ("preview", name) in kinds
    assert ("zarr", "pose") in kinds and ("pose_json", "pose") in kinds
    for record in done.outputs:
        assert len(record.sha256) == 64 and record.cache_key == done.cache_key
        if record.kind != "zarr":
            assert Path(record.uri).is_file()
        if record.kind == "preview":  # every preview shows the whole frame, pose's too
            assert record.shape == (SMALL[1], SMALL[0], 3), record
            assert Image.open(record.uri).size == SMALL
    assert done.plate_sha256 and len(done.plate_sha256) == 64
    assert {"read", "colour", "infer", "write_exr", "write_zarr"} <= set(done.timings)


def test_models_stay_resident_and_a_rerun_rewrites_the_same_bytes(shot):
    _, first, second = shot
    assert second.load_s == 0.0
    auto = worker_precision("auto")  # what this machine's CPU and the accuracy gate give
    assert first.model_s > 0 and first.environment["precision"] == auto.name
    assert first.environment["precision_reason"] == auto.reason
    compiled = first.environment["compiled"]  # every model named, with the choice and why
    assert compiled.endswith(": not compiled: auto: a 192x256 (w x h) stand-in runs eagerly")
    before = {(o.uri, o.part, o.kind): o.sha256 for f in first.frames for o in f.outputs}
    after = {(o.uri, o.part, o.kind): o.sha256 for f in second.frames for o in f.outputs}
    exr_before = {k: v for k, v in before.items() if k[2] in ("exr", "zarr")}
    assert exr_before and all(after[k] == v for k, v in exr_before.items())


def test_default_focal_is_the_canonical_camera_scaled_to_the_frame():
    assert default_focal(1024, 768) == pytest.approx(768)
    assert default_focal(1080, 1920) == pytest.approx(768 * 1920 / 1024)


def test_two_chunks_at_once_take_the_device_in_turn_and_read_meanwhile(tmp_path, monkeypatch):
    """A GPU worker runs two chunks at once (`flows.cluster.CHUNKS_PER_GPU`): their model
    stages never overlap, and one chunk reads its frames while the other has the device."""
    import threading
    import time

    import tasks.chunk_worker as chunk_worker
    from tasks.frame_inference import FrameInference
    from tasks.frame_reading import FrameReader

    pattern = make_plate(tmp_path / "plates", frames=6)
    spec = parse_spec(spec_data(pattern, tmp_path / "out", passes="matte", chunk_frames=3))
    first = small_chunk_job(tmp_path / "a", pattern, spec, (1001, 1002, 1003))
    second = small_chunk_job(tmp_path / "b", pattern, spec, (1004, 1005, 1006))
    process_chunk(first)  # the models resident, as on a warm worker
    stages: dict[int, list[tuple[float, float]]] = {}  # chunk's first frame -> model groups
    reads: dict[int, float] = {}  # frame -> when its reading began

    class Slow(FrameInference):
        def run(self, group):
            began = time.monotonic()
            time.sleep(0.2)  # a device slow enough for the other chunk to want it meanwhile
            out = super().run(group)
            chunk = 1001 if group[0].number <= 1003 else 1004
            stages.setdefault(chunk, []).append((began, time.monotonic()))
            return out

    real_read = FrameReader.read

    def read(self, number, uri, summary):
        reads.setdefault(number, time.monotonic())
        return real_read(self, number, uri, summary)

    monkeypatch.setattr(chunk_worker, "FrameInference", Slow)
    monkeypatch.setattr(FrameReader, "read", read)
    summaries = {}
    threads = [
        threading.Thread(target=lambda j=job: summaries.__setitem__(j.frames[0], process_chunk(j)))
        for job in (first, second)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(f.status == "done" for s in summaries.values() for f in s.frames)
    spans = {chunk: (calls[0][0], calls[-1][1]) for chunk, calls in stages.items()}
    earlier, later = sorted(spans, key=lambda chunk: spans[chunk])
    assert spans[earlier][1] <= spans[later][0]  # in turn, each stage whole
    assert reads[later] < spans[earlier][1]  # the later chunk read while the first had the device
