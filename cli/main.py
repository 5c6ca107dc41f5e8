"""The `svfx` command: the root app with every command and the `catalog` group, and `main`,
the console script."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from core.errors import SvfxError

from . import cuts, delete, operations, prune, publish, scan, stabilise, submit
from .catalog import catalog_app
from .console import err
from .farm import farm_app
from .models import models_app

# Help texts are plain text: "SHOW[/SEQ[/SHOT]]" must not be read as rich markup.
app = typer.Typer(
    help="Sapiens2 passes for VFX shots: submit, watch, query.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_show_locals=False,
)
app.add_typer(catalog_app, name="catalog")
# in the order `svfx --help` lists them
app.command()(submit.submit)
app.command()(submit.status)
app.add_typer(models_app, name="models")
app.command()(operations.cluster)
app.command()(operations.worker)
app.command()(scan.scan)
app.command("submit-edit")(cuts.submit_edit)
app.command()(stabilise.stabilise)
app.command("stabilize", hidden=True)(stabilise.stabilise)  # the spelling it had first
app.command()(publish.publish)
app.command()(delete.delete)
app.command()(prune.prune)
app.add_typer(farm_app, name="farm")
app.command()(operations.serve)
app.command()(operations.api)
app.command()(operations.demo)


def main() -> None:
    """The `svfx` command: the app, with any refusal that escapes a command (a catalog that
    breaks in the middle of a query, ...) shown as one line and its exit code, not a
    traceback."""
    try:
        app()
    except SvfxError as exc:
        err.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
