"""What a publish makes, as one value built from the catalog: the shot and task it goes
under, the version's name and number, the review clip and contact sheet (movie and
thumbnail), the comment (passes, models, untrained said so, frames), and the files to record
(the EXR sequence as ``%04d`` with its range, the Zarr store, the Nuke script)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from schemas.catalog import queries
from schemas.settings import Settings
from schemas.spec import ShotSpec
from storage.location import Location
from tasks.output_paths import ShotOutputPaths

from .errors import PublishRefused

_FRAME = re.compile(r"\.(-?\d+)\.exr$")


@dataclass(frozen=True)
class PublishedFile:
    """One file record: ``kind`` (exr, zarr, nuke), its path (a sequence as ``%04d``)."""

    kind: str
    path: str
    name: str  # the version-less name trackers group a file's history by


@dataclass(frozen=True)
class PublishItem:
    job_id: int
    show: str
    sequence: str
    shot: str
    task: str  # the task (type) the version goes under
    code: str  # the version's name: <shot>[_<element>]_<family>_<version>
    version: str  # v001
    version_number: int
    first_frame: int
    last_frame: int
    passes: tuple[str, ...]
    models: tuple[dict[str, Any], ...]  # pass, family, arch, task, trained, sha256
    movie: Location | None  # the review clip (mp4) of the review pass
    thumbnail: Location | None  # the contact sheet of the review pass
    review_pass: str | None
    files: tuple[PublishedFile, ...]
    create_missing: bool = False

    @property
    def untrained(self) -> list[str]:
        return [m["pass_name"] for m in self.models if not m["trained"]]

    @property
    def frame_range(self) -> str:
        return f"{self.first_frame}-{self.last_frame}"

    @property
    def comment(self) -> str:
        """The version's description: passes, models, frames, files; untrained said first."""
        lines = []
        if self.untrained:
            lines.append(
                "UNTRAINED models (random weights) for "
                f"{', '.join(self.untrained)}: these are not meaningful passes."
            )
        passes = ", ".join(self.passes)
        lines.append(f"sapiens-vfx {self.code} (job {self.job_id}): passes {passes}")
        for m in self.models:
            weights = "untrained, random weights" if not m["trained"] else "trained"
            lines.append(
                f"model {m['pass_name']}: {m['family']} {m['arch']} ({weights}; "
                f"sha256 {str(m['sha256'])[:12]})"
            )
        lines.append(f"frames {self.frame_range} ({self.last_frame - self.first_frame + 1} frames)")
        if self.review_pass:
            lines.append(f"review: {self.review_pass}")
        lines += [f"{f.kind}: {f.path}" for f in self.files]
        return "\n".join(lines)


def item_for_job(engine: Engine, job_id: int, settings: Settings) -> PublishItem:
    """The publish of a complete job; PublishRefused naming the job and what is missing
    when it is unknown or not complete."""
    job = queries.job(engine, job_id)
    if job is None:
        raise PublishRefused(f"the catalog has no job {job_id}")
    where = f"job {job_id} ({job['show']}/{job['sequence']}/{job['shot']})"
    if job["status"] != "complete":
        missing = _what_is_missing(job)
        raise PublishRefused(f"{where} is {job['status']}, not complete: {missing}")
    spec = ShotSpec.model_validate(job["spec"])
    root, exr = queries.job_output_root(engine, job_id)
    frames = queries.job_frame_range(engine, job_id)
    if root is None or frames is None:
        raise PublishRefused(f"{where} has no outputs recorded to publish")
    found = _FRAME.search(exr or "")
    padding = len(found.group(1).lstrip("-")) if found else 4
    name = ShotOutputPaths.for_shot(
        "/", spec.show, spec.sequence, spec.shot, spec.version,
        padding, element=spec.element, family=spec.output_family,
    ).name  # fmt: skip
    paths = ShotOutputPaths(settings.location(root), name, max(4, padding))
    review = _review_pass(paths, spec.passes, settings.publish_review_pass)
    files = [PublishedFile("exr", paths.exr_pattern, f"{spec.shot}_{spec.output_family}.exr")]
    if _exists(paths.at(paths.zarr)):
        files.append(PublishedFile("zarr", paths.zarr, f"{spec.shot}_{spec.output_family}.zarr"))
    if _exists(paths.at(paths.nuke_script)):
        name_nk = f"{spec.shot}_{spec.output_family}.nk"
        files.append(PublishedFile("nuke", paths.nuke_script, name_nk))
    return PublishItem(
        job_id=job_id,
        show=spec.show,
        sequence=spec.sequence,
        shot=spec.shot,
        task=settings.publish_task,
        code=name,
        version=spec.version,
        version_number=int(spec.version.lstrip("v") or 0),
        first_frame=frames[0],
        last_frame=frames[1],
        passes=tuple(spec.passes),
        models=tuple(sorted(queries.job_models(engine, job_id), key=_in(spec.passes))),
        movie=paths.at(paths.review_clip(review)) if review else None,
        thumbnail=paths.at(paths.contact_sheet(review)) if review else None,
        review_pass=review,
        files=tuple(files),
        create_missing=settings.publish_create,
    )


def _in(passes: tuple[str, ...]) -> Any:
    """Sort key: the model of a pass in the order the job's passes were asked for."""
    return lambda model: (passes.index(model["pass_name"]) if model["pass_name"] in passes
                          else len(passes), model["pass_name"])  # fmt: skip


def _what_is_missing(job: dict[str, Any]) -> str:
    if job["status"] in ("queued", "running"):
        return "it has not finished; publish it once it completes"
    failed = job["failed_frames"]
    if failed:
        listed = ", ".join(f"{f['frame']} ({f['error']})" for f in failed[:5])
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        return f"{len(failed)} frames failed: {listed}{more}"
    return job.get("message") or "no frame finished"


def _review_pass(paths: ShotOutputPaths, passes: tuple[str, ...], wanted: str | None) -> str | None:
    """The pass whose clip and contact sheet the version shows: the one asked for, else the
    first that has both; None when no pass has them (previews or clips were off)."""
    order = ([wanted] if wanted else []) + [p for p in passes if p != wanted]
    for name in order:
        clip, sheet = paths.at(paths.review_clip(name)), paths.at(paths.contact_sheet(name))
        if _exists(clip) and _exists(sheet):
            return name
    return None


def _exists(where: Location) -> bool:
    fs, path = where.fs_and_path()
    return bool(fs.exists(path))
