"""Typed request parameters shared by the JSON routes, the pages and the file routes: names
match the spec's own rule, limits and numbers are bounded, checksums are 64 hex digits, ids
fit the catalog's 32-bit id columns and free text is text (no control characters, nothing
that was not valid UTF-8). Anything else is refused with 422 before a query runs, on every
database alike (PostgreSQL refuses NUL in text and ids past 2^31-1 with errors of its own)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Path, Query

from schemas.spec import NAME, PassName
from schemas.summaries import OutputKind

NAME_PATTERN = NAME.pattern  # the rule ShotSpec applies to show, sequence and shot names
SHA256_PATTERN = r"^[0-9a-fA-F]{64}$"
MAX_LIMIT = 1000
MAX_OFFSET = 2**31 - 1
MAX_ID = 2**31 - 1  # the catalog's id columns are 32-bit integers
# Text without C0/C1 control characters (NUL included) or U+FFFD, which stands for bytes that
# were not UTF-8 in the request. Written with escapes that Python's re, pydantic's Rust regex
# and JSON Schema's ECMA-262 all read alike.
TEXT_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\ufffd]*$"
JobStatus = Literal["queued", "running", "complete", "partial", "failed"]

_NAME_HELP = "letters, digits, _ . - (starting with a letter or digit; at most 64)"

ShowPath = Annotated[str, Path(pattern=NAME_PATTERN, description=f"show name: {_NAME_HELP}")]
SequencePath = Annotated[
    str, Path(pattern=NAME_PATTERN, description=f"sequence name: {_NAME_HELP}")
]
ShotPath = Annotated[str, Path(pattern=NAME_PATTERN, description=f"shot name: {_NAME_HELP}")]
JobIdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="the job's catalog id")]
OutputIdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="the output's catalog id")]
PassPath = Annotated[PassName, Path(description="pass name")]

ShowQuery = Annotated[
    str | None, Query(pattern=NAME_PATTERN, description=f"only this show: {_NAME_HELP}")
]
SequenceQuery = Annotated[
    str | None, Query(pattern=NAME_PATTERN, description=f"only this sequence: {_NAME_HELP}")
]
ShotQuery = Annotated[
    str | None, Query(pattern=NAME_PATTERN, description=f"only this shot: {_NAME_HELP}")
]
PassQuery = Annotated[PassName | None, Query(alias="pass", description="only this pass")]
KindQuery = Annotated[OutputKind | None, Query(description="only outputs of this kind")]
StatusQuery = Annotated[JobStatus | None, Query(description="only jobs with this status")]
PublishStatus = Literal["published", "pending"]
PublishStatusQuery = Annotated[
    PublishStatus | None, Query(description="only publishes with this status")
]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"page size (1-{MAX_LIMIT})")]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="rows to skip")]
Sha256Query = Annotated[
    str | None, Query(pattern=SHA256_PATTERN, description="a sha256 as 64 hex digits")
]
PathQuery = Annotated[
    str,
    Query(
        min_length=1,
        max_length=4096,
        pattern=TEXT_PATTERN,
        description="the output's path or URI (absolute, relative, ~, file:// or s3://); "
        "text without control characters",
    ),
]
FrameQuery = Annotated[
    int | None,
    Query(ge=-(2**31), le=2**31 - 1, description="narrow a Zarr array to this frame"),
]
ThresholdQuery = Annotated[
    float | None,
    Query(
        gt=0,
        le=1e6,
        description="flag frames whose flicker score is above this (default: the "
        "SVFX_QC_FLICKER_THRESHOLD setting)",
    ),
]
