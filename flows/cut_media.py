"""Where a clip of a cut reads its plate, and which plate frames its source range covers
(cuts in; the rules are in ``flows.edit_cuts``): the clip's media reference or the
``--plates-root`` template, ``file://`` URLs and paths relative to the cut, source time to
plate frame numbers, the clip's source file name, and the timecodes a clip is shown with."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import fileseq
import opentimelineio as otio

from storage.sequences import IMAGE_EXTENSIONS

from .cut_templates import fill_template

_FRAME_TOKEN = re.compile(r"%0?\d*d")  # printf frame tokens survive URL unquoting

ToFrame = Callable[[otio.opentime.RationalTime], int]


def clip_media(
    clip: Any,
    plates_root: str | None,
    plate_template: str,
    fields: Mapping[str, Any],
    base_dir: str,
) -> tuple[str, ToFrame, str]:
    """(plate pattern, source time -> plate frame, problem); with ``plates_root`` the plate is
    ``plate_template`` filled under it."""
    ref = clip.media_reference
    if plates_root:
        if not fields.get("shot"):
            return "", _time_frames, ""  # the missing shot name is the problem already said
        relative, why = fill_template(plate_template, fields, ())
        if why:
            return "", _time_frames, f"no plate: {why}"
        return os.path.join(plates_root, relative), _time_frames, ""
    if isinstance(ref, otio.schema.ImageSequenceReference):
        pattern = _local(ref.abstract_target_url(_pad_token(ref.frame_zero_padding)), base_dir)
        if ref.available_range is None:
            return pattern, _time_frames, ""
        return pattern, ref.frame_for_time, ""
    if not isinstance(ref, otio.schema.ExternalReference) or not ref.target_url:
        return "", _time_frames, f"no plate: the clip references no image sequence; {_GIVE_ROOT}"
    found = _as_sequence(_local(ref.target_url, base_dir))
    if found is None:
        why = f"no plate: its media {ref.target_url} is not an image sequence; {_GIVE_ROOT}"
        return "", _time_frames, why
    pattern, anchor = found
    available = ref.available_range
    if anchor is None or available is None:
        return pattern, _time_frames, ""
    return pattern, lambda t: anchor + _time_frames(t - available.start_time), ""


_GIVE_ROOT = "give --plates-root (and --plate-template)"
_SOURCE_FILE = re.compile(r"SOURCE FILE:?\s*(?P<name>.*)$", re.IGNORECASE)


def source_file(clip: Any) -> str:
    """The clip's source file name, without its folder: an EDL's ``* SOURCE FILE:`` comment
    (Avid, Premiere; OTIO's adapter keeps it among the clip's comments), else the file its
    media reference names (``* FROM CLIP:``/``* FROM FILE:``, an FCP XML ``pathurl``, an
    OTIO reference); "" when the cut names none."""
    comments = clip.metadata.get("cmx_3600", {}).get("comments", []) or []
    for comment in comments:
        found = _SOURCE_FILE.match(str(comment).strip())
        if found and found["name"].strip():
            return _file_name(found["name"].strip())
    ref = clip.media_reference
    if isinstance(ref, otio.schema.ImageSequenceReference):
        return _file_name(ref.abstract_target_url(_pad_token(ref.frame_zero_padding)))
    if isinstance(ref, otio.schema.ExternalReference) and ref.target_url:
        return _file_name(ref.target_url)
    return ""


def _file_name(path_or_url: str) -> str:
    path = urlsplit(path_or_url, allow_fragments=False).path or path_or_url
    return unquote(path.replace("\\", "/").rstrip("/").rpartition("/")[2])


def frame_range(clip: Any, to_frame: ToFrame, handles: int) -> tuple[int | None, int | None, str]:
    try:
        source = played_range(clip, clip.trimmed_range())
    except Exception:  # no source range and no available range on the media
        return None, None, "the clip has no source range"
    try:
        first = to_frame(source.start_time) - handles
        last = to_frame(source.end_time_inclusive()) + handles
    except ValueError:  # frame_for_time: outside the media's available range
        available = _range_text(clip.media_reference.available_range)
        why = f"its source range {_range_text(source)} lies outside its media's ({available})"
        return None, None, why
    return first, last, ""


def played_range(clip: Any, source: otio.opentime.TimeRange) -> otio.opentime.TimeRange:
    """The source frames a clip really plays, from OTIO's source range: OTIO's EDL and XML
    adapters keep the record's duration there and put a speed effect in a `LinearTimeWarp`
    (an M2 of 12 fps on a 24 fps cut: 0.5), so a slowed clip would pull twice its frames; and
    the frames a transition takes from the clip beyond its cut (a dissolve's outgoing clip
    plays on under the dissolve: `Track.handles_of_child`) are outside it. The record time is
    scaled by the speed's size (a reversed clip plays the same frames), at least one frame
    (a freeze frame, speed 0), and the transitions' frames are added at each end."""
    scale = 1.0
    for effect in clip.effects:
        if isinstance(effect, otio.schema.LinearTimeWarp):
            scale *= abs(float(effect.time_scalar))
    track = clip.parent()
    head, tail = track.handles_of_child(clip) if track is not None else (None, None)
    rate = source.duration.rate
    before = head.rescaled_to(rate).value if head is not None else 0.0
    after = tail.rescaled_to(rate).value if tail is not None else 0.0
    if scale == 1.0 and not before and not after:
        return source
    frames = max(1, round(source.duration.value * scale))
    start = source.start_time - otio.opentime.RationalTime(round(before * scale), rate)
    extra = round(before * scale) + round(after * scale)
    return otio.opentime.TimeRange(start, otio.opentime.RationalTime(frames + extra, rate))


def _time_frames(time: otio.opentime.RationalTime) -> int:
    return round(time.value)


def _pad_token(padding: int) -> str:
    """`#` per digit, as the plate patterns write it; `@` (one digit or more) without padding
    (a lone `#` would mean four digits)."""
    return "#" * padding if padding >= 2 else "@"


def _as_sequence(path: str) -> tuple[str, int | None] | None:
    """(pattern, the frame the path names) when ``path`` is an image sequence or one frame of
    one (``plate.1001.exr``, ``plate.####.exr``, ``plate.%04d.exr``); None otherwise."""
    directory, _, name = path.rpartition("/")
    try:
        seq = fileseq.FileSequence(name)
    except fileseq.ParseException:
        return None
    if seq.extension().lower() not in IMAGE_EXTENSIONS or not seq.padding():
        return None
    frames = seq.frameSet()
    if frames is None:
        return path, None
    token = _pad_token(seq.zfill())
    prefix = f"{directory}/" if directory else ""
    return f"{prefix}{seq.basename()}{token}{seq.extension()}", int(frames.start())


def _local(url: str, base_dir: str) -> str:
    """A path for ``file://`` URLs and relative paths (relative to the cut); s3:// and other
    URLs unchanged."""
    parts = urlsplit(url, allow_fragments=False)  # '#' is a frame token here, not a fragment
    if parts.scheme == "file":
        tokens = _FRAME_TOKEN.findall(parts.path)
        path = url2pathname(_FRAME_TOKEN.sub("\0", parts.path))
        for token in tokens:
            path = path.replace("\0", token, 1)
        return path
    if len(parts.scheme) > 1:
        return url
    return os.path.normpath(os.path.join(base_dir, os.path.expanduser(url)))


def record_timecodes(clip: Any, track: Any, offset: otio.opentime.RationalTime | None) -> str:
    """The clip's record in-out on the timeline. Taken in the stack that holds the track, so
    the track's own range counts: the EDL adapter keeps the first record timecode there
    (a track starting at ``-01:00:00:00``), not in the timeline's global start."""
    try:
        record = clip.transformed_time_range(clip.trimmed_range(), track.parent() or track)
    except Exception:  # no source range: said as the clip's problem
        return ""
    start = record.start_time + offset if offset is not None else record.start_time
    return f"{_timecode(start)}-{_timecode(start + record.duration)}"


def _timecode(time: otio.opentime.RationalTime) -> str:
    try:
        return otio.opentime.to_timecode(time, time.rate)
    except (ValueError, TypeError):  # a rate timecode cannot express
        return str(round(time.value))


def _range_text(time_range: otio.opentime.TimeRange | None) -> str:
    if time_range is None:
        return "(none)"
    start = time_range.start_time
    return f"{_timecode(start)}-{_timecode(time_range.end_time_exclusive())}"
