"""Cuts in: an editorial cut (OpenTimelineIO, or a CMX3600 EDL / FCP 7 XML read through OTIO's
adapters) becomes one plain record per video clip, and the records become shot submissions.

Value in, value out, like OTIO's own schema objects: ``read_cut`` parses the file,
``cut_clips`` turns the parsed cut into frozen ``CutClip`` records (no OTIO object leaves this
module), ``plan_cut`` turns the records into ``ShotSubmission``s. Nothing here imports
Prefect, Dask or torch; the only I/O is reading the cut and one directory listing per plate
(``storage.sequences``), so every rule is tested without running a shot.

The rules, decided here and documented in the README:

- **Shot name**: ``--shot-template`` is filled from the clip's fields (``str.format``):
  ``{clip}`` (the clip's name; the default template), ``{marker}`` (the name of the clip's
  marker, e.g. an EDL ``* LOC:`` line, where editorial usually puts the VFX shot ID),
  ``{reel}`` (an EDL's reel), ``{index}`` (1-based, ``{index:03d}`` pads), ``{track}``,
  ``{show}``, ``{seq}``. A field the clip lacks is a problem of that clip, never a guess;
  so is a clip with several different marker names when the template asks for ``{marker}``.
  The EDL adapter names a clip without ``* FROM CLIP NAME:`` by its event number: for an EDL
  a name of digits only counts as no name.
- **Frames**: the clip's source range, in plate frame numbers, widened by ``--handles`` on
  both sides. An ``ImageSequenceReference`` with an available range maps source time to image
  numbers itself (``frame_for_time``); an ``ExternalReference`` naming one frame of a sequence
  (``plate.1001.exr``, as FCP XML writes it) maps that frame to the start of its available
  range; otherwise the frame number is the source time counted in frames at the clip's rate
  (EDL timecode ``00:00:41:17`` at 24 fps is frame 1001).
- **Plate**: with ``--plates-root``, ``root/--plate-template`` (the same fields plus
  ``{shot}``) for every clip, whatever the cut references (editorial media are rarely the
  plates); otherwise the clip's ``ImageSequenceReference``, or an ``ExternalReference`` whose
  URL is an image sequence. ``file://`` URLs become paths; relative ones are relative to the
  cut file. Generator clips (EDL black, bars) are not footage and are skipped.
- **Outside the plate**: any frame of a clip's range (handles included) that is not on disk
  refuses the clip, naming the frames and what the plate holds.
- **Submissions**: clips making the same shot from the same plate submit once, with the union
  of their frames; one plate cut into two shots is two submissions (two output folders); two
  plates making the same show/seq/shot are overlapping shots, and every clip involved is
  refused by name. Each refusal names the clip and the reason; the other clips go on.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import fileseq
import opentimelineio as otio

from schemas.spec import ShotSpec, SpecError, check_paths, parse_spec
from storage.errors import SequenceError, StorageError
from storage.sequences import IMAGE_EXTENSIONS, PlateSequence, discover_sequence

from .plate_template import TemplateError

FORMATS = {".otio": "otio_json", ".otioz": "otioz", ".edl": "cmx_3600", ".xml": "fcp_xml"}
DEFAULT_SHOT_TEMPLATE = "{clip}"
DEFAULT_PLATE_TEMPLATE = "{shot}/plate/{shot}_plate.####.exr"
CLIP_FIELDS = ("clip", "marker", "reel", "index", "track", "show", "seq", "sequence")
PLATE_FIELDS = (*CLIP_FIELDS, "shot")
_FRAME_TOKEN = re.compile(r"%0?\d*d")  # printf frame tokens survive URL unquoting

Discover = Callable[[str], PlateSequence]
ToFrame = Callable[[otio.opentime.RationalTime], int]


class CutError(ValueError):
    """A cut that cannot be read at all; the message names the file and the reason."""


@dataclass(frozen=True)
class CutOptions:
    """How clips become shots: the ``svfx submit-edit`` options that read the cut."""

    show: str
    seq: str
    handles: int = 0
    shot_template: str = DEFAULT_SHOT_TEMPLATE
    plates_root: str | None = None
    plate_template: str = DEFAULT_PLATE_TEMPLATE
    rate: float = 24.0  # EDLs carry no rate


@dataclass(frozen=True)
class CutClip:
    """One video clip of the cut, as plain values; ``problems`` empty means it can submit."""

    index: int  # 1-based, in cut order
    name: str  # "" when the clip has none
    track: str
    record: str  # record in-out on the timeline, timecode (out exclusive, as in an EDL)
    shot: str  # "" when it could not be named
    first: int | None  # plate frames: source range plus handles
    last: int | None
    plate: str  # plate pattern, "" without media
    markers: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"clip {self.index} {self.name!r}" if self.name else f"clip {self.index} (no name)"

    @property
    def frames(self) -> str:
        if self.first is None or self.last is None:
            return ""
        return f"{self.first}-{self.last}" if self.last != self.first else str(self.first)

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "track": self.track,
            "record": self.record,
            "shot": self.shot,
            "frames": self.frames,
            "plate": self.plate,
            "markers": list(self.markers),
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class ShotSubmission:
    """One shot to submit: the clips that make it from one plate, their frames united."""

    shot: str  # show/seq/shot
    plate: str
    frames: str  # fileseq range
    clips: tuple[str, ...]  # labels of the clips it covers
    spec: ShotSpec = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "shot": self.shot,
            "plate": self.plate,
            "frames": self.frames,
            "clips": list(self.clips),
        }


@dataclass(frozen=True)
class CutPlan:
    source: str
    clips: tuple[CutClip, ...]  # every clip, with every problem found
    shots: tuple[ShotSubmission, ...]

    @property
    def refused(self) -> tuple[CutClip, ...]:
        return tuple(c for c in self.clips if c.problems)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cut": self.source,
            "clips": [c.as_dict() for c in self.clips],
            "shots": [s.as_dict() for s in self.shots],
            "refused": len(self.refused),
        }


# -- reading ------------------------------------------------------------------------------------
def read_cut(path: str, rate: float = 24.0) -> Any:
    """The parsed cut (an OTIO Timeline or collection); CutError naming the file and why."""
    suffix = os.path.splitext(path)[1].lower()
    adapter = FORMATS.get(suffix)
    if adapter is None:
        raise CutError(
            f"{path}: unknown cut format {suffix or '(no suffix)'!r}; "
            "known: .otio, .otioz, .edl (CMX3600), .xml (FCP 7 XML)"
        )
    if not os.path.isfile(path):
        raise CutError(f"{path}: no such file")
    options = {"rate": _timecode_rate(rate)} if adapter == "cmx_3600" else {}
    try:
        return otio.adapters.read_from_file(path, adapter_name=adapter, **options)
    except Exception as exc:  # each parser has its own errors (EDLParseError, ParseError, ...)
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise CutError(f"{path}: cannot read it as {adapter}: {reason}") from exc


def _timecode_rate(rate: float) -> float:
    """23.976 as typed means 24000/1001, the rate SMPTE timecode knows (29.97 alike)."""
    nearest = otio.opentime.RationalTime.nearest_valid_timecode_rate(rate)
    return nearest if abs(nearest - rate) < 0.01 else rate


def load_cut(path: str, options: CutOptions) -> tuple[CutClip, ...]:
    """Read the cut at ``path`` and return its clips as records."""
    check_templates(options)
    cut = read_cut(path, options.rate)
    fmt = FORMATS[os.path.splitext(path)[1].lower()]
    base = os.path.dirname(os.path.abspath(path))
    return cut_clips(cut, options, source=path, base_dir=base, edl=fmt == "cmx_3600")


def check_templates(options: CutOptions) -> None:
    """TemplateError for a template naming an unknown field (before any clip is read)."""
    _fields_of(options.shot_template, CLIP_FIELDS, "--shot-template")
    if options.plates_root:
        _fields_of(options.plate_template, PLATE_FIELDS, "--plate-template")


def cut_clips(
    cut: Any, options: CutOptions, *, source: str, base_dir: str = ".", edl: bool = False
) -> tuple[CutClip, ...]:
    """Every video clip of every timeline in ``cut``, in order; CutError when there is none."""
    records: list[CutClip] = []
    for track, offset in _video_tracks(cut):
        for clip in track.find_clips():
            if isinstance(clip.media_reference, otio.schema.GeneratorReference):
                continue  # black, bars: not footage
            index = len(records) + 1
            records.append(_clip_record(clip, track, offset, index, options, base_dir, edl))
    if not records:
        raise CutError(f"{source}: holds no video clip")
    return tuple(records)


def _video_tracks(cut: Any) -> Iterable[tuple[Any, otio.opentime.RationalTime | None]]:
    """(video track, the timeline's global start) for every timeline the file holds."""
    if isinstance(cut, otio.schema.Timeline):
        for track in cut.video_tracks():
            yield track, cut.global_start_time
    elif isinstance(cut, otio.schema.SerializableCollection):
        for child in cut:
            yield from _video_tracks(child)
    elif isinstance(cut, otio.schema.Track) and cut.kind == otio.schema.TrackKind.Video:
        yield cut, None


def _clip_record(
    clip: Any,
    track: Any,
    offset: otio.opentime.RationalTime | None,
    index: int,
    options: CutOptions,
    base_dir: str,
    edl: bool,
) -> CutClip:
    name = (clip.name or "").strip()
    if edl and name.isdigit():  # the adapter's stand-in (event number) for a missing name
        name = ""
    markers = tuple(dict.fromkeys(m.name.strip() for m in clip.markers if (m.name or "").strip()))
    fields: dict[str, Any] = {
        "clip": name,
        "marker": markers[0] if len(markers) == 1 else "",
        "reel": _reel(clip),
        "index": index,
        "track": track.name or "",
        "show": options.show,
        "seq": options.seq,
        "sequence": options.seq,
    }
    problems: list[str] = []
    shot, why = _fill(options.shot_template, fields, markers)
    if why:
        problems.append(f"no shot name: {why}")
    plate, to_frame, why = _media(clip, options, {**fields, "shot": shot}, base_dir)
    if why:
        problems.append(why)
    first, last, why = _frame_range(clip, to_frame, options.handles)
    if why:
        problems.append(why)
    return CutClip(
        index=index,
        name=name,
        track=track.name or "",
        record=_record(clip, track, offset),
        shot=shot,
        first=first,
        last=last,
        plate=plate,
        markers=markers,
        problems=tuple(problems),
    )


def _reel(clip: Any) -> str:
    try:
        return str(clip.metadata["cmx_3600"]["reel"] or "")
    except (KeyError, TypeError):
        return ""


# -- templates ---------------------------------------------------------------------------------
_MISSING = {
    "clip": "the clip has no name",
    "marker": "the clip has no marker (an EDL * LOC: line) to name its shot",
    "reel": "the clip has no reel name",
    "track": "the clip's track has no name",
    "shot": "the clip has no shot name",
}


def _fields_of(template: str, known: tuple[str, ...], option: str) -> list[str]:
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise TemplateError(f"{option} {template!r} is not a valid template: {exc}") from None
    unknown = [f"{{{f}}}" for f in names if f not in known]
    if unknown:
        raise TemplateError(
            f"{option} {template!r} names unknown fields {', '.join(unknown)}; "
            f"known: {', '.join('{' + k + '}' for k in known)}"
        )
    return names


def _fill(template: str, fields: Mapping[str, Any], markers: tuple[str, ...]) -> tuple[str, str]:
    """(the filled template, "") or ("", why not) when the clip lacks a field it uses."""
    for name in _fields_of(template, PLATE_FIELDS, "template"):
        if fields.get(name) in ("", None):
            if name == "marker" and len(markers) > 1:
                listed = ", ".join(markers)
                return "", f"several markers ({listed}): which names the shot is ambiguous"
            return "", _MISSING.get(name, f"the clip has no {name}")
    try:
        return template.format(**fields).strip(), ""
    except (ValueError, TypeError) as exc:  # e.g. {clip:03d}
        return "", f"template {template!r}: {exc}"


# -- media and frames --------------------------------------------------------------------------
def _media(
    clip: Any, options: CutOptions, fields: Mapping[str, Any], base_dir: str
) -> tuple[str, ToFrame, str]:
    """(plate pattern, source time -> plate frame, problem)."""
    ref = clip.media_reference
    if options.plates_root:
        if not fields.get("shot"):
            return "", _time_frames, ""  # the missing shot name is the problem already said
        relative, why = _fill(options.plate_template, fields, ())
        if why:
            return "", _time_frames, f"no plate: {why}"
        return os.path.join(options.plates_root, relative), _time_frames, ""
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


def _frame_range(clip: Any, to_frame: ToFrame, handles: int) -> tuple[int | None, int | None, str]:
    try:
        source = clip.trimmed_range()
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


def _record(clip: Any, track: Any, offset: otio.opentime.RationalTime | None) -> str:
    try:
        record = clip.transformed_time_range(clip.trimmed_range(), track)
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


# -- planning ----------------------------------------------------------------------------------
def plan_cut(
    clips: Iterable[CutClip],
    *,
    show: str,
    seq: str,
    submit: Mapping[str, Any],
    roots: list[str],
    output_root: str,
    discover: Discover = discover_sequence,
    source: str = "",
) -> CutPlan:
    """Group the clips into shot submissions, refusing by clip what cannot run.

    ``submit`` holds the ShotSpec fields every shot shares (passes, model_size, output_root,
    ...). SpecError when those, ``show`` or ``seq`` are themselves invalid (every clip would
    fail alike); everything else is a problem of the clip it concerns.
    """
    clips = tuple(clips)
    check_shared(show, seq, submit, roots, output_root)
    problems = {c.index: list(c.problems) for c in clips}
    specs: dict[int, ShotSpec] = {}
    for clip in clips:
        if problems[clip.index]:
            continue
        spec, why = _clip_spec(clip, show, seq, submit, roots, output_root)
        if spec is None:
            problems[clip.index].append(why)
        else:
            specs[clip.index] = spec
    ready = [c for c in clips if c.index in specs]
    for index, why in overlapping_shots(ready, specs).items():
        problems[index].append(why)
    ready = [c for c in ready if not problems[c.index]]
    for index, why in frames_missing(ready, discover).items():
        problems[index].append(why)
    ready = [c for c in ready if not problems[c.index]]
    shots = tuple(_submissions(ready, specs))
    checked = tuple(replace(c, problems=tuple(problems[c.index])) for c in clips)
    return CutPlan(source=source, clips=checked, shots=shots)


def check_shared(
    show: str, seq: str, submit: Mapping[str, Any], roots: list[str], output_root: str
) -> None:
    """SpecError for what every shot shares: show, seq, passes, sizes, the output and
    checkpoint roots (a probe spec that reads from the first allowed root)."""
    probe = parse_spec(
        {**submit, "plate": roots[0] if roots else ".", "show": show, "sequence": seq, "shot": "x"}
    )
    problems = check_paths(probe, roots, output_root)
    if problems:
        raise SpecError("\n".join(problems))


def _clip_spec(
    clip: CutClip,
    show: str,
    seq: str,
    submit: Mapping[str, Any],
    roots: list[str],
    output_root: str,
) -> tuple[ShotSpec | None, str]:
    """The clip's own ShotSpec (its shot name and plate checked as a submit checks them)."""
    data = {**submit, "plate": clip.plate, "show": show, "sequence": seq, "shot": clip.shot}
    try:
        spec = parse_spec({**data, "frames": clip.frames})
    except SpecError as exc:
        lines = str(exc).splitlines()
        return None, "; ".join(line.strip() for line in lines[1:] or lines)
    outside = check_paths(spec, roots, output_root)
    if outside:
        return None, "; ".join(outside)
    return spec, ""


def overlapping_shots(clips: list[CutClip], specs: Mapping[int, ShotSpec]) -> dict[int, str]:
    """Clip index -> why, for clips whose show/seq/shot another plate also makes."""
    by_shot: dict[str, list[CutClip]] = {}
    for clip in clips:
        by_shot.setdefault(specs[clip.index].shot_path, []).append(clip)
    refused: dict[int, str] = {}
    for shot, group in by_shot.items():
        plates = dict.fromkeys(c.plate for c in group)
        if len(plates) < 2:
            continue
        made = "; ".join(f"{c.label} from {c.plate}" for c in group)
        why = f"overlapping shots: {shot} would be made from {len(plates)} plates ({made})"
        refused.update(dict.fromkeys((c.index for c in group), why))
    return refused


def frames_missing(clips: list[CutClip], discover: Discover) -> dict[int, str]:
    """Clip index -> why, for clips whose plate is not there or lacks frames of their range
    (one listing per plate)."""
    found: dict[str, PlateSequence | str] = {}
    refused: dict[int, str] = {}
    for clip in clips:
        if clip.plate not in found:
            try:
                found[clip.plate] = discover(clip.plate)
            except SequenceError as exc:
                found[clip.plate] = f"plate not found: {exc}"
            except StorageError as exc:  # a listing that failed (a store away): this plate only
                found[clip.plate] = f"plate could not be listed: {exc}"
        sequence = found[clip.plate]
        if isinstance(sequence, str):
            refused[clip.index] = sequence
            continue
        assert clip.first is not None and clip.last is not None  # no problems: both set
        missing = sorted(set(range(clip.first, clip.last + 1)) - set(sequence.frames))
        if missing:
            holds = fileseq.FrameSet.from_iterable(sequence.frames, sort=True)
            refused[clip.index] = (
                f"frames {_frameset(missing)} of {clip.frames} are not on disk "
                f"({clip.plate} holds {holds})"
            )
    return refused


def _submissions(clips: list[CutClip], specs: Mapping[int, ShotSpec]) -> Iterable[ShotSubmission]:
    """One submission per (shot, plate), its clips' frames united, in cut order."""
    groups: dict[tuple[str, str], list[CutClip]] = {}
    for clip in clips:
        groups.setdefault((specs[clip.index].shot_path, clip.plate), []).append(clip)
    for (shot, plate), group in groups.items():
        frames: set[int] = set()
        for clip in group:
            assert clip.first is not None and clip.last is not None
            frames.update(range(clip.first, clip.last + 1))
        union = _frameset(sorted(frames))
        spec = parse_spec({**specs[group[0].index].model_dump(mode="json"), "frames": union})
        yield ShotSubmission(shot, plate, union, tuple(c.label for c in group), spec)


def _frameset(frames: list[int]) -> str:
    return str(fileseq.FrameSet.from_iterable(frames, sort=True))
