"""The checks a shot's input must pass before anything heavy runs: where it reads and writes
(under the allowed roots once symlinks are resolved, the output folder creatable and not a
file, the version's EXRs of the layout asked for), which frames exist (and that none is a
link out of the roots), one readable header, and the plate's colour space.

Nothing here imports torch, Prefect or Dask, so a refusal costs well under a second of
imports; `flows.planning` builds the plan on top of what this returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from schemas.settings import Settings
from schemas.spec import (
    TILES_KEY,
    ShotSpec,
    SpecError,
    check_paths,
    is_really_under,
    resolved,
)
from storage.errors import FrameError
from storage.exr_layout import ExrHeader, first_exr, read_exr_header
from storage.frame import Frame
from storage.location import Location
from storage.plate_reader import read_plate_frame
from storage.sequences import PlateSequence, discover_sequence
from storage.uri import is_remote
from tasks.colour import guess_colourspace, resolve_colourspace
from tasks.output_paths import ShotOutputPaths


@dataclass(frozen=True)
class ShotInputs:
    spec: ShotSpec
    output_root: str
    paths: ShotOutputPaths
    sequence: PlateSequence
    header: Frame  # the first readable frame: resolution, windows, attributes
    colorspace: str  # resolved OCIO name
    colorspace_guessed: bool
    colour_note: str  # what was used and why, for the user
    source: ShotOutputPaths | None = None  # a stabilised version's per-frame version


def check_inputs(spec: ShotSpec, settings: Settings) -> ShotInputs:
    """Everything about the input that can be refused, cheapest first; SpecError or
    StorageError (SequenceError) with every problem named."""
    output_root = spec.output_root or settings.outputs
    problems = check_paths(spec, settings.roots, output_root)
    if problems:
        raise SpecError("\n".join(problems))
    sequence = discover_sequence(settings.location(spec.plate), spec.frames)
    # the settings' options; empty ones mean the environment of whoever writes (a worker)
    outputs = settings.location(output_root).or_environment()
    paths = ShotOutputPaths.for_shot(
        outputs,
        spec.show,
        spec.sequence,
        spec.shot,
        spec.version,
        sequence.padding,
        element=spec.element,
        family=spec.output_family,
    )
    problems = output_problems(paths) + frames_outside_roots(sequence, settings.roots)
    if problems:
        raise SpecError("\n".join(problems))
    setting_problem = version_setting_problem(spec, paths)
    if setting_problem:
        raise SpecError(setting_problem)
    source = source_paths(spec, outputs, sequence.padding)
    header = first_readable(sequence)
    colorspace, guessed, note = colourspace(spec, header)
    return ShotInputs(spec, output_root, paths, sequence, header, colorspace, guessed, note, source)


def source_paths(spec: ShotSpec, outputs: Location, padding: int) -> ShotOutputPaths | None:
    """Where a stabilised version's per-frame version lies (None for a per-frame spec);
    SpecError when it holds no EXR (nothing to stabilise from)."""
    if spec.source_version is None:
        return None
    source = ShotOutputPaths.for_shot(
        outputs, spec.show, spec.sequence, spec.shot, spec.source_version, padding,
        element=spec.element, family=spec.output_family,
    )  # fmt: skip
    if first_exr(source.location, source.exr_glob) is None:
        raise SpecError(
            f"{source.root}: {spec.shot_path} {spec.source_version} has no EXR frames to stabilise"
        )
    return source


def version_setting_problem(spec: ShotSpec, paths: ShotOutputPaths) -> str | None:
    """Why the version's EXRs cannot take the spec's settings that one version holds one of
    (its EXR layout, its tiles): the first EXR listed and its header read once for both."""
    header = _written_header(paths)
    if header is None:
        return None
    return _layout_problem(spec, header) or _tiles_problem(spec, header)


def exr_layout_problem(spec: ShotSpec, paths: ShotOutputPaths) -> str | None:
    """Why the version's EXRs cannot take ``spec.exr_layout`` (None: they can). One version
    holds one layout: the Nuke script, the catalog and every reader of the version see one
    kind of file, so a resubmit that asks for the other is refused rather than rewriting
    frames in it (or choosing a version number for the user)."""
    header = _written_header(paths)
    return None if header is None else _layout_problem(spec, header)


def tiles_problem(spec: ShotSpec, paths: ShotOutputPaths) -> str | None:
    """Why the version's EXRs cannot take ``spec.tiles`` (None: they can). The person gate
    changes the pixels off the people, so one version holds frames of one setting; EXRs
    written before the gate (no ``TILES_KEY``) ran every tile. A stabilised version runs no
    tiles: its frames follow its source's."""
    header = _written_header(paths)
    return None if header is None else _tiles_problem(spec, header)


def _written_header(paths: ShotOutputPaths) -> ExrHeader | None:
    written = first_exr(paths.location, paths.exr_glob)
    return None if written is None else read_exr_header(paths.at(written))


def _layout_problem(spec: ShotSpec, header: ExrHeader) -> str | None:
    if header.layout == spec.exr_layout:
        return None
    return (
        f"{header.uri}: version {spec.version} of {spec.shot_path} was written with exr_layout "
        f"{header.layout}, this submit asks for {spec.exr_layout}; submit it with exr_layout "
        f"{header.layout}, or as a new version"
    )


def _tiles_problem(spec: ShotSpec, header: ExrHeader) -> str | None:
    tiles = header.attributes.get(TILES_KEY) or "all"
    if spec.stabilised or tiles == spec.tiles:
        return None
    return (
        f"{header.uri}: version {spec.version} of {spec.shot_path} was made with tiles {tiles}, "
        f"this submit asks for tiles {spec.tiles}; submit it with --tiles {tiles}, or as a "
        "new version"
    )


def output_problems(paths: ShotOutputPaths) -> list[str]:
    """The folders a job writes must be folders or creatable: never an existing file (it
    would be replaced), never under a file, and their first existing parent writable."""
    if is_remote(paths.root):
        return []
    folders = [
        paths.root,
        paths.zarr,
        f"{paths.root}/previews",
        f"{paths.root}/review",
        paths.pose_fragments,
        paths.frame_records,
    ]
    for folder in folders:
        if os.path.exists(folder) and not os.path.isdir(folder):
            return [f"output path {folder} exists and is not a folder; refusing to replace it"]
    parent = resolved(paths.root)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return [f"cannot create the output folder {paths.root}: {parent} is a file"]
    if not os.access(parent, os.W_OK | os.X_OK):
        return [f"cannot create the output folder {paths.root}: {parent} is not writable"]
    return []


def frames_outside_roots(sequence: PlateSequence, roots: list[str]) -> list[str]:
    """Frames that are links to files outside the allowed roots (they are not read)."""
    if is_remote(sequence.pattern):
        return []
    outside = [
        f"  frame {frame}: {uri} -> {resolved(uri)}"
        for frame in sequence.frames
        if not is_really_under(uri := sequence.uri_for(frame), roots)
    ]
    if not outside:
        return []
    shown = outside[:10] + ([f"  ... and {len(outside) - 10} more"] if len(outside) > 10 else [])
    return [
        f"{len(outside)} frames of {sequence.pattern} link to files outside the allowed roots "
        f"({', '.join(roots)}); they are not read:",
        *shown,
    ]


def first_readable(sequence: PlateSequence) -> Frame:
    """The first frame that reads, for resolution and windows. Frames that do not read are
    left to the workers, which record each one's reason."""
    errors: list[str] = []
    for frame in sequence.frames[:5]:
        try:
            return read_plate_frame(sequence.location_of(frame), frame)
        except FrameError as exc:
            errors.append(str(exc))
    lines = "\n  ".join(errors)
    raise SpecError(f"no readable frame among the first frames of {sequence.pattern}:\n  {lines}")


def colourspace(spec: ShotSpec, header: Frame) -> tuple[str, bool, str]:
    """(OCIO name, guessed, a note for the user); SpecError for an unknown colour space."""
    if spec.colorspace:
        try:
            space = resolve_colourspace(spec.colorspace)
        except (ValueError, LookupError) as exc:
            raise SpecError(f"colour space: {exc}") from None
        return space, False, f"plate colour space {space} (as given)"
    guess = guess_colourspace(header)
    note = f"plate colour space guessed: {guess.reason}"
    if not guess.certain:
        note += " -- pass --colorspace to say what it is"
    return guess.colourspace, True, note
