"""The bucket scan: find plate sequences under S3 prefixes by a naming template, compare each
frame's object (size and ETag) with the catalog, and submit ``process_shot`` for sequences that
are new or whose frames changed.

What a scan decides for each sequence it finds:

- ``up to date``: every frame listed has been read by a worker with the same size and ETag.
- ``in flight``: a run for this plate has not finished yet; never submitted twice.
- ``settling``: an object was written less than ``settle_seconds`` ago, so the upload may
  still be going on; the next scan looks again. A frame missing between others when a run
  starts is a hole: the job ends ``partial`` naming it, never ``complete``, and the next scan
  submits the frame once it arrives.
- ``deferred``: the cap on shots in flight is reached; the next scan submits it.
- ``new`` / ``changed``: submitted (the whole listed range; planning skips frames whose
  checksum and models are unchanged, so only new and changed frames are computed).
- ``rejected``: its names do not make a valid shot (the reason is given).

Keys that do not match the template are listed in the report, never processed by guesswork.
The scan's own cost is one listing per prefix and one catalog query per 500 plates: no
object is opened or HEADed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import fileseq

from schemas.catalog.writer import Catalog
from schemas.settings import Settings
from schemas.spec import ShotSpec, SpecError, check_paths, parse_spec
from storage.object_listing import ObjectInfo, list_objects
from storage.retry import RetryPolicy

from .plate_template import PlateTemplate
from .submission import Submitter, plate_key

log = logging.getLogger("svfx.scan")

SUBMITTED = ("new", "changed")
REFUSED = ("rejected", "error")


@dataclass(frozen=True)
class ScanDefaults:
    """What every shot a scan submits is asked for (the rest of ShotSpec's defaults apply)."""

    passes: tuple[str, ...] | None = None
    model_size: str = ShotSpec.model_fields["model_size"].default
    output_root: str | None = None
    version: str = ShotSpec.model_fields["version"].default
    exr_layout: str = ShotSpec.model_fields["exr_layout"].default
    tiles: str = ShotSpec.model_fields["tiles"].default
    colorspace: str | None = None
    checkpoint_root: str | None = None
    settle_seconds: float = 120.0
    max_in_flight: int = 4
    submitter: str = "svfx-scan"
    listing: RetryPolicy = field(default_factory=RetryPolicy)  # per prefix


@dataclass
class FoundSequence:
    plate: str  # full URI with the template's frame token
    fields: dict[str, str]
    frames: dict[int, ObjectInfo] = field(default_factory=dict)

    @property
    def newest(self) -> float | None:
        times = [o.modified for o in self.frames.values() if o.modified is not None]
        return max(times) if times else None


@dataclass
class SequenceDecision:
    plate: str
    shot: str  # show/seq/shot[/element]
    action: str
    frames: int  # frames listed
    redo: list[int] = field(default_factory=list)  # frames new or changed since last read
    reason: str = ""
    run_id: str | None = None
    spec: ShotSpec | None = field(default=None, repr=False)  # what would be submitted

    def as_dict(self) -> dict[str, Any]:
        return {
            "plate": self.plate,
            "shot": self.shot,
            "action": self.action,
            "frames": self.frames,
            "redo": _ranges(self.redo),
            "reason": self.reason,
            "run_id": self.run_id,
        }


@dataclass
class ScanReport:
    prefixes: list[str]
    template: str
    dry_run: bool
    objects: int = 0
    sequences: list[SequenceDecision] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def to_submit(self) -> list[SequenceDecision]:
        return [d for d in self.sequences if d.action in SUBMITTED]

    @property
    def refused(self) -> list[SequenceDecision]:
        """Sequences rejected (names, roots) or whose submission failed."""
        return [d for d in self.sequences if d.action in REFUSED]

    @property
    def nothing_new(self) -> bool:
        return not self.to_submit and not self.refused

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for decision in self.sequences:
            counts[decision.action] = counts.get(decision.action, 0) + 1
        return counts

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefixes": self.prefixes,
            "template": self.template,
            "dry_run": self.dry_run,
            "objects": self.objects,
            "counts": self.counts(),
            "sequences": [d.as_dict() for d in self.sequences],
            "unmatched": self.unmatched,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
        }


def find_sequences(
    prefixes: Iterable[str],
    template: PlateTemplate,
    settings: Settings,
    report: ScanReport,
    policy: RetryPolicy | None = None,
) -> list[FoundSequence]:
    """List each prefix once and group the objects matching the template into sequences."""
    found: dict[str, FoundSequence] = {}
    for prefix in prefixes:
        base = prefix.rstrip("/")
        try:
            objects = list_objects(settings.location(base), policy)
        except OSError as exc:
            report.errors.append(f"{base}: {exc}")
            log.error("scan: %s: %s", base, exc)
            continue
        report.objects += len(objects)
        for obj in objects:
            match = template.match(obj.key)
            if match is None:
                report.unmatched.append(obj.uri)
                continue
            plate = f"{base}/{match.pattern}"
            sequence = found.setdefault(plate, FoundSequence(plate, match.fields))
            sequence.frames[match.frame] = obj
    return [found[key] for key in sorted(found)]


def scan_bucket(
    prefixes: Iterable[str],
    template: str,
    *,
    catalog: Catalog,
    submitter: Submitter,
    settings: Settings,
    defaults: ScanDefaults | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> ScanReport:
    """One scan: list, compare with the catalog, submit (unless ``dry_run``), report."""
    started = time.perf_counter()
    defaults = defaults or ScanDefaults()
    prefixes = [p.rstrip("/") for p in prefixes]
    parsed = PlateTemplate.parse(template)
    report = ScanReport(prefixes=prefixes, template=parsed.text, dry_run=dry_run)
    sequences = find_sequences(prefixes, parsed, settings, report, defaults.listing)
    states = catalog.plate_frame_states(s.plate for s in sequences) if sequences else {}
    in_flight: dict[str, str] | None = None  # asked only when something needs submitting
    room = 0
    now = time.time() if now is None else now
    for sequence in sequences:
        decision = _decide(sequence, states.get(plate_key(sequence.plate)), defaults, settings)
        if decision.action in SUBMITTED:
            if in_flight is None:
                in_flight = submitter.in_flight()
                room = max(0, defaults.max_in_flight - len(in_flight))
            decision = _gate(decision, sequence, in_flight, room, defaults, now)
        report.sequences.append(decision)
        if decision.action not in SUBMITTED:
            continue
        room -= 1
        if dry_run:
            continue
        assert decision.spec is not None  # _decide built it
        try:
            decision.run_id = submitter.submit(decision.spec, reason=decision.action)
        except Exception as exc:  # one failed submission must not end the scan
            decision.action = "error"
            decision.reason = f"submission failed: {str(exc) or type(exc).__name__}"
            log.error("scan: %s: %s", sequence.plate, decision.reason)
    report.seconds = time.perf_counter() - started
    return report


def scan_with_catalog(
    prefixes: Iterable[str],
    template: str,
    *,
    settings: Settings,
    submitter: Submitter,
    defaults: ScanDefaults,
    dry_run: bool = False,
) -> tuple[ScanReport, list[dict[str, Any]]]:
    """A scan against the configured catalog, as ``svfx scan`` and the ``scan-plates`` flow
    run it: first (unless a dry run) close jobs whose flow died, so their frames count as
    not done; returns the report and the jobs closed."""
    from schemas.catalog import open_catalog

    from .reaper import reap_abandoned_jobs

    catalog = open_catalog(settings.catalog)
    try:
        reaped = [] if dry_run else reap_abandoned_jobs(catalog)
        report = scan_bucket(
            prefixes,
            template,
            catalog=catalog,
            submitter=submitter,
            settings=settings,
            defaults=defaults,
            dry_run=dry_run,
        )
    finally:
        catalog.close()
    return report, reaped


def report_lines(report: ScanReport, limit: int = 50) -> list[str]:
    """The report as short lines: what was found, what was (or would be) submitted, and why
    anything else was held back; unmatched keys by name."""
    verb = "would submit" if report.dry_run else "submitted"
    lines = [
        f"scanned {', '.join(report.prefixes)}: {report.objects} objects, "
        f"{len(report.sequences)} sequences in {report.seconds:.2f} s"
    ]
    if report.nothing_new:
        lines.append("nothing new: every sequence found is up to date, in flight or waiting")
    if report.refused:
        lines.append(f"{len(report.refused)} sequences refused (listed below with the reason)")
    for d in report.sequences:
        if d.action == "up to date":
            continue
        head = f"{verb} ({d.action})" if d.action in ("new", "changed") else d.action
        run = f" run {d.run_id}" if d.run_id else ""
        lines.append(f"  {head}: {d.shot} {d.plate} [{d.frames} frames]{run}: {d.reason}")
    if report.unmatched:
        lines.append(f"{len(report.unmatched)} objects do not match {report.template!r}:")
        lines += [f"  {uri}" for uri in report.unmatched[:limit]]
        if len(report.unmatched) > limit:
            lines.append(f"  ... and {len(report.unmatched) - limit} more")
    return lines


def _decide(
    sequence: FoundSequence,
    known: dict[int, tuple[int | None, str | None, bool]] | None,
    defaults: ScanDefaults,
    settings: Settings,
) -> SequenceDecision:
    decision = SequenceDecision(
        plate=sequence.plate,
        shot="/".join(
            sequence.fields[k] for k in ("show", "seq", "shot", "plate") if k in sequence.fields
        ),
        action="up to date",
        frames=len(sequence.frames),
    )
    try:
        decision.spec = _spec_for(sequence, defaults)
        problems = check_paths(decision.spec, settings.roots, settings.outputs)
        if problems:
            raise SpecError("; ".join(problems))
    except SpecError as exc:
        decision.action, decision.reason = "rejected", str(exc)
        return decision
    known = known or {}
    decision.redo = sorted(
        frame for frame, obj in sequence.frames.items() if _changed(obj, known.get(frame))
    )
    if decision.redo:
        decision.action = "changed" if known else "new"
        decision.reason = f"{len(decision.redo)} of {decision.frames} frames new or changed"
    return decision


def _changed(obj: ObjectInfo, known: tuple[int | None, str | None, bool] | None) -> bool:
    """Whether a worker has yet to read this object as it is now (size and ETag)."""
    if known is None:
        return True
    size, fingerprint, read = known
    return not read or fingerprint != obj.fingerprint or (size is not None and size != obj.size)


def _gate(
    decision: SequenceDecision,
    sequence: FoundSequence,
    in_flight: dict[str, str],
    room: int,
    defaults: ScanDefaults,
    now: float,
) -> SequenceDecision:
    """Hold back a sequence that is running, still arriving, or over the cap."""
    running = in_flight.get(plate_key(sequence.plate))
    newest = sequence.newest
    if running:
        decision.action, decision.run_id = "in flight", running
        decision.reason = f"run {running} has not finished; {decision.reason}"
    elif newest is not None and now - newest < defaults.settle_seconds:
        decision.action = "settling"
        decision.reason = (
            f"newest object written {max(0.0, now - newest):.0f} s ago "
            f"(waits {defaults.settle_seconds:.0f} s for the upload to finish)"
        )
    elif room <= 0:
        decision.action = "deferred"
        decision.reason = f"{defaults.max_in_flight} shots already in flight; next scan"
    return decision


def _spec_for(sequence: FoundSequence, defaults: ScanDefaults) -> ShotSpec:
    """The whole listed range, first to last frame: a frame missing in between is a hole
    (recorded as a failed frame), so a half-uploaded sequence never ends ``complete``."""
    frames = sorted(sequence.frames)
    data: dict[str, Any] = {
        "plate": sequence.plate,
        "show": sequence.fields["show"],
        "sequence": sequence.fields["seq"],
        "shot": sequence.fields["shot"],
        "element": sequence.fields.get("plate"),
        "frames": f"{frames[0]}-{frames[-1]}" if len(frames) > 1 else str(frames[0]),
        "model_size": defaults.model_size,
        "output_root": defaults.output_root,
        "version": defaults.version,
        "exr_layout": defaults.exr_layout,
        "tiles": defaults.tiles,
        "colorspace": defaults.colorspace,
        "checkpoint_root": defaults.checkpoint_root,
        "submitter": defaults.submitter,
    }
    if defaults.passes:
        data["passes"] = list(defaults.passes)
    return parse_spec(data)


def _ranges(frames: list[int]) -> str:
    return str(fileseq.FrameSet(frames)) if frames else ""
