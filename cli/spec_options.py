"""The options of the commands that submit shots, derived from the fields of ``ShotSpec``:
their help is the field's description and their default the field's default, so a spec
option is declared once (``schemas/spec.py``) and ``svfx submit``, ``svfx submit-edit`` and
``svfx scan`` say the same about it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from schemas import passes as pass_table
from schemas.spec import ShotSpec, TilingSpec, split_shot_path

from .console import fail


def spec_help(field: str, model: type[Any] = ShotSpec) -> str:
    description = model.model_fields[field].description
    assert description, f"{model.__name__}.{field} has no description to show as help"
    return description


def spec_default(field: str, model: type[Any] = ShotSpec) -> Any:
    return model.model_fields[field].get_default(call_default_factory=False)


def spec_option(field: str, *names: str, model: type[Any] = ShotSpec, **kwargs: Any) -> Any:
    """A typer option for ``model``'s ``field``, its help the field's description."""
    return typer.Option(*names, help=spec_help(field, model), **kwargs)


SPEC_DEFAULTS = {name: spec_default(name) for name in ShotSpec.model_fields}
TILING_DEFAULTS = {name: spec_default(name, TilingSpec) for name in TilingSpec.model_fields}
DEFAULT_PASSES = ",".join(pass_table.DEFAULT_PASSES)
PassesOpt = Annotated[str, typer.Option(help=f"comma-separated, of: {spec_help('passes')}")]
FamilyOpt = Annotated[str, typer.Option(help=f"sapiens2|sapiens1: {spec_help('family')}")]
FramesOpt = Annotated[str | None, spec_option("frames")]
ColourOpt = Annotated[str | None, spec_option("colorspace")]
ModelSizeOpt = Annotated[str, spec_option("model_size")]
CheckpointRootOpt = Annotated[str | None, spec_option("checkpoint_root")]
OutputOpt = Annotated[str | None, spec_option("output_root", "--output")]
VersionOpt = Annotated[str, spec_option("version")]
ChunkFramesOpt = Annotated[int, spec_option("chunk_frames")]
BatchSizeOpt = Annotated[int, spec_option("batch_size")]
PrecisionOpt = Annotated[str, spec_option("precision")]
NonfiniteOpt = Annotated[str, spec_option("nonfinite")]
ExrLayoutOpt = Annotated[str, spec_option("exr_layout")]
TilesOpt = Annotated[str, spec_option("tiles")]
TemporalOpt = Annotated[str, spec_option("temporal")]
RadiusOpt = Annotated[int, spec_option("temporal_radius", "--temporal-radius")]
OverlapOpt = Annotated[int, spec_option("overlap", model=TilingSpec)]
NoPreviewsOpt = Annotated[
    bool, typer.Option("--no-previews", help="no previews and no review clips")
]


def shot_names(shot: str) -> tuple[str, str, str]:
    """The --shot option as show, sequence and shot; one line and exit 2 otherwise."""
    names = split_shot_path(shot)
    if names is None:
        raise fail(f"--shot must be SHOW/SEQ/SHOT, got {shot!r}")
    return names
