"""What `svfx submit-edit` prints about a cut before running it (and all `--dry-run`
prints): the clips and the shots they make, as tables that read at 80 columns, and each
problem on a line of its own under them, naming its clip.

A problem is a sentence with a path in it; squeezed into a table cell it becomes a column of
single words. So the tables hold only short values (shot names and frame ranges never wrap;
a long clip name or plate path folds), and every problem is printed whole, ``clip N 'name':
reason``, one line that a terminal may wrap but nothing folds, so it can be grepped by clip.
"""

from __future__ import annotations

from rich import box
from rich.markup import escape
from rich.table import Table

from flows.cut_planning import CutPlan

from . import console as cli_console


def show_cut(plan: CutPlan) -> None:
    """The clips table, the shots it would submit, then each refused clip's problems."""
    out = cli_console.console
    out.print(clips_table(plan))
    if plan.shots:
        out.print(shots_table(plan))
    refused = plan.refused
    if refused:
        out.print(
            f"[bold red]refused:[/] {len(refused)} of {len(plan.clips)} clips", highlight=False
        )
    for line in problem_lines(plan):
        out.print(escape(line), highlight=False, soft_wrap=True)


def clips_table(plan: CutPlan) -> Table:
    view = Table(title=escape(plan.source) or None, box=box.SIMPLE_HEAD, pad_edge=False)
    view.add_column("#", justify="right", no_wrap=True)
    view.add_column("clip", overflow="fold")
    view.add_column("record", no_wrap=True)
    view.add_column("shot", no_wrap=True)
    view.add_column("frames", no_wrap=True)
    for clip in plan.clips:  # a refused clip's row is red; its problems are listed below
        view.add_row(
            str(clip.index),
            escape(clip.name) or "(no name)",
            clip.record,
            escape(clip.shot),
            clip.frames,
            style="red" if clip.problems else None,
        )
    return view


def shots_table(plan: CutPlan) -> Table:
    view = Table(title=f"shots to submit: {len(plan.shots)}", box=box.SIMPLE_HEAD, pad_edge=False)
    view.add_column("shot", no_wrap=True)
    view.add_column("frames", no_wrap=True)
    view.add_column("clips", justify="right", no_wrap=True)
    view.add_column("plate", overflow="fold")
    for shot in plan.shots:
        view.add_row(escape(shot.shot), shot.frames, str(len(shot.clips)), escape(shot.plate))
    return view


def problem_lines(plan: CutPlan) -> list[str]:
    """``clip N 'name': problem``, one per problem, in cut order."""
    return [f"{clip.label}: {problem}" for clip in plan.refused for problem in clip.problems]
