"""Planning cuts in: the clip records of a cut (``flows.edit_cuts``) grouped into shot
submissions, each clip that cannot run refused by name with the reason (its spec, an
overlapping shot, frames not on disk) while the others go on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import fileseq

from schemas.spec import ShotSpec, SpecError, check_paths, parse_spec
from storage.errors import SequenceError, StorageError
from storage.sequences import PlateSequence, discover_sequence

from .edit_cuts import CutClip

Discover = Callable[[str], PlateSequence]


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
