"""Pruning versions by rule: which versions of which shots `svfx prune` (and the scheduled
``prune-versions`` flow) deletes, and which it matched but keeps, each with its reason.

A version matches when it matches every rule given:

- ``keep=N``: it is not one of the shot's N newest complete versions, nor made after the Nth
  of them (a shot with N complete versions or fewer matches nothing);
- ``older_than``: it was last made (its newest job's end, or start) before now minus that;
- ``invalidated``: a live output of it was made from a plate frame or checkpoint that has
  changed since (`schemas.catalog.queries.pruning` defines both precisely).

A matched version is kept, with the reason, when it is the shot's newest complete version
(never pruned), when a live job still writes it or its folder lies outside the allowed roots
(`tasks.deletion.refuse_unsafe`), and unless forced when it was published to a tracker or
another version still on disk was made from it (`tasks.deletion.keep_reasons`). Versions
deleted already, or whose delete stopped half way (`svfx delete` finishes those), are not
looked at. Every deletion goes through `tasks.deletion.delete`, one version at a time.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from schemas.catalog import queries
from schemas.catalog.models import utcnow
from schemas.catalog.queries.paging import Bind
from schemas.catalog.queries.pruning import Stale, stale_jobs
from schemas.catalog.queries.versions import Version, add_sizes
from schemas.settings import Settings
from schemas.spec import NAME
from tasks.deletion import DeleteRefused, keep_reasons, refuse_unsafe, split_shot_path

UNITS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}
UNITS["w"] = timedelta(weeks=1)
NEWEST = "the shot's newest complete version"
DURATION = re.compile(r"^\s*(\d+)\s*([mhdw])\s*$")


class PruneRefused(DeleteRefused):
    """A prune asked for with no rule, a bad rule or scope, or one that could only remove
    what it never removes."""


def parse_duration(text: str) -> timedelta:
    """``90m``, ``12h``, ``30d``, ``2w`` as a timedelta (a whole number and one unit)."""
    found = DURATION.match(text)
    if found is None or int(found.group(1)) == 0:
        raise PruneRefused(
            f"--older-than {text!r} is not a duration: a whole number above 0 and m, h, d or w "
            "(90m, 12h, 30d, 2w)"
        )
    return int(found.group(1)) * UNITS[found.group(2)]


def format_duration(span: timedelta) -> str:
    """The largest unit that states ``span`` exactly: 2w, 30d, 12h, 90m."""
    for unit in ("w", "d", "h", "m"):
        if span % UNITS[unit] == timedelta(0):
            return f"{span // UNITS[unit]}{unit}"
    return f"{int(span.total_seconds())}s"


@dataclass(frozen=True)
class PruneRules:
    """What to prune (a version must match every rule given) and where (a show, or one shot
    as SHOW/SEQ/SHOT; neither: the whole catalog)."""

    keep: int | None = None
    older_than: timedelta | None = None
    invalidated: bool = False
    show: str | None = None
    shot: str | None = None

    def __post_init__(self) -> None:
        if self.keep is None and self.older_than is None and not self.invalidated:
            raise PruneRefused("no rule given: --keep N, --older-than DURATION or --invalidated")
        if self.keep is not None and self.keep < 1:
            raise PruneRefused(
                f"--keep {self.keep}: keeps the N newest complete versions of each shot, "
                "N must be 1 or more"
            )
        if self.older_than is not None and self.older_than <= timedelta(0):
            raise PruneRefused(f"--older-than {self.older_than} is not a duration above 0")
        if self.show is not None and (not NAME.match(self.show) or self.show in (".", "..")):
            raise PruneRefused(f"--show must be a plain show name, got {self.show!r}")
        if self.shot is not None:
            try:
                show = split_shot_path(self.shot)[0]
            except DeleteRefused as exc:
                raise PruneRefused(f"--shot: {exc.message}") from None
            if self.show is not None and show != self.show:
                raise PruneRefused(f"--shot {self.shot} is not in --show {self.show}")

    def describe(self) -> str:
        """The rules as the command line gives them: ``--keep 3 --older-than 30d``."""
        words = []
        if self.keep is not None:
            words.append(f"--keep {self.keep}")
        if self.older_than is not None:
            words.append(f"--older-than {format_duration(self.older_than)}")
        if self.invalidated:
            words.append("--invalidated")
        if self.shot is not None:
            words.append(f"--shot {self.shot}")
        elif self.show is not None:
            words.append(f"--show {self.show}")
        return " ".join(words)

    def scope(self) -> tuple[str | None, str | None, str | None]:
        if self.shot is not None:
            return split_shot_path(self.shot)
        return self.show, None, None


@dataclass(frozen=True)
class PruneItem:
    version: Version
    why: str


@dataclass
class PrunePlan:
    """The versions a prune deletes and those it matched but keeps, by shot, oldest first."""

    rules: PruneRules
    force: bool = False
    delete: list[PruneItem] = field(default_factory=list)
    kept: list[PruneItem] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)  # what --force let through, and why

    @property
    def size_bytes(self) -> int:
        """What the catalog says the versions to delete occupy."""
        return sum(item.version.size_bytes for item in self.delete)

    @property
    def reason(self) -> str:
        """What each deletion records as its reason."""
        return f"prune: {self.rules.describe()}" + (" --force" if self.force else "")


def plan_prune(
    bind: Bind,
    settings: Settings,
    rules: PruneRules,
    *,
    force: bool = False,
    now: datetime | None = None,
) -> PrunePlan:
    """What pruning by ``rules`` deletes and keeps (see the module); refuses an unknown show or
    shot and, for one shot, a prune whose every match is the shot's only complete version."""
    show, sequence, shot = rules.scope()
    if not queries.scope_exists(bind, show, sequence, shot):
        named = rules.shot or rules.show
        raise PruneRefused(f"the catalog has no {'shot' if rules.shot else 'show'} {named}")
    versions = queries.shot_versions(bind, show, sequence, shot, with_sizes=False)
    stale = stale_jobs(bind, show, sequence, shot) if rules.invalidated else {}
    plan = PrunePlan(rules, force)
    by_shot: dict[int, list[Version]] = defaultdict(list)
    for version in versions:
        by_shot[version.shot_id].append(version)
    for shot_versions in by_shot.values():
        _plan_shot(plan, settings, shot_versions, stale, now or utcnow())
    if rules.shot is not None:
        _refuse_only_complete(plan, versions)
    add_sizes(bind, [item.version for item in plan.delete + plan.kept])
    return plan


def _plan_shot(
    plan: PrunePlan,
    settings: Settings,
    versions: list[Version],
    stale: dict[int, list[Stale]],
    now: datetime,
) -> None:
    """Add one shot's matched versions to the plan, to delete or to keep."""
    on_disk = [v for v in versions if v.deletion is None]
    complete = sorted((v for v in on_disk if v.complete), key=_newest_first, reverse=True)
    newest = complete[0] if complete else None
    for version in on_disk:
        why = _matches(plan.rules, version, complete, stale, now)
        if why is None:
            continue
        kept = _kept_because(plan, settings, version, newest, versions)
        if kept is not None:
            plan.kept.append(PruneItem(version, f"{why}; kept: {kept}"))
        else:
            plan.delete.append(PruneItem(version, why))


def _newest_first(version: Version) -> tuple[datetime, int]:
    return version.made_at, version.newest_job.id


def _matches(
    rules: PruneRules,
    version: Version,
    complete: list[Version],
    stale: dict[int, list[Stale]],
    now: datetime,
) -> str | None:
    """Why every rule matches the version ('; '-joined), or None when one does not."""
    why = []
    if rules.keep is not None:
        if len(complete) <= rules.keep or any(version is c for c in complete[: rules.keep]):
            return None
        if _newest_first(version) > _newest_first(complete[rules.keep - 1]):
            return None  # made after the Nth newest complete version
        why.append(f"older than the {rules.keep} newest complete")
    if rules.older_than is not None:
        if version.made_at >= now - rules.older_than:
            return None
        why.append(f"made over {format_duration(rules.older_than)} ago")
    if rules.invalidated:
        causes = [s for job in version.jobs for s in stale.get(job.id, [])]
        if not causes:
            return None
        why += [cause.describe() for cause in causes]
    return "; ".join(why)


def _kept_because(
    plan: PrunePlan,
    settings: Settings,
    version: Version,
    newest: Version | None,
    versions: list[Version],
) -> str | None:
    """Why a matched version stays (None: it goes); what --force lets through is noted."""
    if version is newest:
        return NEWEST
    try:
        refuse_unsafe(version, settings)
    except DeleteRefused as exc:
        return exc.message.removeprefix(f"{version.name} {version.label}: ")
    reasons = keep_reasons(version, versions)
    if reasons and not plan.force:
        return f"{reasons[0]} (--force deletes it)"
    plan.forced += [f"{version.name} {version.label}: {why}" for why in reasons]
    return None


def _refuse_only_complete(plan: PrunePlan, versions: list[Version]) -> None:
    """One shot named, and all the rules match there is its only complete version."""
    complete = [v for v in versions if v.complete]
    if plan.delete or len(plan.kept) != 1 or len(complete) != 1:
        return
    [item] = plan.kept
    if item.version is not complete[0]:
        return
    why = item.why.removesuffix(f"; kept: {NEWEST}")
    raise PruneRefused(
        f"{item.version.name} {item.version.label} is the shot's only complete version "
        f"({why}); prune never removes it"
    )
