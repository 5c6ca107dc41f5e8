"""Frame-sequence discovery over fsspec (local paths and `s3://` alike) and per-frame streaming.

Accepted patterns (the frame number sits right before the extension, as fileseq requires):

- `plate.####.exr`: one digit per `#` (Nuke/Houdini style, so `####` is 4 digits); a single
  `#` means 4 digits, as in fileseq (`plate.#.exr`, `plate.1001-1100#.exr`);
- `plate.@@@@.exr`: one digit per `@`;
- `plate.%04d.exr` and `plate.$F4.exr`;
- `plate.1001-1100#.exr`: any fileseq frame range (`1001-1100x2`, `1-10,20`, ...);
- `plate.1001.exr`: a single frame;
- `plate.*.exr`: any padding;
- a directory (`s3://bucket/shot/plates/`): the one image sequence it holds.

Padding is a minimum: with `####`, `plate.0999.exr` and `plate.10000.exr` match but
`plate.999.exr` and `plate.00999.exr` do not (those belong to another padding).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fileseq

from storage.errors import FrameError, SequenceError
from storage.frame import Frame
from storage.location import Location, Where
from storage.plate_reader import read_plate_frame

# Extensions a directory listing is searched for when the pattern is a bare directory.
IMAGE_EXTENSIONS = frozenset(
    {".exr", ".sxr", ".dpx", ".cin", ".tif", ".tiff", ".png", ".jpg", ".jpeg"}
)

FrameRange = str | fileseq.FrameSet | Iterable[int]
ReadFn = Callable[..., Frame]


@dataclass(frozen=True)
class PlateSequence:
    """What is on disk for one plate pattern; pixels are read later, one frame at a time.

    `frames` holds the frames present (inside the requested range when one was given);
    `holes` the frames missing: missing from the requested range when one was given,
    otherwise missing between the first and last frame present. `location` is the pattern
    with the options it was listed with, which reach its frames too (`location_of`).
    """

    pattern: str
    directory: str
    basename: str
    extension: str
    padding: int
    frames: list[int]
    holes: list[int]
    location: Location = field(repr=False, compare=False)
    requested: list[int] | None = None
    # frame -> file name as listed (exact spelling, e.g. an overflowing `plate.10000.exr`).
    names: dict[int, str] = field(default_factory=dict, repr=False, compare=False)
    # frame -> the listing's entry for it (size, mtime or ETag), from the same single listing
    listing: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)

    def uri_for(self, frame: int) -> str:
        """URI of `frame` (the listed file when present, else the name the padding implies)."""
        name = (
            self.names.get(frame) or f"{self.basename}{_pad(frame, self.padding)}{self.extension}"
        )
        return f"{self.directory}/{name}"

    def location_of(self, frame: int) -> Location:
        """`uri_for(frame)`, reached with the sequence's options."""
        return self.location.at(self.uri_for(frame))

    @property
    def all_frames(self) -> list[int]:
        """Every frame the shot should have: present and missing, sorted."""
        return sorted(set(self.frames) | set(self.holes))

    @property
    def first(self) -> int:
        return self.all_frames[0]

    @property
    def last(self) -> int:
        return self.all_frames[-1]

    @property
    def frame_set(self) -> fileseq.FrameSet:
        """The frames present as a fileseq FrameSet (handy for chunking)."""
        return fileseq.FrameSet.from_iterable(self.frames, sort=True)

    def __len__(self) -> int:
        return len(self.frames)


@dataclass(frozen=True)
class _Template:
    basename: str
    extension: str
    padding: int | None  # None: any padding (`*` wildcard)
    frames: list[int] | None


def discover_sequence(plate: Where, frame_range: FrameRange | None = None) -> PlateSequence:
    """List the directory of the pattern `plate` once and return the plate sequence it names.

    `frame_range` (a fileseq range string such as "1001-1100", a FrameSet or frame numbers)
    overrides a range written in the pattern. Raises SequenceError when the pattern is empty,
    cannot be parsed, its directory cannot be listed or nothing matches.
    """
    if not isinstance(plate, Location):  # a path or URI (str() of anything, as always)
        plate = Location(str(plate) if plate is not None else "")
    pattern = plate.uri.strip()
    if not pattern:
        raise SequenceError("empty plate pattern: give a path or s3:// URI such as plate.####.exr")
    where = Location(pattern, plate.options)
    if _is_directory(where):
        directory = pattern.rstrip("/")
        entries = _list_entries(pattern, where.at(directory))
        names = sorted(entries)
        template = _template_from_directory(pattern, directory, names)
    else:
        directory, name = _split(pattern)
        template = _parse_template(pattern, directory, name)  # fail on syntax before listing
        entries = _list_entries(pattern, where.at(directory))
        names = sorted(entries)
    requested = _requested_frames(pattern, frame_range, template.frames)
    found = _match(names, template)
    if not found:
        raise SequenceError(
            f"pattern {pattern!r} matches no file in {directory!r} ({_listing_summary(names)})"
        )
    padding = template.padding if template.padding is not None else _infer_padding(found)
    if requested is None:
        present = sorted(found)
        holes = sorted(set(range(present[0], present[-1] + 1)) - set(present))
    else:
        wanted = set(requested)
        present = sorted(wanted & set(found))
        holes = sorted(wanted - set(found))
        if not present:
            raise SequenceError(
                f"pattern {pattern!r} in {directory!r}: none of the requested frames "
                f"{_frames_text(requested)} exist (found {_frames_text(sorted(found))})"
            )
    return PlateSequence(
        pattern=pattern,
        directory=directory,
        basename=template.basename,
        extension=template.extension,
        padding=padding,
        frames=present,
        holes=holes,
        location=where,
        requested=requested,
        names={frame: found[frame] for frame in present},
        listing={frame: entries[found[frame]] for frame in present},
    )


def iter_frames(
    seq: PlateSequence,
    frames: Iterable[int] | None = None,
    read_fn: ReadFn | None = None,
    **read_kwargs: Any,
) -> Iterator[Frame | FrameError]:
    """Read the sequence one frame at a time, yielding a Frame or a FrameError per frame.

    `frames` defaults to every frame the shot should have (`seq.all_frames`), so holes come
    out as FrameErrors instead of being skipped. `read_fn(uri, frame=..., **read_kwargs)`
    defaults to `storage.plate_reader.read_plate_frame` of the frame's location (the
    sequence's options). A frame
    whose data window or display window differs in size from the first good frame is
    reported as a FrameError. One bad frame never stops the others.
    """
    if read_fn is None:

        def read_fn(uri: str, **kwargs: Any) -> Frame:
            return read_plate_frame(seq.location.at(uri), **kwargs)

    wanted = seq.all_frames if frames is None else list(frames)
    present = set(seq.frames)
    reference: Frame | None = None
    for number in wanted:
        uri = seq.uri_for(number)
        if number not in present:
            yield FrameError(uri, number, "frame missing from the sequence (hole)")
            continue
        try:
            frame = read_fn(uri, frame=number, **read_kwargs)
        except FrameError as exc:
            yield exc
            continue
        except Exception as exc:  # one bad frame must not sink the shot; keep the cause
            error = FrameError(uri, number, f"unexpected {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            yield error
            continue
        if reference is None:
            reference = frame
        elif (mismatch := _size_mismatch(frame, reference)) is not None:
            yield FrameError(uri, number, mismatch)
            continue
        yield frame


def _size_mismatch(frame: Frame, reference: Frame) -> str | None:
    size, ref_size = (frame.width, frame.height), (reference.width, reference.height)
    display, ref_display = _box_size(frame.display_window), _box_size(reference.display_window)
    if size != ref_size:
        return (
            f"size {size[0]}x{size[1]} differs from {ref_size[0]}x{ref_size[1]} "
            f"of the first good frame ({reference.frame})"
        )
    if display != ref_display:
        return (
            f"display window {display[0]}x{display[1]} differs from "
            f"{ref_display[0]}x{ref_display[1]} of the first good frame ({reference.frame})"
        )
    return None


def _box_size(box: tuple[int, int, int, int]) -> tuple[int, int]:
    return box[2] - box[0] + 1, box[3] - box[1] + 1


def _split(pattern: str) -> tuple[str, str]:
    """Directory URI (no trailing '/') and file-name part of a pattern."""
    if "/" not in pattern:
        return ".", pattern
    directory, _, name = pattern.rpartition("/")
    if not directory:  # "/plate.####.exr"
        directory = "/"
    elif directory.endswith(":/"):  # "s3://bucket" style roots keep their "//"
        directory += "/"
    return directory, name


def _is_directory(where: Location) -> bool:
    """Whether the pattern names a directory: a trailing '/', or no sequence syntax and isdir."""
    pattern = where.uri
    if pattern.endswith("/"):
        return True
    name = pattern.rpartition("/")[2]
    if any(token in name for token in ("#", "@", "%", "$F", "*")):
        return False
    fs, path = where.fs_and_path()
    try:
        return bool(fs.isdir(path))
    except OSError:  # unreachable or forbidden: let the listing report it
        return False


def _list_entries(pattern: str, where: Location) -> dict[str, dict[str, Any]]:
    """File name -> listing entry in the directory `where`, from one listing call (paged by
    s3fs on big prefixes)."""
    directory = where.uri
    fs, path = where.fs_and_path()
    try:
        fs.invalidate_cache(path)  # listings are cached per instance and go stale
        entries = fs.ls(path, detail=True)
    except FileNotFoundError as exc:
        raise SequenceError(
            f"pattern {pattern!r}: directory {directory!r} does not exist ({exc})"
        ) from exc
    except PermissionError as exc:
        raise SequenceError(
            f"pattern {pattern!r}: access denied listing {directory!r} ({exc})"
        ) from exc
    except OSError as exc:
        raise SequenceError(f"pattern {pattern!r}: cannot list {directory!r} ({exc})") from exc
    return {
        str(entry["name"]).rstrip("/").rpartition("/")[2]: entry
        for entry in entries
        if entry.get("type") != "directory"
    }


def _parse_template(pattern: str, directory: str, name: str) -> _Template:
    wildcard = re.fullmatch(r"(?P<base>.*)\*(?P<ext>\.[^.]+)", name)
    if wildcard:
        return _Template(wildcard["base"], wildcard["ext"], None, None)
    try:
        parsed = fileseq.FileSequence(name)
    except fileseq.ParseException as exc:
        raise SequenceError(f"cannot parse pattern {pattern!r} in {directory!r}: {exc}") from exc
    pad_chars = parsed.padding()
    frame_set = parsed.frameSet()
    if not pad_chars and frame_set is None:
        raise SequenceError(
            f"pattern {pattern!r} in {directory!r} has no frame number or padding; "
            "use plate.####.exr, plate.%04d.exr, plate.1001-1100#.exr or plate.*.exr"
        )
    return _Template(
        basename=parsed.basename(),
        extension=parsed.extension(),
        padding=_padding_width(pad_chars),
        frames=list(frame_set) if frame_set is not None else None,
    )


def _template_from_directory(pattern: str, directory: str, names: list[str]) -> _Template:
    """The single image sequence of a directory; several or none is an error."""
    candidates = [
        seq
        for seq in fileseq.findSequencesInList(names)
        if seq.frameSet() is not None and seq.extension().lower() in IMAGE_EXTENSIONS
    ]
    groups = sorted({(seq.basename(), seq.extension()) for seq in candidates})
    if not groups:
        raise SequenceError(f"pattern {pattern!r}: no image sequence found in {directory!r}")
    if len(groups) > 1:
        listed = ", ".join(f"{base}*{ext}" for base, ext in groups)
        raise SequenceError(
            f"pattern {pattern!r}: {directory!r} holds several sequences ({listed}); "
            "name one, e.g. plate.####.exr"
        )
    base, ext = groups[0]
    return _Template(base, ext, None, None)


def _padding_width(pad_chars: str) -> int:
    """Digits a padding token stands for: `#` alone is 4 (fileseq); `####` is 4 (Nuke)."""
    if not pad_chars:
        return 0
    style = fileseq.PAD_STYLE_HASH4 if pad_chars == "#" else fileseq.PAD_STYLE_HASH1
    return int(fileseq.FileSequence.getPaddingNum(pad_chars, pad_style=style))


def _requested_frames(
    pattern: str, frame_range: FrameRange | None, from_pattern: list[int] | None
) -> list[int] | None:
    if frame_range is None:
        return sorted(set(from_pattern)) if from_pattern is not None else None
    try:
        if isinstance(frame_range, str):
            frames = list(fileseq.FrameSet(frame_range))
        else:
            frames = [int(frame) for frame in frame_range]
    except (fileseq.ParseException, TypeError, ValueError) as exc:
        raise SequenceError(
            f"pattern {pattern!r}: cannot parse frame range {frame_range!r} ({exc})"
        ) from exc
    if not frames:
        raise SequenceError(f"pattern {pattern!r}: the frame range {frame_range!r} is empty")
    return sorted(set(frames))


def _match(names: Iterable[str], template: _Template) -> dict[int, str]:
    """Frame number -> file name for listed names that fit the template's padding."""
    regex = re.compile(
        rf"{re.escape(template.basename)}(?P<frame>-?\d+){re.escape(template.extension)}"
    )
    found: dict[int, str] = {}
    for name in names:
        match = regex.fullmatch(name)
        if match is None:
            continue
        digits = match["frame"].lstrip("-")
        if template.padding is not None and not _fits_padding(digits, template.padding):
            continue
        number = int(match["frame"])
        if number in found:  # e.g. plate.1.exr and plate.01.exr with a `*` pattern
            raise SequenceError(
                f"frame {number} matches both {found[number]!r} and {name!r}; "
                "give the padding explicitly (e.g. plate.####.exr)"
            )
        found[number] = name
    return found


def _fits_padding(digits: str, width: int) -> bool:
    """Exactly `width` digits, or more when the number overflows the padding."""
    return len(digits) == width or (len(digits) > width and not digits.startswith("0"))


def _infer_padding(found: dict[int, str]) -> int:
    """Padding of a `*` or directory match: the digit count of zero-padded names, else 1."""
    widths = {
        len(name_digits)
        for name_digits in (_frame_digits(name, frame) for frame, name in found.items())
        if name_digits.startswith("0") and len(name_digits) > 1
    }
    if len(widths) == 1:
        return widths.pop()
    return min(len(str(abs(frame))) for frame in found)


def _frame_digits(name: str, frame: int) -> str:
    match = re.search(r"(\d+)(?=\.[^.]+$)", name)
    return match.group(1) if match else str(abs(frame))


def _listing_summary(names: list[str], limit: int = 5) -> str:
    """What the directory does hold, so a typo in the pattern is easy to spot."""
    if not names:
        return "the directory is empty"
    found = [str(seq) for seq in fileseq.findSequencesInList(names)]
    shown = ", ".join(found[:limit]) + (
        f" and {len(found) - limit} more" if len(found) > limit else ""
    )
    return f"it holds {shown}"


def _pad(frame: int, width: int) -> str:
    digits = str(abs(frame)).zfill(width)
    return f"-{digits}" if frame < 0 else digits


def _frames_text(frames: list[int]) -> str:
    return str(fileseq.FrameSet.from_iterable(frames, sort=True)) if frames else "none"
