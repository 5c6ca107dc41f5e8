"""Response bodies of the JSON API (pydantic), as the catalog's query functions return them."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """One page of a longer list: ``total`` rows match the filters."""

    items: list[T]
    total: int = Field(description="rows matching the filters, all pages together")
    limit: int
    offset: int


class Coverage(BaseModel):
    """A shot's newest plate and, per pass, how many of its frames have an output."""

    show: str
    sequence: str
    shot: str
    plate: str | None = Field(description="the newest plate's pattern")
    plate_frames: int = Field(description="frames of the newest plate")
    passes: dict[str, int] = Field(description="pass -> frames with an EXR (pose: JSON) output")
    job_id: int | None = Field(description="the newest job")
    job_status: str | None
    untrained: bool = Field(
        description="the newest job's outputs came from UNTRAINED (random-weight) models"
    )


class Output(BaseModel):
    id: int
    show: str
    sequence: str
    shot: str
    job_id: int
    pass_name: str
    frame: int
    kind: str
    uri: str
    part: str | None
    sha256: str
    size_bytes: int
    shape: list[int]
    dtype: str
    cache_key: str
    plate_sha256: str | None
    checkpoint_sha256: str | None
    created_at: str | None
    flicker: float | None = Field(
        description="temporal QC: the frame's flicker score for this pass (1 = usual for "
        "the shot; see /api/shots/{show}/{sequence}/{shot}/qc); null until scored"
    )


class FailedFrame(BaseModel):
    frame: int
    error: str | None


class FlaggedFrame(BaseModel):
    pass_name: str
    frame: int
    flicker: float = Field(description="its flicker score, above the threshold")


class FlickerScore(BaseModel):
    frame: int
    flicker: float
    flagged: bool = Field(description="above the threshold")
    preview_id: int | None = Field(description="the frame's preview (/files/outputs/{id})")


class QcReport(BaseModel):
    """Temporal QC of a shot: per dense pass and frame, how much the pass changed next to
    its neighbours relative to the plate, divided by what is usual for the shot (1)."""

    show: str
    sequence: str
    shot: str
    threshold: float = Field(description="frames scoring above this are flagged")
    passes: dict[str, list[FlickerScore]] = Field(description="the newest version's scores")
    versions: dict[str, dict[str, list[FlickerScore]]] = Field(
        description="pass -> version (its output folder's name, e.g. sapiens2_v002) -> scores: "
        "a stabilised version beside the per-frame one it was made from"
    )
    methods: dict[str, dict[str, str | None]] = Field(
        description="pass -> version -> the QC method its scores were made by (null: before "
        "methods were recorded, when QC compared each pass where the pixels are; 'mixed': its "
        "frames differ). Scores of two methods are not on one scale"
    )
    unlike: list[str] = Field(
        description="the passes whose versions were scored by different methods"
    )
    flagged: list[FlaggedFrame]


class JobRecord(BaseModel):
    id: int
    show: str
    sequence: str
    shot: str
    plate: str
    status: str
    submitter: str
    flow_run_id: str | None
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    frames_total: int
    frames_done: int
    frames_failed: int
    frames_skipped: int
    message: str | None
    spec: dict[str, Any]


class Job(JobRecord):
    failed_frames: list[FailedFrame] = Field(description="every failed frame and its reason")
    flagged_frames: list[FlaggedFrame] = Field(
        description="frames of its output folder that temporal QC flags (flicker above the "
        "threshold), by pass"
    )
    untrained: bool = Field(description="made with UNTRAINED (random-weight) models")


class Plate(BaseModel):
    pattern: str
    first_frame: int
    last_frame: int
    frames: int = Field(description="frames recorded for this plate")
    width: int
    height: int
    data_window: list[int]
    display_window: list[int]
    pixel_aspect: float
    colorspace: str
    colorspace_guessed: bool
    created_at: str | None
    updated_at: str | None


class ProvenanceRecord(BaseModel):
    """Platform, torch/CUDA versions, device, precision, checkpoints, colour and tiling."""

    digest: str
    data: dict[str, Any]


class Publish(BaseModel):
    """A job published to a production tracker, or pending with the reason."""

    id: int
    job_id: int
    show: str
    sequence: str
    shot: str
    tracker: str = Field(description="kitsu or shotgrid")
    status: str = Field(description="published, or pending (see reason; svfx publish --pending)")
    code: str = Field(description="the version's name in the tracker")
    entity_ids: dict[str, Any] = Field(
        description="the tracker's ids: project, shot, task, version, files..."
    )
    reason: str | None = Field(description="why it is pending")
    attempts: int
    created_at: str | None
    updated_at: str | None
    published_at: str | None


class ShotDetail(BaseModel):
    show: str
    sequence: str
    shot: str
    coverage: Coverage
    plates: list[Plate]
    jobs: list[Job] = Field(description="the newest jobs (see /jobs for all)")
    jobs_total: int
    provenance: list[ProvenanceRecord] = Field(description="of the newest job's outputs")
    untrained: bool
    publishes: list[Publish] = Field(
        default_factory=list, description="the newest publishes to trackers (see /publishes)"
    )


class Checkpoint(BaseModel):
    sha256: str
    arch: str
    task: str
    family: str = Field(description="sapiens2, or sapiens1 (Sapiens v1)")
    path: str
    trained: bool
    size_bytes: int | None
    created_at: str | None


class ProvenanceOutput(Output):
    checkpoints: list[str] = Field(description="sha256 of every checkpoint it depends on")
    provenance_digest: str
    deleted_at: str | None = Field(
        None, description="when `svfx delete` (or a prune) removed its file; null: on disk"
    )


class PlateFrame(BaseModel):
    frame: int
    uri: str | None
    sha256: str | None
    size_bytes: int | None
    fingerprint: str | None


class OutputProvenance(BaseModel):
    uri: str
    outputs: list[ProvenanceOutput]
    checkpoints: list[Checkpoint]
    provenance: list[ProvenanceRecord]
    jobs: list[JobRecord]
    plate_frames: list[PlateFrame]


class Submitted(BaseModel):
    run_id: str = Field(description="the run that will process the shot")
    shot: str = Field(description="show/sequence/shot")
    frames: str | None = Field(description="the frames asked for (None: the whole plate)")
    retry_of: int | None = Field(None, description="the job whose failed frames are retried")


class UsageItem(BaseModel):
    """What the live outputs of one show, shot, version folder (or pass of one) occupy."""

    show: str
    sequence: str | None = None
    shot: str | None = None
    output_root: str | None = Field(None, description="the version folder (by=version, pass)")
    folder: str | None = Field(
        None, description="the version folder relative to the shot's: sapiens2_v001, bg01/..."
    )
    version: str | None = Field(None, description="the version its newest job's spec names")
    job_id: int | None = Field(None, description="the newest job that wrote the folder")
    pass_name: str | None = Field(
        None, description="by=pass: the pass; null for files holding several (multi-part EXR)"
    )
    kind: str | None = Field(None, description="by=pass: exr, zarr, preview or pose_json")
    files: int = Field(description="files (a Zarr array: frames), each counted once")
    size_bytes: int = Field(description="their bytes (a Zarr array: its frames uncompressed)")


class Usage(BaseModel):
    """Bytes and files of the live outputs (those on disk, not deleted) in the scope."""

    by: str
    items: list[UsageItem]
    files: int = Field(description="all items together")
    size_bytes: int = Field(description="all items together")


class Problem(BaseModel):
    detail: str
