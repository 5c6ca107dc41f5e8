"""`svfx submit-edit`: one shot per clip of an editorial cut (OTIO, CMX3600 EDL, FCP 7 XML).
Reading the cut is `flows.edit_cuts`, planning it `flows.cut_planning`; here are the table, the
prompt and the exit code."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from flows.cut_planning import CutPlan, plan_cut
from flows.cut_templates import DEFAULT_PLATE_TEMPLATE
from flows.edit_cuts import CutOptions, load_cut
from flows.orchestrator import OrchestratorError, prefect_api
from flows.shot_patterns import parse_shot_pattern
from schemas.settings import Settings
from storage.sequences import PlateSequence, discover_sequence

from .console import (
    EXIT_FAILED,
    EXIT_OK,
    JsonOpt,
    exit_code,
    get_settings,
    interactive,
    print_json,
    refused,
    refusing,
    table,
)
from .cut_report import show_cut
from .spec_options import (
    DEFAULT_PASSES,
    SPEC_DEFAULTS,
    CheckpointRootOpt,
    ColourOpt,
    ExrLayoutOpt,
    FamilyOpt,
    ModelSizeOpt,
    NoPreviewsOpt,
    OutputOpt,
    PassesOpt,
    TilesOpt,
    VersionOpt,
)
from .submit import ClusterOpt, absolute_paths, require_cluster, run_here

CutOpt = Annotated[str, typer.Argument(help="the cut: .otio/.otioz, CMX3600 .edl, FCP 7 .xml")]
HandlesOpt = Annotated[
    int, typer.Option(min=0, help="frames added before and after each clip's source range")
]
ShotTemplateOpt = Annotated[
    str | None,
    typer.Option(
        help="the shot name from the clip's fields: {clip} (default), {marker} (e.g. an EDL "
        "* LOC: name), {source} (source file name), {reel}, {index} ({index:03d}), "
        "{track}, {show}, {seq}, and the named groups of --shot-pattern"
    ),
]
ShotPatternOpt = Annotated[
    str | None,
    typer.Option(
        help="FIELD:REGEX, FIELD one of clip, source, marker, reel: the shot ID is the "
        "regex's group (?P<shot>...) found in that field, e.g. "
        "'clip:(?P<shot>[A-Z]+\\d+_\\d+)' takes ZZ100_501 from 'ZZ100_501 (LAY3)'; "
        "a clip it does not match is refused"
    ),
]
PlatesRootOpt = Annotated[
    str | None, typer.Option(help="find every plate here by --plate-template, not the cut's")
]
PlateTemplateOpt = Annotated[
    str | None,
    typer.Option(help="plate under --plates-root; default {shot}/plate/{shot}_plate.####.exr"),
]
RateOpt = Annotated[float, typer.Option(min=1.0, help="frame rate of an EDL (it has none)")]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="only print the clips, their shots and problems")
]


# -- cuts in ---------------------------------------------------------------------------------
def submit_edit(
    cut: CutOpt,
    show: Annotated[str, typer.Option(help="show of every shot")],
    seq: Annotated[str, typer.Option(help="sequence of every shot")],
    handles: HandlesOpt = 0,
    shot_template: ShotTemplateOpt = None,
    shot_pattern: ShotPatternOpt = None,
    plates_root: PlatesRootOpt = None,
    plate_template: PlateTemplateOpt = None,
    rate: RateOpt = 24.0,
    passes: PassesOpt = DEFAULT_PASSES,
    family: FamilyOpt = SPEC_DEFAULTS["family"],
    model_size: ModelSizeOpt = SPEC_DEFAULTS["model_size"],
    output: OutputOpt = None,
    colorspace: ColourOpt = None,
    checkpoint_root: CheckpointRootOpt = None,
    version: VersionOpt = SPEC_DEFAULTS["version"],
    exr_layout: ExrLayoutOpt = SPEC_DEFAULTS["exr_layout"],
    tiles: TilesOpt = SPEC_DEFAULTS["tiles"],
    no_previews: NoPreviewsOpt = False,
    dask_address: ClusterOpt = None,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Submit one shot per clip of an editorial cut, one after another. Clips sharing a plate
    submit once; a clip that cannot run is named with the reason and the others go on. Exit 0
    all complete, 1 some partial, 2 a clip refused or a shot failed."""
    settings = get_settings()
    interactive()
    options = _cut_options(
        show, seq, handles, shot_template, shot_pattern, plates_root, plate_template, rate
    )
    shared = absolute_paths(
        {
            "passes": passes,
            "family": family,
            "model_size": model_size,
            "output_root": output,
            "colorspace": colorspace,
            "checkpoint_root": checkpoint_root,
            "version": version,
            "exr_layout": exr_layout,
            "tiles": tiles,
            "previews": not no_previews,
            "review_clips": not no_previews,
        }
    )
    plan = _cut_plan(cut, options, shared, settings)
    _show_plan(plan, as_json=as_json, dry_run=dry_run)
    if dry_run:
        raise typer.Exit(EXIT_FAILED if plan.refused else EXIT_OK)
    results = _run_cut(plan, settings, dask_address, as_json)
    _report(plan, results, as_json)
    raise typer.Exit(exit_code(bool(plan.refused), results))


def _cut_options(
    show: str,
    seq: str,
    handles: int,
    shot_template: str | None,
    shot_pattern: str | None,
    plates_root: str | None,
    plate_template: str | None,
    rate: float,
) -> CutOptions:
    """How to read the cut, from the command's options: the shot pattern parsed (a bad one is
    one line and exit 2), the plates root made absolute, the default plate template."""
    pattern = refusing(lambda: parse_shot_pattern(shot_pattern)) if shot_pattern else None
    return CutOptions(
        show=show,
        seq=seq,
        handles=handles,
        shot_template=shot_template,
        shot_pattern=pattern,
        plates_root=absolute_paths({"plate": plates_root})["plate"],
        plate_template=plate_template or DEFAULT_PLATE_TEMPLATE,
        rate=rate,
    )


def _show_plan(plan: CutPlan, *, as_json: bool, dry_run: bool) -> None:
    """The plan before anything runs: its table, or with --json --dry-run the plan as JSON
    (with --json alone, the JSON comes after the run with each shot's result)."""
    if as_json and dry_run:
        print_json(plan.as_dict())
    elif not as_json:
        show_cut(plan)


def _report(plan: CutPlan, results: list[dict[str, Any]], as_json: bool) -> None:
    """The shots' results after the run: the plan with each shot's result as JSON, or a table."""
    if as_json:
        shots = [{**s.as_dict(), "result": r} for s, r in zip(plan.shots, results, strict=True)]
        print_json({**plan.as_dict(), "shots": shots})
    else:
        _show_cut_results(plan, results)


def _cut_plan(cut: str, options: CutOptions, shared: dict[str, Any], settings: Settings) -> CutPlan:
    """Read the cut and plan its shots; an unreadable cut or a bad template or shared option
    is one line and exit 2."""

    def discover(pattern: str) -> PlateSequence:
        return discover_sequence(settings.location(pattern))

    clips = refusing(lambda: load_cut(cut, options))
    return refusing(
        lambda: plan_cut(
            clips,
            show=options.show,
            seq=options.seq,
            submit=shared,
            roots=settings.roots,
            output_root=settings.outputs,
            discover=discover,
            source=cut,
        )
    )


def _run_cut(
    plan: CutPlan, settings: Settings, dask_address: str | None, as_json: bool
) -> list[dict[str, Any]]:
    """Run each shot here, one after another, against one Prefect API (as `svfx scan` does
    without --queue); each has its progress bar and summary."""
    results: list[dict[str, Any]] = []
    if not plan.shots:
        return results
    require_cluster(dask_address, settings)
    try:
        with prefect_api(settings.home / "prefect", settings.prefect_start_timeout_s):
            for shot in plan.shots:
                spec = shot.spec.model_dump(mode="json")
                results.append(run_here(spec, dask_address, settings, as_json))
    except OrchestratorError as exc:
        raise refused(exc) from None
    return results


def _show_cut_results(plan: CutPlan, results: list[dict[str, Any]]) -> None:
    """One row per shot run and per clip refused."""
    rows = [
        {
            "shot": shot.shot,
            "clips": len(shot.clips),
            "frames": shot.frames,
            "status": result.get("status"),
            "job": result.get("job_id"),
            "note": result.get("error")
            or (f"{len(result['failed'])} frames failed" if result.get("failed") else ""),
        }
        for shot, result in zip(plan.shots, results, strict=True)
    ]
    rows += [
        {
            "shot": c.shot or c.label,
            "clips": 1,
            "frames": c.frames,
            "status": "refused",
            "note": f"{c.label}: {'; '.join(c.problems)}",
        }
        for c in plan.refused
    ]
    table(rows, ["shot", "clips", "frames", "status", "job", "note"], title="submit-edit")
