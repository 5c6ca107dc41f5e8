"""Frame records: what a worker made of one frame (its outputs with sizes and checksums, the
plate checksum, the cache key and what made it), written beside the outputs after every
output of the frame is on disk.

The catalog is the truth, but a flow can die (or its database be away) between a worker
finishing a frame and the flow recording it. The record lets the next run prove the frame's
outputs are there and valid (`flows.resume` checks every size and sha256 against it and the
Zarr store's commit mark) and record them instead of computing them again.
"""

from __future__ import annotations

import json

from core.errors import SvfxError
from schemas.summaries import ChunkContext, FrameSummary
from storage.atomic import atomic_write_bytes
from storage.location import Location

RECORD_FORMAT = "svfx-frame-record/1"


class FrameRecordError(SvfxError, ValueError):
    """A frame record that cannot be read back (truncated, foreign, another format)."""


def write_frame_record(where: Location, summary: FrameSummary, context: ChunkContext) -> None:
    record = {
        "format": RECORD_FORMAT,
        "frame": summary.to_json(),
        "context": {
            "worker": context.worker,
            "environment": context.environment,
            "checkpoints": context.checkpoints,
            "colour": context.colour,
            "tiling": context.tiling,
        },
    }
    text = json.dumps(record, sort_keys=True, default=str)
    atomic_write_bytes(where, text.encode())


def read_frame_record(where: Location) -> tuple[FrameSummary, ChunkContext]:
    uri = where.uri
    fs, path = where.fs_and_path()
    try:
        record = json.loads(fs.cat_file(path))
        if record.get("format") != RECORD_FORMAT:
            raise FrameRecordError(f"{uri}: not a frame record ({record.get('format')!r})")
        context = record["context"]
        return FrameSummary.from_json(record["frame"]), ChunkContext(
            worker=str(context["worker"]),
            environment=dict(context["environment"]),
            checkpoints=dict(context["checkpoints"]),
            colour=dict(context["colour"]),
            tiling=dict(context["tiling"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FrameRecordError(f"{uri}: unreadable frame record: {exc}") from exc


def remove_file(where: Location) -> str | None:
    """Delete ``where`` if it exists; returns why it could not be deleted (None when gone)."""
    fs, path = where.fs_and_path()
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{where.uri}: {exc}"
    return None
