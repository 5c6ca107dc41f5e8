"""`svfx stabilise` (also taken as `svfx stabilize`): a stabilised version of a per-frame
version already made, without running the models again (`flows.stabilise` picks the version
and refuses what cannot be stabilised; the run itself is `svfx submit`'s)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from core.errors import SvfxError
from flows.stabilise import NothingToStabilise, stabilised_spec
from schemas.catalog import open_catalog

from .console import JsonOpt, err, get_settings, interactive, refused, refusing
from .submit import ClusterOpt, run_submit


def stabilise(
    shot: Annotated[str, typer.Argument(help="SHOW/SEQ/SHOT")],
    version: Annotated[str, typer.Option(help="the per-frame version to stabilise, e.g. v001")],
    passes: Annotated[
        str | None,
        typer.Option(help="comma-separated passes to stabilise (default: every pass it has)"),
    ] = None,
    temporal_radius: Annotated[
        int | None, typer.Option(help="frames fused on each side (default: the source's, 2)")
    ] = None,
    element: Annotated[str | None, typer.Option(help="the plate element, if any")] = None,
    dask_address: ClusterOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a stabilised version beside a per-frame one: each frame's passes fused with its
    neighbours' along the plate's motion, as the next free version (never over one)."""
    settings = get_settings()
    interactive()
    catalog = refusing(lambda: open_catalog(settings.catalog, retry_s=settings.catalog_retry_s))
    names = [p.strip() for p in passes.split(",") if p.strip()] if passes else None
    try:
        spec = stabilised_spec(
            catalog, settings, shot, version, element=element, passes=names, radius=temporal_radius
        )
    except NothingToStabilise as exc:  # not an error: the per-frame version stands
        err.print(f"[yellow]{escape(exc.message)}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except SvfxError as exc:
        raise refused(exc) from None
    if not as_json:
        err.print(f"stabilising {escape(shot)} {version} into {spec.version}", highlight=False)
    data = spec.model_dump(mode="json")
    raise typer.Exit(run_submit(data, settings, dask_address=dask_address, as_json=as_json))
