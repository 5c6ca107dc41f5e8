"""What a run of one shot came to (``flows.shot_runner``): the frames done, skipped, adopted
and failed, the timings, and the status and one-line message the job is closed with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.summaries import ChunkSummary


@dataclass
class ShotResult:
    job_id: int
    status: str  # complete, partial, failed
    total: int
    done: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    adopted: list[int] = field(default_factory=list)  # found on disk, recorded, not recomputed
    failed: dict[int, str] = field(default_factory=dict)
    output_root: str = ""
    exr_pattern: str = ""
    zarr: str = ""
    extras: dict[str, str] = field(default_factory=dict)  # contact sheets, clips, pose json
    untrained: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    model_s: float = 0.0
    chunk_wall_s: float = 0.0
    peak_worker_rss_mb: float = 0.0
    # per worker (host:pid): [chunk wall s, model s], for the model's share of each one's time
    worker_time: dict[str, list[float]] = field(default_factory=dict)
    chunks: int = 0
    # "bf16: why" -> the workers (host:pid) whose models ran so (tasks.precision)
    precisions: dict[str, list[str]] = field(default_factory=dict)
    flagged: dict[str, list[int]] = field(default_factory=dict)  # temporal QC, per pass
    error: str = ""  # why the run stopped before the end (the catalog away, ...)
    # tiles the tiled passes ran and the person gate skipped, over the frames done now
    tiles: dict[str, int] = field(default_factory=dict)
    # what was noticed without failing a frame -> the frames it was noticed on
    notes: dict[str, list[int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def count_chunk(summary: ChunkSummary, result: ShotResult) -> None:
    result.chunks += summary.chunk_index >= 0
    result.model_s += summary.model_s
    result.chunk_wall_s += summary.wall_s
    result.peak_worker_rss_mb = max(result.peak_worker_rss_mb, summary.peak_rss_mb)
    precision = summary.environment.get("precision")
    if precision and summary.chunk_index >= 0:
        why = summary.environment.get("precision_reason") or ""
        ran = result.precisions.setdefault(f"{precision}: {why}" if why else precision, [])
        if summary.worker not in ran:
            ran.append(summary.worker)
    if summary.chunk_index >= 0:
        spent = result.worker_time.setdefault(summary.worker, [0.0, 0.0])
        spent[0] += summary.wall_s
        spent[1] += summary.model_s
    for frame in summary.frames:
        if frame.status == "done":
            result.done.append(frame.frame)
        else:
            result.failed[frame.frame] = frame.error or "failed"
        for key, count in frame.tiles.items():
            result.tiles[key] = result.tiles.get(key, 0) + count
        for note in frame.notes:
            result.notes.setdefault(note, []).append(frame.frame)


def final_status(result: ShotResult) -> str:
    if not result.done and not result.skipped and not result.adopted:
        return "failed"
    return "partial" if result.failed else "complete"


def outcome_message(result: ShotResult) -> str:
    parts = [f"{len(result.done)} done", f"{len(result.skipped)} already done"]
    if result.adopted:
        parts.append(f"{len(result.adopted)} found on disk")
    if result.failed:
        parts.append(f"{len(result.failed)} failed")
    text = ", ".join(parts) + f" of {result.total} frames"
    if result.failed:
        first = sorted(result.failed.items())[:5]
        text += "; failed: " + "; ".join(why for _f, why in first)
        if len(result.failed) > 5:
            text += f"; ... and {len(result.failed) - 5} more"
    return text
