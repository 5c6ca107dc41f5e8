"""A filled catalog for the API and page tests: three shots in two shows (one partial with
failed frames, one complete from UNTRAINED checkpoints, one running with previews that must
never be served), with real preview JPEGs and contact sheets on disk."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from api.app import create_app
from schemas.catalog import Catalog
from schemas.settings import Settings
from schemas.spec import ShotSpec
from schemas.summaries import ChunkSummary, OutputRecord
from tasks.output_paths import ShotOutputPaths
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


def preview_colour(frame: int) -> tuple[int, int, int]:
    return (40 + frame % 7 * 30, 120, 60)


def _written(output: OutputRecord) -> OutputRecord:
    """A preview written as a real JPEG, recorded with its bytes' sha256 and size."""
    if output.kind != "preview":
        return output
    data = jpeg_bytes(preview_colour(output.frame))
    path = Path(output.uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    return dataclasses.replace(output, sha256=digest, size_bytes=len(data))


def with_previews(chunk: ChunkSummary) -> ChunkSummary:
    """``chunk`` with every preview on disk and catalogued as the worker would: by the real
    sha256 of its bytes (the file routes serve nothing else)."""
    for frame in chunk.frames:
        frame.outputs = [_written(output) for output in frame.outputs]
    return chunk


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
    chunk = make_chunk(spec, range(1001, 1005), failed={1002: REASON_1002})
    catalog.record_chunk(jobs[A], with_previews(chunk))
    chunk = make_chunk(spec, range(1005, 1009), chunk_index=1, failed={1007: REASON_1007})
    catalog.record_chunk(jobs[A], with_previews(chunk))
    catalog.finish_job(jobs[A], "partial", "2 frames failed")

    spec = specs[B]
    untrained = {p: {**checkpoint(p, version=9), "trained": False} for p in CHECKPOINTS}
    jobs[B] = catalog.register_job(spec, make_plate(spec, range(1001, 1005)), "flow-run-b")
    chunk = make_chunk(spec, range(1001, 1005), checkpoints=untrained)
    catalog.record_chunk(jobs[B], with_previews(chunk))
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

    spec = specs[A]
    paths = ShotOutputPaths.for_shot(str(spec.output_root), *A.split("/"), spec.version)
    for pass_name in ("normal", "seg"):  # pose has no contact sheet on disk
        write_jpeg(paths.contact_sheet(pass_name), (200, 200, 40))
    return specs, jobs


# -- the app over a filled catalog (bind `filled` and the catalog fixtures in a module) --
TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FakeSubmitter:
    """Records submissions; ``fail``: raise ``error`` (default: Prefect unreachable) instead."""

    def __init__(self, fail: bool = False, error: Exception | None = None) -> None:
        self.calls: list[tuple[ShotSpec, str]] = []
        self.fail = fail or error is not None
        self.error = error or ConnectionError("Prefect API unreachable")

    def in_flight(self) -> dict[str, str]:
        return {}

    def submit(self, spec: ShotSpec, *, reason: str) -> str:
        if self.fail:
            raise self.error
        self.calls.append((spec, reason))
        return f"run-{len(self.calls)}"


@dataclass
class Filled:
    client: TestClient
    catalog: Catalog
    root: Path
    settings: Settings
    submitter: FakeSubmitter
    specs: dict[str, ShotSpec] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)

    def app(self, **kwargs: Any) -> TestClient:
        """Another app over the same catalog (other token or submitter)."""
        kwargs.setdefault("submitter", self.submitter)
        return TestClient(create_app(self.settings, engine=self.catalog.engine, **kwargs))


@pytest.fixture
def filled(catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Filled:
    return make_filled(catalog, tmp_path, monkeypatch)


def make_filled(catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Filled:
    """The app over ``catalog`` filled by `fill` (the `filled` fixture's work)."""
    monkeypatch.delenv("SVFX_API_TOKEN", raising=False)
    root = tmp_path / "studio"
    root.mkdir()
    specs, jobs = fill(catalog, root)
    settings = Settings(home=root / "home", allowed_roots=[str(root)])
    submitter = FakeSubmitter()
    app = create_app(settings, engine=catalog.engine, submitter=submitter, token=TOKEN)
    return Filled(TestClient(app), catalog, root, settings, submitter, specs, jobs)


def detail(response: Any) -> str:
    """The refusal's reason: every error body is a Problem, ``{"detail": "<text>"}``."""
    body = response.json()["detail"]
    assert isinstance(body, str), body
    return body


def good_spec(filled: Filled, **changes: Any) -> dict[str, Any]:
    spec = make_spec(filled.root, "sh0300", **changes)
    return spec.model_dump(mode="json")
