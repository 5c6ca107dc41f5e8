"""A filled catalog for the API and page tests: three shots in two shows (one partial with
failed frames, one complete from UNTRAINED checkpoints, one running with previews that must
never be served), with real preview JPEGs and contact sheets on disk."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from schemas.catalog import Catalog, queries
from schemas.spec import ShotSpec
from schemas.summaries import OutputRecord
from tasks.layout import ShotLayout
from tests.catalog_fixtures import CHECKPOINTS, checkpoint, make_chunk, make_plate, make_spec, sha

A = "demo/sq010/sh0010"  # partial: frames 1002 and 1007 failed
B = "demo/sq010/sh0020"  # complete, UNTRAINED checkpoints
C = "other/sq020/sh0100"  # running, one preview outside the allowed roots
REASON_1002 = "plate.1002.exr: frame 1002: not an OpenEXR file <script>alert(1)</script>"
REASON_1007 = "plate.1007.exr: frame 1007: NaN in channel R"


def jpeg_bytes(colour: tuple[int, int, int], size: tuple[int, int] = (48, 27)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="JPEG")
    return buffer.getvalue()


def write_jpeg(path: str | Path, colour: tuple[int, int, int] = (90, 140, 200)) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(jpeg_bytes(colour))


def fill(catalog: Catalog, root: Path) -> tuple[dict[str, ShotSpec], dict[str, int]]:
    """Three shots in two shows; previews and contact sheets written as real JPEGs."""
    specs = {
        A: make_spec(root, "sh0010"),
        B: make_spec(root, "sh0020"),
        C: make_spec(root, "sh0100", show="other", sequence="sq020", passes=("normal",)),
    }
    jobs: dict[str, int] = {}
    spec = specs[A]
    jobs[A] = catalog.register_job(spec, make_plate(spec, range(1001, 1009)), "flow-run-a")
    catalog.record_chunk(jobs[A], make_chunk(spec, range(1001, 1005), failed={1002: REASON_1002}))
    chunk = make_chunk(spec, range(1005, 1009), chunk_index=1, failed={1007: REASON_1007})
    catalog.record_chunk(jobs[A], chunk)
    catalog.finish_job(jobs[A], "partial", "2 frames failed")

    spec = specs[B]
    untrained = {p: {**checkpoint(p, version=9), "trained": False} for p in CHECKPOINTS}
    jobs[B] = catalog.register_job(spec, make_plate(spec, range(1001, 1005)), "flow-run-b")
    catalog.record_chunk(jobs[B], make_chunk(spec, range(1001, 1005), checkpoints=untrained))
    catalog.finish_job(jobs[B], "complete")

    spec = specs[C]
    jobs[C] = catalog.register_job(spec, make_plate(spec, range(1, 3)), None)
    chunk = make_chunk(spec, [1])
    outside = root.parent / f"{root.name}_outside.jpg"  # a real JPEG beyond the allowed roots
    write_jpeg(outside)
    records = [
        OutputRecord("normal", 1, "preview", str(outside), sha("outside"), 10, (27, 48, 3), "u1"),
        OutputRecord("normal", 2, "preview", "/etc/passwd", sha("passwd"), 10, (1,), "u1"),
    ]
    chunk.frames[0].outputs = records
    catalog.record_chunk(jobs[C], chunk)

    for show_seq_shot in (A, B):
        show, sequence, shot = show_seq_shot.split("/")
        for out in queries.shot_outputs(catalog.engine, show, sequence, shot, kind="preview"):
            write_jpeg(out["uri"], (40 + out["frame"] % 7 * 30, 120, 60))
    spec = specs[A]
    layout = ShotLayout.for_shot(str(spec.output_root), *A.split("/"), spec.version)
    for pass_name in ("normal", "seg"):  # pose has no contact sheet on disk
        write_jpeg(layout.contact_sheet(pass_name), (200, 200, 40))
    return specs, jobs
