"""Cuts in: an editorial cut (OpenTimelineIO, or a CMX3600 EDL / FCP 7 XML read through OTIO's
adapters) becomes one plain record per video clip, and the records become shot submissions.

Value in, value out, like OTIO's own schema objects: ``read_cut`` parses the file,
``cut_clips`` turns the parsed cut into frozen ``CutClip`` records (no OTIO object leaves this
module and its parts ``cut_templates`` and ``cut_media``), ``flows.cut_planning.plan_cut``
turns the records into ``ShotSubmission``s. Nothing here imports
Prefect, Dask or torch; the only I/O is reading the cut and one directory listing per plate
(``storage.sequences``), so every rule is tested without running a shot.

The rules, decided here and documented in docs/user/cuts.md:

- **Shot name**: ``--shot-template`` is filled from the clip's fields (``str.format``):
  ``{clip}`` (the clip's name; the default template), ``{marker}`` (the name of the clip's
  marker, e.g. an EDL ``* LOC:`` line, where editorial usually puts the VFX shot ID),
  ``{source}`` (its source file name: an EDL's ``* SOURCE FILE:``, else its media's file
  name), ``{reel}`` (an EDL's reel), ``{index}`` (1-based, ``{index:03d}`` pads), ``{track}``,
  ``{show}``, ``{seq}``. A field the clip lacks is a problem of that clip, never a guess;
  so is a clip with several different marker names when the template asks for ``{marker}``.
  ``--shot-pattern FIELD:REGEX`` (``flows.shot_patterns``) pulls the shot ID out of the
  clip's name, source file, markers or reel instead (``ZZ100_501 (LAY3)``); the template is
  then ``{shot}`` unless given, and may use every named group of the pattern. A clip the
  pattern does not match has no shot name.
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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import opentimelineio as otio

from core.errors import SvfxError

from .cut_media import clip_media, frame_range, record_timecodes, source_file
from .cut_templates import (
    CLIP_FIELDS,
    DEFAULT_PLATE_TEMPLATE,
    DEFAULT_SHOT_TEMPLATE,
    PLATE_FIELDS,
    fill_template,
    template_fields,
)
from .shot_patterns import ShotPattern

FORMATS = {".otio": "otio_json", ".otioz": "otioz", ".edl": "cmx_3600", ".xml": "fcp_xml"}


class CutError(SvfxError, ValueError):
    """A cut that cannot be read at all; the message names the file and the reason."""


@dataclass(frozen=True)
class CutOptions:
    """How clips become shots: the ``svfx submit-edit`` options that read the cut."""

    show: str
    seq: str
    handles: int = 0
    shot_template: str | None = None  # None: {clip}, or {shot} with a shot_pattern
    shot_pattern: ShotPattern | None = None
    plates_root: str | None = None
    plate_template: str = DEFAULT_PLATE_TEMPLATE
    rate: float = 24.0  # EDLs carry no rate

    @property
    def template(self) -> str:
        """The shot template in force."""
        if self.shot_template:
            return self.shot_template
        return "{shot}" if self.shot_pattern else DEFAULT_SHOT_TEMPLATE

    @property
    def pattern_groups(self) -> tuple[str, ...]:
        """The fields the pattern adds (its named groups, ``shot`` among them)."""
        return self.shot_pattern.groups if self.shot_pattern else ()


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
    groups = options.pattern_groups
    template_fields(options.template, (*CLIP_FIELDS, *groups), "--shot-template")
    if options.plates_root:
        known = (*PLATE_FIELDS, *groups)
        template_fields(options.plate_template, tuple(dict.fromkeys(known)), "--plate-template")


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
        "source": source_file(clip),
        "reel": _reel(clip),
        "index": index,
        "track": track.name or "",
        "show": options.show,
        "seq": options.seq,
        "sequence": options.seq,
    }
    problems: list[str] = []
    shot, fields, why = _shot_name(options, fields, markers)
    if why:
        problems.append(f"no shot name: {why}")
    plate, to_frame, why = clip_media(
        clip, options.plates_root, options.plate_template, {**fields, "shot": shot}, base_dir
    )
    if why:
        problems.append(why)
    first, last, why = frame_range(clip, to_frame, options.handles)
    if why:
        problems.append(why)
    return CutClip(
        index=index,
        name=name,
        track=track.name or "",
        record=record_timecodes(clip, track, offset),
        shot=shot,
        first=first,
        last=last,
        plate=plate,
        markers=markers,
        problems=tuple(problems),
    )


def _shot_name(
    options: CutOptions, fields: dict[str, Any], markers: tuple[str, ...]
) -> tuple[str, dict[str, Any], str]:
    """(the shot name, the fields with the pattern's groups, "") or ("", fields, why not):
    the pattern's groups first, then the template filled from them and the clip's fields."""
    pattern = options.shot_pattern
    if pattern:
        values = markers if pattern.field == "marker" else (fields[pattern.field],)
        groups, why = pattern.extract(tuple(v for v in values if v))
        if why:
            return "", fields, why
        fields = {**fields, **groups}
    shot, why = fill_template(options.template, fields, markers)
    return shot, fields, why


def _reel(clip: Any) -> str:
    try:
        return str(clip.metadata["cmx_3600"]["reel"] or "")
    except (KeyError, TypeError):
        return ""
