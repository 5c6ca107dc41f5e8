"""The chunk worker's motion stage, on its reader thread: the optical flow between each frame
of the chunk and its neighbours in the plate, before the frame goes to the model.

Forward motion of frame f needs plate f+1 and backward motion plate f-1, so the reader walks
the chunk's frames together with the plate frames just outside it (or between its frames,
when frames in between were done before: `ChunkJob.neighbours`), in frame order, and holds
one frame back: f goes to the model once f+1 has been read and the pair's flow computed
(`tasks.plate_flow.pair_motion`, on the luma of the model-encoded RGB the reader makes
anyway, reduced to at most `FlowSettings.max_side`). A neighbour outside the chunk is read
and decoded for its flow image only; its checksum is not taken and nothing of it is written.
What is kept between frames is one flow image (at most 1024 px on its long side, 8 bits) and
the frame held back: memory is flat in the chunk's length.

A side of a frame with no usable neighbour gets zero vectors and a note in the frame's
summary (and the worker's log), never a failed frame: a hole in the frame range or the end
of the shot's range (no frame f+1 in the plate), a neighbour that cannot be read or decoded
(or is of another size), and a cut between the two (the pair's luma histograms disagree or
its flow is consistent almost nowhere: nothing moves across a cut). Vectors stay at flow
resolution here; the model's device scales them to plate pixels (`tasks.plate_flow.to_plate`)
and finishes them (`tasks.frame_passes.finish_motion`).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from schemas.summaries import FrameSummary
from storage.errors import FrameError
from tasks.frame_reading import FrameMotion, FrameReader, ReadFrame, failed
from tasks.plate_flow import DEFAULT_FLOW, FlowSettings, flow_image, pair_motion

log = logging.getLogger("svfx.worker")


@dataclass
class _Held:
    """A frame of the walk: its flow image (None: it could not be read) and, for a frame of
    the chunk, what goes to the model."""

    number: int
    image: np.ndarray | None
    read: ReadFrame | None = None
    why: str = ""  # why there is no image: "is unreadable: ...", said of a neighbour
    flow_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def read_with_motion(
    reader: FrameReader,
    frames: Sequence[tuple[int, str, str | None]],
    out: queue.Queue[ReadFrame | FrameSummary | None],
    *,
    neighbours: Mapping[int, str],
    settings: FlowSettings = DEFAULT_FLOW,
) -> None:
    """``FrameReader.read_all`` with motion: the chunk's (number, uri, fingerprint) frames
    into ``out``, each with its ``motion``, read together with ``neighbours`` (frame -> URI,
    outside the chunk), a FrameSummary for a frame that failed, None at the end."""
    chunk = {number: (uri, fingerprint) for number, uri, fingerprint in frames}
    walk = sorted(set(chunk) | set(neighbours))
    held: _Held | None = None
    try:
        for number in walk:
            if number in chunk:
                current = _read_chunk_frame(reader, number, *chunk[number], settings, out)
            else:
                current = _read_neighbour(reader, number, neighbours[number], settings)
            _link(held, current, settings)
            _release(held, out)
            held = current
        _link(held, None, settings)
        _release(held, out)
    finally:
        out.put(None)


def _read_chunk_frame(
    reader: FrameReader,
    number: int,
    uri: str,
    fingerprint: str | None,
    settings: FlowSettings,
    out: queue.Queue[ReadFrame | FrameSummary | None],
) -> _Held:
    summary = FrameSummary(
        frame=number, plate_uri=uri, status="done", plate_fingerprint=fingerprint
    )
    try:
        read = reader.read(number, uri, summary)
    except Exception as exc:
        out.put(failed(summary, exc, uri))
        return _Held(number, None, why=f"is unreadable: {summary.error}")
    t0 = time.perf_counter()
    read.motion = FrameMotion()
    try:
        image = flow_image(read.rgb, settings)
    except Exception as exc:  # the frame goes on to the model, with zero motion, said
        why = f"has no flow image ({exc!r})"
        return _Held(number, None, read, why=why, notes=[f"zero motion: the frame {why}"])
    return _Held(number, image, read, flow_s=time.perf_counter() - t0)


def _read_neighbour(reader: FrameReader, number: int, uri: str, settings: FlowSettings) -> _Held:
    try:
        image = flow_image(reader.neighbour_rgb(number, uri), settings)
    except Exception as exc:  # said as FrameError says it: the frame, its file, the reason
        error = exc if isinstance(exc, FrameError) else FrameError(uri, number, repr(exc))
        return _Held(number, None, why=f"is unreadable: {error}")
    return _Held(number, image)


def _link(before: _Held | None, after: _Held | None, settings: FlowSettings) -> None:
    """The motion between two frames of the walk that follow each other: ``before``'s
    forward and ``after``'s backward vectors, or a note on each side that has none."""
    if before is None and after is None:
        return
    if before is None or after is None or after.number != before.number + 1:
        if before is not None:
            before.notes.append(_no_neighbour(before.number + 1, "forward"))
        if after is not None:
            after.notes.append(_no_neighbour(after.number - 1, "backward"))
        return
    if before.image is None or after.image is None:  # (a frame without its own image has
        if after.image is not None:  # its own note already)
            after.notes.append(f"zero backward motion: the previous frame {before.why}")
        if before.image is not None:
            before.notes.append(f"zero forward motion: the next frame {after.why}")
        return
    t0 = time.perf_counter()
    try:
        pair = pair_motion(before.image, after.image, settings)
    except Exception as exc:  # neither frame fails for it: zero motion between them, said
        why = f"the flow between frames {before.number} and {after.number} failed ({exc!r})"
        before.notes.append(f"zero forward motion: {why}")
        after.notes.append(f"zero backward motion: {why}")
        return
    finally:
        share = (time.perf_counter() - t0) / 2
        before.flow_s += share
        after.flow_s += share
    if pair.cut:
        why = (
            f"a cut between frames {before.number} and {after.number} (luma histogram "
            f"correlation {pair.histogram:.2f}, {pair.consistent:.0%} of the flow consistent)"
        )
        before.notes.append(f"zero forward motion: {why}")
        after.notes.append(f"zero backward motion: {why}")
        return
    if before.read is not None and before.read.motion is not None:
        before.read.motion.forward = pair.forward
    if after.read is not None and after.read.motion is not None:
        after.read.motion.backward = pair.backward


def _no_neighbour(number: int, side: str) -> str:
    return (
        f"zero {side} motion: no frame {number} in the plate's sequence (a hole, or the end "
        "of the shot's range)"
    )


def _release(held: _Held | None, out: queue.Queue[ReadFrame | FrameSummary | None]) -> None:
    """A frame of the chunk whose both sides are known goes to the model, with its notes."""
    if held is None or held.read is None:
        return
    summary = held.read.summary
    summary.timings["flow"] = held.flow_s
    summary.notes.extend(held.notes)
    for note in held.notes:
        log.info("%s: frame %d: %s", held.read.uri, held.number, note)
    out.put(held.read)
