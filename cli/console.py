"""What every `svfx` command shares: the two consoles (stdout for results, stderr for progress
and errors), the exit codes and the one rule that turns shot results into one, errors as one
line, JSON and tables, and the settings every command starts from."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from core.errors import SvfxError
from schemas.settings import Settings, load_settings

console = Console()
err = Console(stderr=True)

# docs/reference/exit-codes.md: 0 complete / ok, 1 partial, 2 failed or invalid input
EXIT_OK, EXIT_PARTIAL, EXIT_FAILED = 0, 1, 2
EXIT_CODES = {"complete": EXIT_OK, "partial": EXIT_PARTIAL}
T = TypeVar("T")
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def get_settings() -> Settings:
    """The settings (SVFX_* and svfx.toml), the data dir created, and the environment that
    Prefect, Dask and the checkpoint caches read set from them."""
    try:
        settings = load_settings()
    except ValueError as exc:  # pydantic's ValidationError: a bad SVFX_* value or svfx.toml
        raise fail(f"configuration: {exc}") from None
    settings.home.mkdir(parents=True, exist_ok=True)
    # checkpoint checksums and verifications are remembered under the data dir
    os.environ.setdefault("SVFX_HOME", str(settings.home))
    # Prefect keeps its own state under our data dir unless told otherwise.
    os.environ.setdefault("PREFECT_HOME", str(settings.home / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    for name in ("distributed", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return settings


def interactive() -> None:
    """Commands that draw a progress bar and a summary report everything themselves: the
    flow's own log lines stay in Prefect (its API), only errors reach the terminal; Dask's
    INFO chatter (nannies starting and closing) would bury the progress bar. Set before
    Prefect and distributed are imported: both apply their logging configuration then."""
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "ERROR")
    os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "warning")


def fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    """Print ``error: message`` on stderr; returns the exit to raise."""
    # escape: "[...]" in a message is text, not markup; soft_wrap: never fold a path across
    # lines when stderr is a pipe or a farm log
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def refused(exc: SvfxError) -> typer.Exit:
    """An error the user can act on as one line on stderr; returns the exit it carries."""
    return fail(exc.message, exc.exit_code)


def refusing(step: Callable[[], T]) -> T:
    """Run a step; a refusal (`core.errors.SvfxError`) becomes one line on stderr and the
    exit code it carries."""
    try:
        return step()
    except SvfxError as exc:
        raise refused(exc) from None


def exit_code(refused: bool, results: list[dict[str, Any]]) -> int:
    """2 when anything was refused or a shot did not end complete or partial, else 1 when a
    shot is partial, else 0 (docs/reference/exit-codes.md, commands that run several shots)."""
    statuses = [r.get("status") for r in results]
    if refused or any(s not in EXIT_CODES for s in statuses):
        return EXIT_FAILED
    return EXIT_PARTIAL if "partial" in statuses else EXIT_OK


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def rows_out(rows: list[dict[str, Any]], columns: list[str], as_json: bool) -> None:
    """Rows as JSON (every key) or as a table of ``columns``, as the command was asked."""
    if as_json:
        print_json(rows)
    else:
        table(rows, columns)


# Columns a table never cuts nor folds, however narrow the terminal: names and dates are read
# whole (the other columns wrap, and fold a word longer than their width).
WHOLE_COLUMNS = frozenset({"show", "sequence", "shot", "created_at", "started_at", "ended_at"})


def table(rows: list[dict[str, Any]], columns: list[str], title: str = "") -> None:
    """Rows as a table on stdout, one column per key in ``columns``; times in UTC to the
    second (`short_time`; JSON keeps them whole)."""
    cells = [
        [short_time(row.get(c)) if c.endswith("_at") else cell(row.get(c)) for c in columns]
        for row in rows
    ]
    view = Table(title=title or None, show_lines=False)
    for index, column in enumerate(columns):
        whole = [line[index] for line in cells] if column in WHOLE_COLUMNS else []
        add_column(view, column, whole)
    for line in cells:
        view.add_row(*map(escape, line))
    console.print(view)


def add_column(view: Table, header: str, whole: list[str]) -> None:
    """Add a column to ``view``, as wide as the longest of ``whole`` when given (values read
    on one line: names, dates, paths; a fixed width, so the other columns give way); longer
    text wraps, a word longer than the column folds, nothing is cut with an ellipsis."""
    widest = max((len(v) for v in whole), default=0)
    width = max(widest, len(header)) if widest else None  # fixed: never narrowed
    view.add_column(header, overflow="fold", width=width)


def short_time(value: Any) -> str:
    """An ISO date and time as 'YYYY-MM-DD HH:MM:SSZ' (UTC); anything else as `cell`."""
    if not isinstance(value, str):
        return cell(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return str(value)
