"""The studio the catalog bench records: a year of a mid-size show as a deterministic plan.

``studio(outputs, seed)`` makes one `ShotHistory` per shot (about one shot per 500 outputs, in
shows of up to 1,000 shots and sequences of 25): each shot's per-frame versions (new
checkpoints make a new version), its stabilised version now and then, the jobs of each version
(the first run, a resubmit that redoes the frames that failed, no-op resubmits; about ten jobs
a shot), which versions temporal QC scored and which were published. Frame counts are scaled so
the outputs add up to about ``outputs``. Everything comes from ``random.Random`` seeded per
shot, so a plan is the same whatever the number of processes that record it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from schemas.passes import expected_outputs

OUTPUTS_PER_SHOT = 500
JOBS_PER_SHOT = 10
SHOTS_PER_SEQUENCE = 25
SHOTS_PER_SHOW = 1000
SHOWS = ("atlas", "borealis", "cobalt", "dunmore", "ember", "fjord", "granite", "halcyon")
ARTISTS = ("alice", "bruno", "chiara", "dev", "emeka", "farah", "goran", "hana")
PASS_SETS = (("normal", "seg", "pose"), ("normal", "seg", "matte", "pose"))
FIRST_FRAME = 1001
MIN_FRAMES = 8


@dataclass(frozen=True)
class VersionPlan:
    """One version of a shot and the jobs that made it."""

    version: str
    generation: int  # which checkpoints made it (0: untrained stand-ins)
    failed: tuple[int, ...] = ()  # frames the first job failed
    fixed: bool = False  # a resubmit redid the failed frames
    noops: int = 0  # no-op resubmits after that (every frame skipped)
    source: str | None = None  # a stabilised version's per-frame version
    qc: bool = True  # temporal QC scored it
    publish: str | None = None  # None, "published" or "pending"

    @property
    def jobs(self) -> int:
        return 1 + int(self.fixed) + self.noops


@dataclass(frozen=True)
class ShotHistory:
    index: int
    show: str
    sequence: str
    shot: str
    frames: tuple[int, ...]
    passes: tuple[str, ...]
    versions: tuple[VersionPlan, ...]

    @property
    def path(self) -> str:
        return f"{self.show}/{self.sequence}/{self.shot}"

    @property
    def outputs_per_frame(self) -> int:
        """Rows a finished frame of a version has: one per EXR part, Zarr array, preview and
        pose fragment."""
        parts = {"seg": 2}  # seg's EXR has its labels and its Cryptomatte parts
        return sum(parts.get(name, 1) if kind == "exr" else 1 for kind, name in self.wanted)

    @property
    def wanted(self) -> set[tuple[str, str]]:
        return expected_outputs(self.passes, True)

    @property
    def outputs(self) -> int:
        per_frame = self.outputs_per_frame
        return sum(
            per_frame * (len(self.frames) - (0 if v.fixed else len(v.failed)))
            for v in self.versions
        )

    @property
    def jobs(self) -> int:
        return sum(v.jobs for v in self.versions)


@dataclass(frozen=True)
class _Draft:
    index: int
    weight: float  # the shot's relative length
    passes: tuple[str, ...]


def shot_names(index: int, count: int) -> tuple[str, str, str]:
    """(show, sequence, shot) of shot ``index`` of ``count``: shows of up to SHOTS_PER_SHOW
    shots, spread evenly, sequences of SHOTS_PER_SEQUENCE."""
    shows = min(len(SHOWS), 1 + (count - 1) // SHOTS_PER_SHOW)
    per_show = -(-count // shows)
    show, within = divmod(index, per_show)
    sequence, shot = divmod(within, SHOTS_PER_SEQUENCE)
    return SHOWS[show], f"sq{(sequence + 1) * 10:04d}", f"sh{(shot + 1) * 10:04d}"


def studio(outputs: int, seed: int) -> list[ShotHistory]:
    """The shots to record for about ``outputs`` outputs (see the module)."""
    count = max(2, outputs // OUTPUTS_PER_SHOT)
    drafts = []
    for index in range(count):
        rng = random.Random(f"{seed}:{index}:draft")
        weight = min(6.0, rng.lognormvariate(0.0, 0.5))
        drafts.append(_Draft(index, weight, rng.choices(PASS_SETS, (3, 1))[0]))
    # scale the lengths so the outputs add up: first guessing 1.6 versions of every frame,
    # then once more with the versions the shots have
    scale = outputs / sum(d.weight * _per_frame(d.passes) * 1.6 for d in drafts)
    for _ in range(2):
        shots = [_history(seed, d, count, max(MIN_FRAMES, round(d.weight * scale))) for d in drafts]
        scale *= outputs / sum(s.outputs for s in shots)
    return shots


def _per_frame(passes: tuple[str, ...]) -> int:
    return ShotHistory(0, "", "", "", (), passes, ()).outputs_per_frame


def _history(seed: int, draft: _Draft, count: int, length: int) -> ShotHistory:
    rng = random.Random(f"{seed}:{draft.index}:history")
    frames = tuple(range(FIRST_FRAME, FIRST_FRAME + length))
    versions = [_per_frame_version(rng, frames, 1, 0 if rng.random() < 0.02 else 1)]
    if rng.random() < 0.45:
        versions.append(_per_frame_version(rng, frames, 2, 2))
        if rng.random() < 0.2:
            versions.append(_per_frame_version(rng, frames, 3, 3))
    if rng.random() < 0.12:  # a stabilised version of the newest per-frame one
        newest = versions[-1]
        stabilised = VersionPlan(
            f"v{len(versions) + 1:03d}", newest.generation, source=newest.version
        )
        versions.append(stabilised)
    versions = _with_noops(rng, versions)
    versions = _with_publishes(rng, versions)
    show, sequence, shot = shot_names(draft.index, count)
    return ShotHistory(draft.index, show, sequence, shot, frames, draft.passes, tuple(versions))


def _per_frame_version(
    rng: random.Random, frames: tuple[int, ...], number: int, generation: int
) -> VersionPlan:
    failed: tuple[int, ...] = ()
    if rng.random() < 0.3:
        failed = tuple(sorted(rng.sample(frames, min(len(frames) - 1, rng.randint(1, 4)))))
    fixed = bool(failed) and rng.random() < 0.8
    return VersionPlan(
        f"v{number:03d}", generation, failed, fixed, qc=rng.random() < 0.9 or number > 1
    )


def _with_noops(rng: random.Random, versions: list[VersionPlan]) -> list[VersionPlan]:
    """No-op resubmits spread over the versions, about JOBS_PER_SHOT jobs a shot in all."""
    base = sum(v.jobs for v in versions)
    extra = max(0, rng.randint(JOBS_PER_SHOT - 3, JOBS_PER_SHOT + 3) - base)
    counts = [0] * len(versions)
    for _ in range(extra):
        counts[rng.randrange(len(versions))] += 1
    return [_replace(v, noops=n) for v, n in zip(versions, counts, strict=True)]


def _with_publishes(rng: random.Random, versions: list[VersionPlan]) -> list[VersionPlan]:
    """The newest version published to the tracker on about half the shots (pending on some:
    the tracker was down); an older version now and then."""
    out = []
    for i, v in enumerate(versions):
        newest = i == len(versions) - 1
        roll = rng.random()
        if roll < (0.4 if newest else 0.1):
            v = _replace(v, publish="published")
        elif newest and roll < 0.48:
            v = _replace(v, publish="pending")
        out.append(v)
    return out


def _replace(version: VersionPlan, **changes: object) -> VersionPlan:
    return replace(version, **changes)  # type: ignore[arg-type]
