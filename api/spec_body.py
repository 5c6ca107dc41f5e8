"""The body of ``POST /api/shots``: a ShotSpec as the API documents it and enforces it.

ShotSpec checks names, versions, model sizes, passes and frame ranges in validators, which its
JSON Schema does not show. ``SpecBody`` states those rules as JSON Schema (patterns, enums,
non-empty arrays), so that the published document says what is accepted, and the API checks a
body against the very same model before ShotSpec sees it (a frame range is parsed only once
it has the documented form). Strings are text (no control characters), as everywhere in the
API. Passes hold at least one a model makes (``contains``: motion alone runs no model).
Frame ranges are the common fileseq forms with frame numbers of at most six
digits: ``1001-1100``, ``1001-1100x2``, ``1001,1005,1010-1020``, negatives allowed (parsing
a larger stepped range costs fileseq seconds per request).

Two rules stay beyond JSON Schema and are said in descriptions only: a tiling gives both tile
sides or neither, with an overlap under half the shorter side; paths must lie under the
allowed roots (a deployment setting: refused with 403)."""

from __future__ import annotations

import getpass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from api.params import NAME_PATTERN, TEXT_PATTERN
from schemas.passes import DEFAULT_PASSES, PASS_NAMES, made_by_model
from schemas.spec import MODEL_SIZES, ModelPassName, PassName, ShotSpec, TilingSpec

_CONTROL = r"\x00-\x1f\x7f-\x9f\ufffd"
# What str.strip() removes (besides control characters): a plate must hold something else.
_SPACE = r"\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NON_BLANK_TEXT = rf"^[^{_CONTROL}]*[^{_CONTROL}{_SPACE}][^{_CONTROL}]*$"
VERSION_PATTERN = r"^v[0-9]{3,4}$"
_FRAME = r"-?[0-9]{1,6}"
_RANGE = rf"{_FRAME}(-{_FRAME}(x[1-9][0-9]{{0,5}})?)?"
FRAMES_PATTERN = rf"^{_RANGE}(,{_RANGE})*$"

Text = Annotated[str, Field(pattern=TEXT_PATTERN)]
# Documented here, enforced by ShotSpec's own validator (same rule, in readable words).
Name = Annotated[str, Field(json_schema_extra={"pattern": NAME_PATTERN})]
ModelSize = Literal[*MODEL_SIZES]  # type: ignore[valid-type]
SPEC = ShotSpec.model_fields
# A job runs some model: its passes hold at least one that a model makes (not motion alone).
MODEL_MADE = [name for name in PASS_NAMES if made_by_model(name)]


def _about(field: str, *more: str) -> str:
    """The spec field's description, with what the API adds to it."""
    return "; ".join([SPEC[field].description or field, *more])


class SpecBody(ShotSpec):
    """ShotSpec with its validators' rules stated as JSON Schema (see the module docstring)."""

    plate: Annotated[str, Field(pattern=NON_BLANK_TEXT)] = Field(
        description="frame pattern: plate.####.exr, plate.%04d.exr, s3://...; under the "
        "allowed roots"
    )
    show: Name
    sequence: Name
    shot: Name
    element: Name | None = Field(
        None, description="plate element (bg01, fg01) when a shot has several; outputs per element"
    )
    frames: Annotated[str, Field(pattern=FRAMES_PATTERN, max_length=4096)] | None = Field(
        None,
        description="frames to process: 1001-1100, 1001-1100x2, 1001,1005,1010-1020 (frame "
        "numbers of at most six digits); None: the whole plate",
    )
    colorspace: Text | None = Field(None, description=_about("colorspace"))
    passes: tuple[PassName, ...] = Field(
        DEFAULT_PASSES,
        min_length=1,
        json_schema_extra={"uniqueItems": True, "contains": {"enum": MODEL_MADE}},
        description=f"{SPEC['passes'].description}; at least one a model makes "
        f"({', '.join(MODEL_MADE)})",
    )
    model_size: ModelSize = Field(SPEC["model_size"].default, description=_about("model_size"))
    checkpoints: dict[ModelPassName, Text] = Field(
        default_factory=dict, description=_about("checkpoints", "under the allowed roots")
    )
    checkpoint_root: Text | None = Field(
        None, description=_about("checkpoint_root", "under the allowed roots")
    )
    tiling: TilingSpec = Field(
        TilingSpec(),
        description="both tile sides or neither; the overlap under half the shorter side",
    )
    output_root: Text | None = Field(
        None, description="under the allowed roots; None: the server's output root"
    )
    source_version: None = Field(  # type: ignore[assignment]
        None,
        description="null: a stabilised version is made from a finished per-frame one by "
        "`svfx stabilise` (or asked for with temporal=stabilize)",
    )
    fusion_method: None = Field(  # type: ignore[assignment]
        None, description="null: set with source_version by `svfx stabilise`"
    )
    version: Annotated[str, Field(pattern=VERSION_PATTERN)] = Field(
        SPEC["version"].default, description=_about("version")
    )
    submitter: Text = Field(
        default_factory=getpass.getuser,
        description="who submits (the API server's user when left out)",
    )

    @field_validator("passes", mode="before")
    @classmethod
    def _passes_array(cls, value: Any) -> Any:
        """The API takes passes as a JSON array only (``svfx submit`` also takes 'a,b')."""
        if not isinstance(value, list | tuple):
            raise ValueError("passes must be a JSON array of pass names")
        return value


def schema_problems(exc: ValidationError) -> str:
    """pydantic's errors as one readable 422 detail, one line per field."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "spec"
        lines.append(f"{where}: {str(error['msg']).removeprefix('Value error, ')}")
    return "invalid shot spec:\n  " + "\n  ".join(lines)
