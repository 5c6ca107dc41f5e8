"""Shot-level files, made once every chunk is in: the pose JSON (from per-frame fragments),
the shot's Nuke script, a contact sheet and a review clip per pass (from the per-frame
previews). Runs as one Dask
task on any worker: it reads small previews and JSON fragments, never full frames."""

from __future__ import annotations

from dataclasses import dataclass, field

from sapiens.keypoints import KEYPOINT_NAMES, keypoint_names_for, skeleton_for
from schemas.passes import first_of_kind
from storage.location import Location
from storage.pose_json import PoseHeader, assemble_pose_json
from storage.previews import read_preview, write_contact_sheet
from storage.review_clip import NO_FFMPEG, ffmpeg_exe, write_review_clip
from tasks.output_paths import ShotOutputPaths
from tasks.shot_nuke_script import write_shot_nuke_script


@dataclass(frozen=True)
class FinalizeJob:
    paths: ShotOutputPaths
    frames: tuple[int, ...]  # frames with outputs (done now or before)
    passes: tuple[str, ...]
    image_size: tuple[int, int]  # (width, height) of the data window
    data_window: tuple[int, int, int, int]
    pixel_aspect: float = 1.0
    provenance: dict[str, str] = field(default_factory=dict)
    previews: bool = True
    review_clips: bool = True
    fps: float = 24.0
    only_missing: bool = False  # nothing new was made: keep the files that exist
    albedo_colorspace: str | None = None  # the scene-linear space albedo was written in
    keypoints: int = len(KEYPOINT_NAMES)  # the pose model's (Sapiens v1 COCO: 17 or 133)


def finalize_shot(job: FinalizeJob) -> dict[str, str]:
    """Write the shot-level files; returns what was written, by name."""
    paths = job.paths
    written: dict[str, str] = {}
    posed = first_of_kind(job.passes, "keypoints") is not None
    if posed and job.only_missing and _exists(paths.at(paths.pose_json)):
        written["pose_json"] = job.paths.pose_json
    elif posed:
        result = assemble_pose_json(
            paths.at(paths.pose_json),
            paths.at(paths.pose_fragments),
            job.frames,
            PoseHeader(
                keypoint_names_for(job.keypoints),
                skeleton_for(job.keypoints)[0],
                job.image_size,
                job.data_window,
                job.provenance,
            ),
        )
        written["pose_json"] = result.uri
    written.update(_nuke_script(job))
    if not job.previews:
        return written
    clips = job.review_clips and ffmpeg_exe() is not None
    if job.review_clips and not clips:  # one line for the shot, not one a pass
        written["review_clips_skipped"] = NO_FFMPEG
    for name in job.passes:
        previews = [(f, paths.at(paths.preview(name, f))) for f in job.frames]
        previews = [(f, where) for f, where in previews if _exists(where)]
        if not previews:
            continue
        sheet = write_contact_sheet(paths.at(paths.contact_sheet(name)), previews)
        written[f"contact_sheet_{name}"] = sheet.uri
        if clips:
            clip = write_review_clip(
                paths.at(paths.review_clip(name)),
                ((f, read_preview(where)) for f, where in previews),
                fps=job.fps,
                label=f"{job.paths.name} {name}",
            )
            written[f"review_clip_{name}"] = clip.uri
    return written


def _nuke_script(job: FinalizeJob) -> dict[str, str]:
    """The shot's .nk over its frames with outputs (a failed frame between them reads as a
    checkerboard). A script that cannot be written is reported by name and does not stop
    the other files."""
    if job.only_missing and _exists(job.paths.at(job.paths.nuke_script)):
        return {"nuke_script": job.paths.nuke_script}
    try:
        script = write_shot_nuke_script(
            job.paths,
            job.frames,
            job.passes,
            image_size=job.image_size,
            data_window=job.data_window,
            pixel_aspect=job.pixel_aspect,
            fps=job.fps,
            albedo_colorspace=job.albedo_colorspace,
        )
    except Exception as exc:
        return {"nuke_script_error": f"{job.paths.nuke_script}: {type(exc).__name__}: {exc}"}
    return {"nuke_script": script} if script is not None else {}


def _exists(where: Location) -> bool:
    fs, path = where.fs_and_path()
    return bool(fs.exists(path))
