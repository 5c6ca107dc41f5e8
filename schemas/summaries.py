"""What a worker returns for a chunk of frames: small records, no pixels. The flow writes them
into the catalog (one writer, in batches). Plain dataclasses so Dask pickles them cheaply."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from schemas.passes import OutputKind

FrameStatus = Literal["done", "failed"]


@dataclass(frozen=True)
class OutputRecord:
    """One pass of one frame as stored: an EXR part, a Zarr region, a preview image..."""

    pass_name: str  # a pass of schemas.passes
    frame: int
    kind: OutputKind
    uri: str  # the file (EXR, preview) or the Zarr array (store/array)
    sha256: str  # of the file; of the region's raw bytes for Zarr
    size_bytes: int
    shape: tuple[int, ...]
    dtype: str
    part: str | None = None  # EXR part name, e.g. "N"
    cache_key: str = ""


@dataclass
class FrameSummary:
    frame: int
    plate_uri: str
    status: FrameStatus
    plate_sha256: str | None = None
    plate_size: int | None = None
    plate_fingerprint: str | None = None  # size+mtime locally, ETag on S3
    error: str | None = None
    outputs: list[OutputRecord] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage
    cache_key: str | None = None
    # a failed frame: outputs this attempt had overwritten and then removed (their catalog
    # rows no longer describe what is on disk)
    discarded: list[str] = field(default_factory=list)
    # a frame made from outputs (a stabilised version): the (URI, frame) of each output it
    # was made from, every pass's among them; the catalog links its outputs to those rows
    sources: list[tuple[str, int]] = field(default_factory=list)
    # what was noticed but did not fail the frame (motion: a side left at zero vectors, why)
    notes: list[str] = field(default_factory=list)
    # tiles the tiled passes ran and the person gate skipped, summed over the passes
    tiles: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FrameSummary:
        """The inverse of ``to_json`` (a frame record read back); KeyError/TypeError when a
        field is missing or of the wrong kind."""
        fields = dict(data)
        fields["sources"] = [(str(uri), int(frame)) for uri, frame in fields.get("sources", [])]
        fields["outputs"] = [
            OutputRecord(**{**out, "shape": tuple(out["shape"])}) for out in fields["outputs"]
        ]
        return cls(**fields)


@dataclass
class ChunkSummary:
    """A chunk's frames plus the environment that made them (provenance)."""

    chunk_index: int
    frames: list[FrameSummary]
    worker: str  # host:pid
    environment: dict[str, Any]  # platform/torch/CUDA versions, device, precision
    checkpoints: dict[str, dict[str, Any]]  # pass -> sha256, arch, task, path, trained
    colour: dict[str, str]  # the colour transform used
    tiling: dict[str, Any]
    wall_s: float = 0.0
    model_s: float = 0.0  # time inside the model (for the model's share of wall time)
    load_s: float = 0.0  # model loading on this call (0 when cached)
    peak_rss_mb: float = 0.0

    @property
    def context(self) -> ChunkContext:
        return ChunkContext(
            self.worker, self.environment, self.checkpoints, self.colour, self.tiling
        )


@dataclass(frozen=True)
class ChunkContext:
    """What made a chunk's frames, besides their inputs: recorded with every frame (in the
    catalog's provenance and in each frame record on disk)."""

    worker: str
    environment: dict[str, Any]
    checkpoints: dict[str, dict[str, Any]]
    colour: dict[str, str]
    tiling: dict[str, Any]

    def summary(self, frames: list[FrameSummary], chunk_index: int = -1) -> ChunkSummary:
        return ChunkSummary(
            chunk_index=chunk_index,
            frames=frames,
            worker=self.worker,
            environment=self.environment,
            checkpoints=self.checkpoints,
            colour=self.colour,
            tiling=self.tiling,
        )


@dataclass(frozen=True)
class PlateInfo:
    """What the flow learns about a plate while planning (one header read plus a listing)."""

    pattern: str
    frames: tuple[int, ...]  # present
    holes: tuple[int, ...]  # missing inside the range
    width: int  # data window size
    height: int
    data_window: tuple[int, int, int, int]  # EXR box: xmin, ymin, xmax, ymax (inclusive)
    display_window: tuple[int, int, int, int]
    pixel_aspect: float
    colorspace: str  # resolved OCIO name
    colorspace_guessed: bool
    fingerprints: dict[int, tuple[int, str]] = field(default_factory=dict)  # frame->(size, fp)
