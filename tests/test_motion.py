"""The motion pass: a synthetic plate whose texture moves by a known shift per frame, through
the real chunk worker (tiny UNTRAINED matte model beside it), read back from the EXR (Nuke's
axes: v up) and the Zarr store; zero vectors, with a note, on the side of a hole, a cut or an
unreadable neighbour; the same vectors at a chunk's edges as in its middle; previews; and the
device-side finishing on its own (the stabiliser writes motion through it too)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import OpenEXR
import pytest
import torch
from PIL import Image

from schemas import passes as pass_table
from schemas.spec import parse_spec
from storage.previews import motion_rgb
from storage.zarr_store import read_stored_frame
from tasks.chunk_job import flow_neighbours
from tasks.chunk_worker import process_chunk
from tasks.frame_motion import read_with_motion
from tasks.frame_passes import finish_motion
from tests.plates import write_moving_plate
from tests.shot_helpers import SMALL, small_chunk_job, spec_data

W, H = SMALL
SHIFT = (3.0, -2.0)  # the texture moves 3 px right and 2 px up per frame (image rows: -2)
INNER = (slice(24, -24), slice(24, -24))  # away from the borders, where content enters
ONE_SHOT = (1001, 1002, 1003, 1004)  # texture A moving; 1005 is a hole
LATER = (1006, 1007, 1008, 1009)  # A moving on; a cut to texture B at 1008; 1010 unreadable


def _write_plate(directory: Path) -> str:
    dx, dy = (int(v) for v in SHIFT)
    pattern = write_moving_plate(directory, (*ONE_SHOT, *LATER), SMALL, (dx, dy), cut_at=1008)
    good = (directory / "shift.1009.exr").read_bytes()
    (directory / "shift.1010.exr").write_bytes(good[: len(good) // 3])  # unreadable
    return pattern


def _job(root: Path, pattern: str, frames: tuple[int, ...], chunks: list[tuple[int, ...]], **kw):
    """One chunk job per entry of ``chunks`` over one store of ``frames``, each with the
    neighbours the planner gives it (the plate has every frame but the hole, 1005)."""
    spec = parse_spec(spec_data(pattern, root / "out", model_size="tiny", **kw))
    whole = small_chunk_job(root, pattern, spec, frames, version=kw.get("version", "v001"))
    present = frozenset(range(1001, 1011)) - {1005}
    jobs = []
    for chunk in chunks:
        jobs.append(
            replace(
                whole,
                frames=chunk,
                plate_uris=tuple(pattern.replace("####", str(f)) for f in chunk),
                store_indices=tuple(frames.index(f) for f in chunk),
                neighbours={
                    n: pattern.replace("####", str(n)) for n in flow_neighbours(chunk, present)
                },
            )
        )
    return jobs


def _exr_motion(path: str) -> dict[str, np.ndarray]:
    with OpenEXR.File(path, separate_channels=True) as exr:
        (part,) = [p for p in exr.parts if p.name() == "motion"]
        return {name: c.pixels.copy() for name, c in part.channels.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("motion")
    pattern = _write_plate(root / "plates")
    passes = "motion,matte"
    (one,) = _job(root, pattern, ONE_SHOT, [ONE_SHOT], passes=passes)
    two = _job(root, pattern, ONE_SHOT, [(1001, 1002), (1003, 1004)], passes=passes, version="v002")
    (later,) = _job(root, pattern, LATER, [LATER], passes=passes, version="v003")
    return {
        "one": (one, process_chunk(one)),
        "two": [(job, process_chunk(job)) for job in two],
        "later": (later, process_chunk(later)),
    }


def test_vectors_and_their_signs_in_the_exr_and_the_zarr_store(runs):
    job, summary = runs["one"]
    assert [f.status for f in summary.frames] == ["done"] * 4
    dx, dy = SHIFT
    channels = _exr_motion(job.paths.exr(1002))
    assert sorted(channels) == sorted(pass_table.MOTION_CHANNELS)
    assert {c.dtype for c in channels.values()} == {np.dtype(np.float16)}
    median = {name: float(np.median(plane[INNER])) for name, plane in channels.items()}
    # forward: where the content goes next frame, in Nuke's axes (v up: -rows)
    assert median["forward.u"] == pytest.approx(dx, abs=0.1)
    assert median["forward.v"] == pytest.approx(-dy, abs=0.1)
    assert median["backward.u"] == pytest.approx(-dx, abs=0.1)
    assert median["backward.v"] == pytest.approx(dy, abs=0.1)
    stored = read_stored_frame(job.paths.zarr, 1, ["motion"])["motion"]  # frame 1002
    assert stored.shape == (H, W, 4) and stored.dtype == np.float16
    for c, name in enumerate(pass_table.MOTION_CHANNELS):  # the EXR's values, in that order
        np.testing.assert_array_equal(stored[..., c], channels[name])
    records = {(o.kind, o.pass_name): o for o in summary.frames[1].outputs}
    assert records["exr", "motion"].part == "motion"
    assert records["zarr", "motion"].shape == (H, W, 4)
    assert "svfx/motion" in _exr_header(job.paths.exr(1002))


def _exr_header(path: str) -> dict:
    with OpenEXR.File(path) as exr:
        return dict(exr.parts[0].header)


def _motion_notes(summary) -> dict[int, list[str]]:
    """Each frame's notes about its motion (the person gate says its own too)."""
    return {f.frame: [n for n in f.notes if "motion" in n] for f in summary.frames}


def test_the_ends_of_the_range_and_a_hole_give_zeros_on_that_side_with_a_note(runs):
    job, summary = runs["one"]
    notes = _motion_notes(summary)
    first, last = _exr_motion(job.paths.exr(1001)), _exr_motion(job.paths.exr(1004))
    assert not first["backward.u"].any() and not first["backward.v"].any()  # no 1000
    assert np.median(first["forward.u"][INNER]) == pytest.approx(SHIFT[0], abs=0.1)
    assert not last["forward.u"].any() and not last["forward.v"].any()  # 1005 is a hole
    assert np.median(last["backward.u"][INNER]) == pytest.approx(-SHIFT[0], abs=0.1)
    assert notes[1001] == [
        "zero backward motion: no frame 1000 in the plate's sequence (a hole, or the end of "
        "the shot's range)"
    ]
    assert len(notes[1004]) == 1 and "zero forward motion: no frame 1005" in notes[1004][0]
    assert notes[1002] == notes[1003] == []
    later_job, later = runs["later"]
    assert "zero backward motion: no frame 1005" in _motion_notes(later)[1006][0]
    assert not _exr_motion(later_job.paths.exr(1006))["backward.u"].any()


def test_a_cut_and_an_unreadable_neighbour_give_zeros_on_that_side(runs):
    job, summary = runs["later"]
    assert [f.status for f in summary.frames] == ["done"] * 4  # no frame fails for it
    notes = _motion_notes(summary)
    before, after = _exr_motion(job.paths.exr(1007)), _exr_motion(job.paths.exr(1008))
    assert not before["forward.u"].any() and not after["backward.u"].any()
    assert np.median(before["backward.u"][INNER]) == pytest.approx(-SHIFT[0], abs=0.1)
    assert np.median(after["forward.u"][INNER]) == pytest.approx(SHIFT[0], abs=0.2)
    assert "zero forward motion: a cut between frames 1007 and 1008" in notes[1007][0]
    assert "zero backward motion: a cut between frames 1007 and 1008" in notes[1008][0]
    last = _exr_motion(job.paths.exr(1009))
    assert not last["forward.u"].any() and last["backward.u"].any()
    (note,) = notes[1009]
    assert note.startswith("zero forward motion: the next frame is unreadable: frame 1010 (")
    assert "shift.1010.exr): " in note


def test_a_chunks_edges_give_the_vectors_of_its_middle(runs):
    one, _ = runs["one"]
    for job, summary in runs["two"]:
        assert [f.status for f in summary.frames] == ["done", "done"]
        for number in job.frames:
            split, whole = _exr_motion(job.paths.exr(number)), _exr_motion(one.paths.exr(number))
            for name in pass_table.MOTION_CHANNELS:
                np.testing.assert_array_equal(split[name], whole[name], err_msg=f"{number} {name}")
        # the neighbour read for flow only is not one of the chunk's frames
        assert [f.frame for f in summary.frames] == list(job.frames)
    assert [sorted(job.neighbours) for job, _ in runs["two"]] == [[1003], [1002]]


def test_the_motion_preview_is_a_colour_wheel_of_the_forward_vectors(runs):
    _, summary = runs["one"]
    (record,) = [
        o for o in summary.frames[1].outputs if (o.kind, o.pass_name) == ("preview", "motion")
    ]
    image = np.asarray(Image.open(record.uri).convert("RGB")).astype(np.int32)
    assert image.shape == (H, W, 3)
    expected = motion_rgb(np.broadcast_to(np.float32(SHIFT), (1, 1, 2)))[0, 0]
    inner = image[INNER].reshape(-1, 3)
    assert np.abs(np.median(inner, axis=0) - expected).max() <= 12  # JPEG, DIS: near


def test_finish_motion_negates_v_scales_the_preview_and_checks_its_input():
    forward = torch.zeros((4, 6, 2))
    forward[..., 0], forward[..., 1] = 2.0, 1.0  # right 2, down 1
    backward = -forward
    out = finish_motion(forward, backward, preview_hw=(2, 6))  # an anamorphic 2:1 preview
    planes = out["motion"]
    assert planes.dtype == torch.float16 and planes.shape == (4, 4, 6)
    assert planes[:, 0, 0].tolist() == [2.0, -1.0, -2.0, 1.0]
    assert not bool(out["nonfinite/motion"])
    preview = out["preview/motion"]
    assert preview.shape == (2, 6, 2)
    assert preview[0, 0].tolist() == [2.0, 0.5]  # in the preview's own pixels, y down
    with pytest.raises(ValueError, match="motion vectors are"):
        finish_motion(forward, backward[..., :1])


def test_the_colour_wheel_shows_direction_as_hue_and_length_as_brightness():
    vectors = np.float32([[[8, 0], [0, 8], [-8, 0], [0, -8], [0, 0], [4, 0]]])
    assert motion_rgb(vectors).tolist() == [
        [[255, 0, 0], [128, 255, 0], [0, 255, 255], [128, 0, 255], [0, 0, 0], [128, 0, 0]]
    ]


def test_the_neighbours_a_chunk_reads_for_flow_only():
    present = frozenset({1, 2, 3, 5, 6, 7, 8})
    assert flow_neighbours((2, 3), present) == [1]  # 4 is a hole
    assert flow_neighbours((5, 7), present) == [6, 8]  # 6 done before: read for flow
    assert flow_neighbours((1,), present) == [2]


def test_an_anamorphic_plates_vectors_are_in_its_stored_squeezed_pixels(tmp_path):
    dx, dy = (int(v) for v in SHIFT)
    pattern = write_moving_plate(
        tmp_path / "plates", (1001, 1002), SMALL, (dx, dy), pixel_aspect=2.0
    )
    (job,) = _job(tmp_path, pattern, (1001, 1002), [(1001, 1002)], passes="motion,matte")
    summary = process_chunk(job)
    assert [f.status for f in summary.frames] == ["done", "done"]
    channels = _exr_motion(job.paths.exr(1001))
    assert np.median(channels["forward.u"][INNER]) == pytest.approx(dx, abs=0.1)  # not 2 dx
    assert np.median(channels["forward.v"][INNER]) == pytest.approx(-dy, abs=0.1)
    with OpenEXR.File(job.paths.exr(1001)) as exr:
        assert exr.parts[0].header["pixelAspectRatio"] == pytest.approx(2.0)
    (preview,) = [
        o for o in summary.frames[0].outputs if (o.kind, o.pass_name) == ("preview", "motion")
    ]
    assert preview.shape[:2] == (144, 512)  # square pixels: the width desqueezed


def test_flow_at_a_reduced_size_is_scaled_to_plate_pixels_on_the_device(tmp_path, monkeypatch):
    """Plates larger than the flow's size (here: flow at half the plate's size) get vectors
    in plate pixels, not flow pixels."""
    import tasks.chunk_worker as chunk_worker
    from tasks.plate_flow import FlowSettings

    half = FlowSettings(max_side=W // 2)
    used = []

    def at_half_size(*args, **kwargs):
        used.append(half)
        return read_with_motion(*args, **kwargs, settings=half)

    monkeypatch.setattr(chunk_worker, "read_with_motion", at_half_size)
    dx, dy = (int(v) for v in SHIFT)
    pattern = write_moving_plate(tmp_path / "plates", (1001, 1002), SMALL, (2 * dx, 2 * dy))
    (job,) = _job(tmp_path, pattern, (1001, 1002), [(1001, 1002)], passes="motion,matte")
    process_chunk(job)
    assert used == [half]
    channels = _exr_motion(job.paths.exr(1001))
    assert np.median(channels["forward.u"][INNER]) == pytest.approx(2 * dx, abs=0.2)
    assert np.median(channels["forward.v"][INNER]) == pytest.approx(-2 * dy, abs=0.2)


def test_a_flow_that_fails_gives_zeros_and_notes_and_every_frame_goes_on(tmp_path, monkeypatch):
    """The reader alone (no model): a pair whose flow raises, and a frame whose flow image
    cannot be made, are said in the frames' notes; no frame is lost or failed for it."""
    import queue

    import tasks.frame_motion as frame_motion
    from storage.location import Location
    from tasks.colour import ColourConversion
    from tasks.frame_reading import FrameReader

    pattern = write_moving_plate(tmp_path, (1001, 1002, 1003, 1004), SMALL, (2, 1))
    spec = parse_spec(spec_data(pattern, tmp_path / "out", passes="motion,matte"))
    reader = FrameReader(spec, ColourConversion("lin_rec709"), (H, W), [], plate=Location(pattern))
    real_pair, real_image = frame_motion.pair_motion, frame_motion.flow_image

    made: list[np.ndarray] = []  # the flow images, in frame order

    def image(rgb, settings):
        if len(made) == 3:  # the fourth frame's
            raise MemoryError("no room")
        made.append(real_image(rgb, settings))
        return made[-1]

    def pair(a, b, settings):
        if a is made[1]:  # frame 1002 to 1003
            raise RuntimeError("DIS broke")
        return real_pair(a, b, settings)

    monkeypatch.setattr(frame_motion, "pair_motion", pair)
    monkeypatch.setattr(frame_motion, "flow_image", image)
    out: queue.Queue = queue.Queue()
    uri = {f: pattern.replace("####", str(f)) for f in (1001, 1002, 1003, 1004)}
    frames = [(f, uri[f], None) for f in (1001, 1002, 1003, 1004)]
    read_with_motion(reader, frames, out, neighbours={})
    reads = []
    while (item := out.get()) is not None:
        reads.append(item)
    assert [r.number for r in reads] == [1001, 1002, 1003, 1004]
    notes = {r.number: r.summary.notes for r in reads}
    assert reads[0].motion.forward is not None and reads[1].motion.backward is not None
    assert reads[1].motion.forward is None and reads[2].motion.backward is None
    assert "zero forward motion: the flow between frames 1002 and 1003 failed" in notes[1002][0]
    assert "zero backward motion: the flow between frames 1002 and 1003 failed" in notes[1003][0]
    assert (
        notes[1003][1]
        == "zero forward motion: the next frame has no flow image (MemoryError('no room'))"
    )
    assert notes[1004][0] == "zero motion: the frame has no flow image (MemoryError('no room'))"
    assert all(r.summary.status == "done" for r in reads)
