"""A stabilised version's spec, from the per-frame version it is made of.

`svfx stabilise SHOT --version v001` (and `--temporal stabilize` on submit, once the
per-frame run is over) asks here for the spec of the new version: the source version's own
spec (so the same plate, frames, checkpoints and layout), with ``temporal`` "stabilize",
``source_version``, the fusion's method (``tasks.stabilise.settings.METHOD``) and the version it
is written to. That version is the one a stabilisation of the same source with the same
settings and method already has (so a run killed half way resumes into it), else the next
version number free for the shot (in the catalog and on disk): never the source's, never over
another (so a version made by an earlier method stays as it was, and a new one goes beside).

Refused by name, before anything runs: a source version the catalog does not know, one that
is not complete (running, partial, failed: stabilised frames would fuse holes), one of under
three frames (nothing to stabilise: the per-frame version stands), and a pass asked for that
the source was made without.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from schemas.catalog import queries
from schemas.catalog.writer import Catalog
from schemas.settings import Settings
from schemas.spec import STABILISE, ShotSpec, SpecError, parse_spec, split_shot_path
from storage.uri import is_remote
from tasks.output_paths import ShotOutputPaths

MIN_FRAMES = 3  # a frame and a neighbour on each side


class NothingToStabilise(SpecError):
    """The source version has too few frames; it stands as it is."""

    exit_code = 0


def stabilised_spec(
    catalog: Catalog,
    settings: Settings,
    shot_path: str,
    source_version: str,
    *,
    element: str | None = None,
    passes: Sequence[str] | None = None,
    radius: int | None = None,
) -> ShotSpec:
    """The spec of the stabilised version of ``shot_path``'s ``source_version`` (see the
    module); SpecError naming the shot and version when it cannot be made."""
    show, sequence, shot = _split(shot_path)
    jobs = _jobs(catalog, show, sequence, shot, element)
    source = _source_job(jobs, shot_path, source_version)
    spec = parse_spec(source["spec"])
    asked = tuple(passes) if passes else spec.passes
    missing = [name for name in asked if name not in spec.passes]
    if missing:
        raise SpecError(
            f"{shot_path} {source_version} was made without {', '.join(missing)}: stabilising "
            f"{'it' if len(missing) == 1 else 'them'} needs the per-frame passes (submit "
            f"{source_version} again with them first)"
        )
    # here, past every refusal: the fusion's module brings torch, and a refusal answers in a
    # second before any heavy import (tests/test_cli_trust.py)
    from tasks.stabilise.settings import METHOD as FUSION_METHOD

    settings_of = {"passes": list(asked), "temporal_radius": radius or spec.temporal_radius}
    wanted = {
        **spec.model_dump(mode="json"),
        **settings_of,
        "temporal": STABILISE,
        "source_version": source_version,
        "fusion_method": FUSION_METHOD,
    }
    version = _version_for(jobs, wanted, settings, spec)
    return parse_spec({**wanted, "version": version})


def _split(shot_path: str) -> tuple[str, str, str]:
    names = split_shot_path(shot_path)
    if names is None:
        raise SpecError(f"a shot is SHOW/SEQ/SHOT, got {shot_path!r}")
    return names


def _jobs(
    catalog: Catalog, show: str, sequence: str, shot: str, element: str | None
) -> list[dict[str, Any]]:
    """The shot's jobs (of this plate element), newest first."""
    rows, _total = queries.jobs_page(
        catalog.engine, show=show, sequence=sequence, shot=shot, limit=10_000
    )
    return [r for r in rows if (r.get("spec") or {}).get("element") == element]


def _source_job(jobs: list[dict[str, Any]], shot_path: str, version: str) -> dict[str, Any]:
    made = [
        j
        for j in jobs
        if j["spec"].get("version") == version and not j["spec"].get("source_version")
    ]
    if not made:
        known = sorted({j["spec"].get("version") for j in jobs if j.get("spec")})
        listed = f" (it has {', '.join(known)})" if known else " (it has no jobs)"
        raise SpecError(f"{shot_path} has no per-frame version {version} in the catalog{listed}")
    newest = made[0]
    if newest["status"] != "complete":
        raise SpecError(
            f"{shot_path} {version} is {newest['status']} (job {newest['id']}: "
            f"{newest['frames_done'] + newest['frames_skipped']} of {newest['frames_total']} "
            "frames): stabilising needs every frame; submit it again to finish it first"
        )
    frames = newest["frames_total"]
    if frames < MIN_FRAMES:
        raise NothingToStabilise(
            f"{shot_path} {version} has {frames} frame{'s' if frames != 1 else ''}: nothing to "
            f"stabilise (it takes {MIN_FRAMES} or more); the per-frame version stands"
        )
    return newest


def _version_for(
    jobs: list[dict[str, Any]], wanted: dict[str, Any], settings: Settings, spec: ShotSpec
) -> str:
    """The version a stabilisation with these settings already writes, else the next free."""
    same = ("source_version", "temporal_radius", "passes", "fusion_method")
    for job in jobs:
        made = job["spec"]
        if made.get("source_version") and all(made.get(k) == wanted[k] for k in same):
            return str(made["version"])
    taken = {int(j["spec"]["version"][1:]) for j in jobs if j["spec"].get("version")}
    taken |= _versions_on_disk(settings, spec)
    number = max(taken | {int(spec.version[1:])}) + 1
    return f"v{number:0{max(3, len(spec.version) - 1)}d}"


def _versions_on_disk(settings: Settings, spec: ShotSpec) -> set[int]:
    """Version numbers of the shot's output folders (of the spec's family) on local disk: a
    folder the catalog lost track of is never written over."""
    root = spec.output_root or settings.outputs
    probe = ShotOutputPaths.for_shot(
        root, spec.show, spec.sequence, spec.shot, "v000", element=spec.element,
        family=spec.output_family,
    )  # fmt: skip
    folder, _, name = probe.root.rpartition("/")
    if is_remote(folder) or not os.path.isdir(folder):
        return set()
    try:
        entries = os.listdir(folder)
    except OSError as exc:  # unreadable: the version could land on a folder it cannot see
        raise SpecError(f"{folder}: cannot list the shot's versions: {exc.strerror}") from None
    prefix = name.removesuffix("v000")
    pattern = re.compile(re.escape(prefix) + r"v(\d{3,4})$")
    return {int(m.group(1)) for entry in entries if (m := pattern.match(entry))}
