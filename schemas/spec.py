"""The validated specification of one shot job (``ShotSpec``) and the checks run before any
GPU time is spent: names, passes, sizes, tiling, and paths under the allowed roots."""

from __future__ import annotations

import getpass
import hashlib
import json
import os.path
import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, get_args

import fileseq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.errors import SvfxError
from schemas import passes as pass_table
from storage.layers import ExrLayout
from storage.uri import split_scheme

PassName = Literal[pass_table.PASS_NAMES]  # type: ignore[valid-type]
# The passes with a checkpoint of their own (not those made from another pass's output).
ModelPassName = Literal[tuple(p.name for p in pass_table.PASSES if p.models)]  # type: ignore[valid-type]
Family = Literal["sapiens2", "sapiens1"]
# "auto": the largest size with a checkpoint for every pass under the checkpoint root (or
# SVFX_MODEL_SIZE when it has them all); the tiny untrained models only without checkpoints.
# Sapiens2 sizes, then the Sapiens v1 sizes that are no Sapiens2 size.
MODEL_SIZES: tuple[str, ...] = (
    "auto", "tiny", "0.1b", "0.4b", "0.8b", "1b", "1b-4k", "5b", "0.3b", "0.6b", "2b",
)  # fmt: skip
Precision = Literal["auto", "fp32", "bf16", "fp16"]
# STABILISE is spelled as catalogs store it and the API answers it; "stabilise" is taken for it.
STABILISE = "stabilize"
Temporal = Literal["per_frame", "stabilize"]
Tiles = Literal["people", "all"]
TILES_KEY = "svfx/tiles"  # the EXR attribute that records a frame's tiles setting
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
VERSION_PATTERN = r"v\d{3,4}"  # an output version: v001 .. v9999

Name = Annotated[str, Field(description="show, sequence or shot name: letters, digits, _ . -")]


class SpecError(SvfxError, ValueError):
    """A spec that cannot run; the message lists every problem, one per line."""


class TilingSpec(BaseModel):
    """Tile size defaults to each model's native input (1024x768 for the released ones)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tile_height: int | None = Field(None, ge=64, le=8192)
    tile_width: int | None = Field(None, ge=64, le=8192)
    overlap: int = Field(128, ge=0, le=1024, description="tile overlap in pixels")

    @model_validator(mode="after")
    def _overlap_fits(self) -> TilingSpec:
        if (self.tile_height is None) != (self.tile_width is None):
            raise ValueError("give both tile_height and tile_width, or neither")
        small = self.tile_height and self.tile_width
        if small and self.overlap * 2 >= min(self.tile_height or 0, self.tile_width or 0):
            raise ValueError(
                f"overlap {self.overlap} px is too large for {self.tile_width}x"
                f"{self.tile_height} tiles (must be under half the shorter side)"
            )
        return self

    def tile_hw(self, native: tuple[int, int]) -> tuple[int, int]:
        """The tile (h, w): as configured, else the model's native input size."""
        if self.tile_height and self.tile_width:
            return self.tile_height, self.tile_width
        return native

    def overlap_for(self, tile_hw: tuple[int, int]) -> int:
        """The overlap, shrunk for small tiles so it stays under half the shorter side."""
        return min(self.overlap, min(tile_hw) // 4)


class ShotSpec(BaseModel):
    """Everything one run of ``process_shot`` needs; frozen and JSON-serialisable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plate: str = Field(description="frame pattern: plate.####.exr, plate.%04d.exr, s3://...")
    show: Name
    sequence: Name
    shot: Name
    element: str | None = Field(
        None, description="plate element (bg01, fg01) when a shot has several; outputs per element"
    )
    frames: str | None = Field(None, description="fileseq frame range, e.g. 1001-1100")
    colorspace: str | None = Field(
        None, description="plate colour space (OCIO name; default: guessed per plate)"
    )
    passes: tuple[PassName, ...] = Field(
        pass_table.DEFAULT_PASSES, description=pass_table.describe()
    )
    family: Family = Field(pass_table.DEFAULT_FAMILY, description=pass_table.family_help())
    model_size: str = Field(
        "auto",
        description="auto|tiny|0.1b|0.4b|0.8b|1b|1b-4k|5b (Sapiens v1: 0.3b|0.6b|1b|2b); auto: "
        "the largest size with a checkpoint for every pass under the checkpoint root "
        "(SVFX_MODEL_SIZE first), tiny untrained models only without checkpoints",
    )
    checkpoints: dict[ModelPassName, str] = Field(
        default_factory=dict, description="checkpoint file per pass"
    )
    checkpoint_root: str | None = Field(None, description="directory of *.safetensors")
    tiling: TilingSpec = TilingSpec()
    output_root: str | None = Field(None, description="output root (default SVFX_OUTPUT_ROOT)")
    version: str = Field("v001", description="output version, e.g. v002")
    chunk_frames: int = Field(8, ge=1, le=1000, description="frames per chunk (and Zarr shard)")
    batch_size: int = Field(
        4,
        ge=1,
        le=256,
        description="tiles per model batch (on a CPU, at most a 1024x768 input's pixels a call)",
    )
    precision: Precision = Field("auto", description="|".join(get_args(Precision)))
    max_people: int = Field(20, ge=1, le=200)
    nonfinite: Literal["error", "zero"] = Field(
        "error",
        description="plate pixels that are NaN/Inf: error (fail the frame) or zero (read as 0)",
    )
    exr_layout: ExrLayout = Field(
        "multipart",
        description="multipart: one EXR part per layer (Nuke reads each on its own); single: "
        "every layer in one part, for readers that take only a file's first part "
        "(cryptomatte-api and others outside Nuke)",
    )
    tiles: Tiles = Field(
        "people",
        description="people: a cheap look at the whole frame finds the people and the tiled "
        "passes run only on tiles near them (elsewhere each pass's background value); all: "
        "every tile of every frame",
    )
    temporal: Temporal = Field(
        "per_frame",
        description="per_frame: each frame on its own; stabilize: also a stabilised version "
        "beside it (each frame's passes fused with its neighbours' along the plate's motion), "
        "written as the next free version",
    )
    temporal_radius: int = Field(
        2,
        ge=2,
        le=8,
        description="frames fused on each side of a frame when stabilising (2: a 5-frame "
        "window; at least 2, so a chunk's context also tells a run of frames too short to fuse)",
    )
    source_version: str | None = Field(
        None,
        description="the per-frame version a stabilised version is made from (set by "
        "`svfx stabilise` and by --temporal stabilize; the models are not run again)",
    )
    fusion_method: str | None = Field(
        None,
        description="how a stabilised version's passes are fused (set with source_version, "
        "from the platform's current method): a version stabilised by another method is "
        "another version",
    )
    previews: bool = Field(True, description="previews per frame and pass")
    review_clips: bool = Field(True, description="review clips (mp4) per pass")
    submitter: str = Field(default_factory=getpass.getuser)

    @field_validator("show", "sequence", "shot", "element")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not NAME.match(value):
            raise ValueError(
                f"{value!r} is not a usable name (letters, digits, '_', '.', '-'; "
                "starting with a letter or digit; at most 64 characters)"
            )
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not re.fullmatch(VERSION_PATTERN, value):
            raise ValueError(f"version {value!r} must look like v001")
        return value

    @field_validator("source_version")
    @classmethod
    def _source_version(cls, value: str | None) -> str | None:
        return None if value is None else cls._version(value)

    @model_validator(mode="after")
    def _stabilised_from_another_version(self) -> ShotSpec:
        if self.fusion_method is not None and self.source_version is None:
            raise ValueError("fusion_method is only for a stabilised version")
        if self.source_version is not None:
            if self.temporal != STABILISE:
                raise ValueError("source_version is only for a stabilised version")
            if self.source_version == self.version:
                raise ValueError(
                    f"a stabilised version goes beside its source, not over it: version "
                    f"{self.version} is the source version"
                )
        return self

    @property
    def stabilised(self) -> bool:
        """This job makes a stabilised version from an existing per-frame one."""
        return self.source_version is not None

    @property
    def stabilises_after(self) -> bool:
        """A per-frame job that asks for its stabilised version once it is done."""
        return self.temporal == STABILISE and not self.stabilised

    @field_validator("temporal", mode="before")
    @classmethod
    def _temporal_spelling(cls, value: Any) -> Any:
        return STABILISE if value == "stabilise" else value

    @field_validator("passes", mode="before")
    @classmethod
    def _split_passes(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [p.strip() for p in value.split(",") if p.strip()]
        if isinstance(value, list | tuple):
            known = pass_table.PASS_NAMES
            unknown = [p for p in value if p not in known]
            if unknown:
                raise ValueError(
                    f"unknown pass {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
                )
            if not value:
                raise ValueError("no passes asked for")
            twice = sorted({p for p in value if list(value).count(p) > 1})
            if twice:
                raise ValueError(f"pass {', '.join(map(repr, twice))} is given twice")
            return pass_table.in_order(value)  # the table's order
        return value

    @field_validator("checkpoints", mode="before")
    @classmethod
    def _own_checkpoints(cls, value: Any) -> Any:
        for name in value if isinstance(value, dict) else ():
            if name not in pass_table.BY_NAME:
                continue  # the type says which passes there are
            if not pass_table.made_by_model(name):
                raise ValueError(
                    f"{name} has no checkpoint: no model makes it "
                    f"({pass_table.BY_NAME[name].description})"
                )
            made_from = pass_table.made_from(name)
            if made_from != name:
                raise ValueError(
                    f"{name} has no checkpoint of its own: it is made from the {made_from} "
                    f"model's output; give {made_from}=FILE instead"
                )
        return value

    @field_validator("model_size")
    @classmethod
    def _size(cls, value: str) -> str:
        size = value.strip().lower()
        if size not in MODEL_SIZES:
            raise ValueError(f"unknown model size {value!r}; known: {', '.join(MODEL_SIZES)}")
        return size

    @field_validator("frames")
    @classmethod
    def _frames(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            frame_set = fileseq.FrameSet(value.strip())
        except Exception as exc:  # fileseq raises its own ParseException
            raise ValueError(f"frame range {value!r} is not valid: {exc}") from exc
        if len(frame_set) == 0:
            raise ValueError(f"frame range {value!r} holds no frames")
        return str(frame_set)

    @model_validator(mode="after")
    def _plate_pattern(self) -> ShotSpec:
        if not self.plate.strip():
            raise ValueError("the plate pattern is empty")
        return self

    @model_validator(mode="after")
    def _some_model(self) -> ShotSpec:
        """A job runs at least one model: a pass made by none (motion) is computed beside
        the models, in the same pass over the plate, and a job of such passes alone would
        load no model and describe no checkpoint (its frames, their cache keys, the catalog's
        provenance all assume some)."""
        if not self.model_passes:
            alone = ", ".join(self.passes)
            raise ValueError(
                f"passes {alone} run no model: they are made beside a model pass; ask for "
                f"one too (e.g. --passes {alone},normal)"
            )
        return self

    # -- derived -----------------------------------------------------------------------
    @property
    def model_passes(self) -> tuple[str, ...]:
        """Passes the models must compute: those asked for and what they need (pose needs
        person boxes and relative depth is normalised over the person, both from seg or
        matte), which run but are not written (`schemas.passes.model_passes`)."""
        return pass_table.model_passes(self.passes)

    @property
    def output_family(self) -> str:
        """The family its output folder is named after (`schemas.passes.job_family`)."""
        return pass_table.job_family(self.passes, self.family)

    @property
    def shot_path(self) -> str:
        return f"{self.show}/{self.sequence}/{self.shot}"

    def settings_digest(self) -> str:
        """What besides plate and checkpoints changes the outputs' bytes (part of the cache
        key)."""
        relevant = {
            "colorspace": self.colorspace,
            "tiling": self.tiling.model_dump(),
            "precision": self.precision,
            "max_people": self.max_people,
            "passes": list(self.passes),
        }
        if self.nonfinite != "error":  # only then: existing cache keys stay valid
            relevant["nonfinite"] = self.nonfinite
        if self.exr_layout != "multipart":  # the same bytes otherwise: keys stay valid
            relevant["exr_layout"] = self.exr_layout
        if self.tiles != "all":  # every tile ran before the gate: those keys stay valid
            relevant["tiles"] = self.tiles
        if self.stabilised:  # a stabilised version's bytes depend on how it was fused
            relevant["temporal"] = {
                "source_version": self.source_version,
                "radius": self.temporal_radius,
            }
            if self.fusion_method is not None:  # only then: earlier versions' keys stay valid
                relevant["temporal"]["method"] = self.fusion_method
        text = json.dumps(relevant, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def split_shot_path(text: str) -> tuple[str, str, str] | None:
    """SHOW/SEQ/SHOT as its three names (slashes around it ignored); None for another form."""
    parts = text.strip("/").split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def cache_key(plate_sha256: str, checkpoint_sha256s: list[str], settings_digest: str) -> str:
    """Plate frame checksum + checkpoint hashes + settings: equal keys make equal outputs."""
    text = "|".join([plate_sha256, *sorted(checkpoint_sha256s), settings_digest])
    return hashlib.sha256(text.encode()).hexdigest()


def is_under(path: str, root: str) -> bool:
    """Whether ``path`` lies under ``root`` (lexically, after resolving '..')."""
    path_scheme, path_rest = _split_scheme(path)
    root_scheme, root_rest = _split_scheme(root)
    if path_scheme != root_scheme:
        return False
    p, r = _normalise(path_rest), _normalise(root_rest)
    return p == r or p.startswith(r.rstrip("/") + "/")


def _split_scheme(uri: str) -> tuple[str, str]:
    scheme, rest = split_scheme(uri)
    if scheme is None:
        return "", uri
    return (scheme.lower() if scheme.lower() != "file" else ""), rest


def _normalise(path: str) -> str:
    import os.path

    absolute = path if path.startswith("/") else os.path.abspath(path)
    parts: list[str] = []
    for part in PurePosixPath(absolute).parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    return "/" + "/".join(parts)


def resolved(path: str) -> str:
    """A local path with every symlink resolved (as far as it exists); URLs unchanged."""
    scheme, rest = _split_scheme(path)
    if scheme:
        return path
    return os.path.realpath(os.path.expanduser(rest))


def is_really_under(path: str, roots: list[str]) -> bool:
    """Whether ``path`` lies under one of ``roots`` once symlinks in both are resolved: a link
    inside a root that points elsewhere does not count as inside."""
    real = resolved(path)
    return any(is_under(real, resolved(root)) for root in roots)


def check_paths(spec: ShotSpec, allowed_roots: list[str], output_root: str) -> list[str]:
    """Problems with where the spec reads and writes (empty when all is allowed); symlinks
    are resolved, so a link under a root to a place outside it is refused."""
    problems = []
    places = [("plate", spec.plate), ("output root", spec.output_root or output_root)]
    if spec.checkpoint_root:
        places.append(("checkpoint root", spec.checkpoint_root))
    places += [(f"{name} checkpoint", path) for name, path in spec.checkpoints.items()]
    for label, path in places:
        if not is_really_under(path, allowed_roots):
            real = resolved(path)
            where = "" if real == _normalise(path) else f" (really {real})"
            problems.append(
                f"{label} {path}{where} lies outside the allowed roots "
                f"({', '.join(allowed_roots)}); set SVFX_ALLOWED_ROOTS to allow it"
            )
    return problems


def parse_spec(data: dict[str, Any]) -> ShotSpec:
    """Validate ``data`` into a ShotSpec, turning pydantic's errors into one readable SpecError."""
    try:
        return ShotSpec.model_validate(data)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "spec"
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"{where}: {message}")
        if len(lines) == 1:  # one problem: one line
            raise SpecError(f"invalid shot spec: {lines[0]}") from None
        raise SpecError("invalid shot spec:\n  " + "\n  ".join(lines)) from None
