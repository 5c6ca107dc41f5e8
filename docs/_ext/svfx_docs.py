"""The docs site's reference pages, generated from the code at build time.

Sphinx loads this as an extension (``docs/conf.py``). When the builder starts it writes, into
``docs/_generated/`` (ignored by git, never edited by hand):

- ``openapi.json``: the web API's OpenAPI document, from ``api.app.create_app`` (the same
  document ``/openapi.json`` serves), rendered by sphinxcontrib-openapi;
- ``passes.md``: every pass, its models, EXR layers and Zarr array, from the pass table
  (``schemas.passes.PASSES``);
- ``infra/<name>.md``: the deployment recipes' READMEs (``infra/*/README.md``), their links
  to each other pointed at the site's pages.

- ``cli.md``: every ``svfx`` command, its usage and options, from the command tree Typer
  builds from ``cli.main.app`` (what ``svfx --help`` prints). Typer carries its own copy of
  Click's classes, which sphinx-click does not accept, so the page is written here from the
  same help records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "docs" / "_generated"
# The folders of infra/ with a README of their own, each a page of the operations guide.
INFRA = ("local", "docker", "compose", "kubernetes", "slurm", "openjd", "prefect")


def _write(path: Path, text: str) -> None:
    """Write only when the text changed, so Sphinx does not rebuild pages needlessly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def openapi_document() -> dict[str, Any]:
    """The web API's OpenAPI document, as the running API serves it. The app is built over
    an in-memory SQLite engine: describing the routes reads no catalog."""
    from sqlalchemy import create_engine

    from api.app import create_app
    from schemas.settings import Settings

    return create_app(Settings(), engine=create_engine("sqlite://")).openapi()


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _code(values: Iterable[object]) -> str:
    return ", ".join(f"`{v}`" for v in values) or "-"


def _fused_as(p: Any) -> str:
    """How a stabilised version fuses the pass: the rule of its kind of values, the keypoint
    smoother for pose, else not at all."""
    if p.fusion:
        return f"`{p.fusion}`"
    return "keypoint smoother" if p.values == "keypoints" else "not fused"


def passes_markdown() -> str:
    """The pass table as Markdown: one overview table, then the EXR layers and Zarr arrays."""
    from schemas import passes

    lines = [
        "| pass | what it is | made by (family: checkpoint task) | inference | default |",
        "|---|---|---|---|---|",
    ]
    for p in passes.PASSES:
        models = ", ".join(f"{family}: `{task}`" for family, task in p.models.items())
        if not models:
            models = "no model: optical flow of the plate" if p.inference == "plate_flow" else ""
            models = models or f"from `{passes.made_from(p.name)}`'s model"
        needs = f"; needs one of {_code(p.needs)}" if p.needs and p.models else ""
        lines.append(
            f"| `{p.name}` | {_cell(p.description)}{needs} | {models} | `{p.inference}` "
            f"| {'yes' if p.default else 'no'} |"
        )
    lines += [
        "",
        "## EXR layers",
        "",
        "In the default multi-part layout each layer is a part of its own; in the single-part",
        "layout every layer's channels are in one part ([EXR layout]"
        "(../user/outputs.md#exr-layout-multi-part-or-single-part)).",
        "",
        "| pass | part / layer | channels | type | colour tag | holds |",
        "|---|---|---|---|---|---|",
    ]
    for p in passes.PASSES:
        for layer in p.exr:
            channels = _code(layer.channels)
            if layer.cryptomatte:
                channels = f"Cryptomatte ranks: `{layer.part}00..02` `.R .G .B .A`"
            tag = "scene-linear (the plate's space)" if layer.scene_linear else "`data`"
            lines.append(
                f"| `{p.name}` | `{layer.part}` | {channels} | {layer.dtype} | {tag} "
                f"| {_cell(layer.content)} |"
            )
    lines += [
        "",
        "## Zarr arrays",
        "",
        "One array per pass in the shot's store, first dimension the frame. `H`, `W`: the",
        "plate's height and width; `P`: people; `K`: keypoints.",
        "",
        "| pass | array | shape | type | dimensions | fill | holds |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in passes.PASSES:
        if p.zarr is None:
            continue
        z = p.zarr
        shape = "(T, " + ", ".join(str(d) for d in z.trailing) + ")"
        lines.append(
            f"| `{p.name}` | `{z.name}` | `{shape}` | {z.dtype} | {_code(z.dims)} "
            f"| `{z.fill}` | {_cell(z.content)} |"
        )
    lines += [
        "",
        "## Previews, QC, stabilisation and the Nuke script",
        "",
        "| pass | preview | temporal QC measures | stabilised as | Nuke script note | side file |",
        "|---|---|---|---|---|---|",
    ]
    for p in passes.PASSES:
        lines.append(
            f"| `{p.name}` | {p.preview or '-'} | {p.qc or '-'} | {_fused_as(p)} "
            f"| {_cell(p.nuke_note) or '-'} | {p.side_file or '-'} |"
        )
    return "\n".join(lines) + "\n"


def _text(value: str) -> str:
    """Help text as Markdown text: what Markdown would read as markup, escaped."""
    return re.sub(r"([\\`*_<>|\[\]])", r"\\\1", value.replace("\b\n", "").strip())


def _command_markdown(command: Any, path: list[str], lines: list[str]) -> None:
    """One command's section (usage, help, options), then its subcommands'."""
    from typer._click.core import Context

    ctx = Context(command, info_name=" ".join(path))
    lines += [f"{'#' * min(len(path), 4)} {' '.join(path)}", ""]
    if command.help:
        lines += [_text(command.help), ""]
    pieces = " ".join(command.collect_usage_pieces(ctx))
    lines += ["```text", f"{' '.join(path)} {pieces}".rstrip(), "```", ""]
    records = [p.get_help_record(ctx) for p in command.params if not getattr(p, "hidden", False)]
    records = [r for r in records if r]
    if records:
        lines += ["| option | meaning |", "|---|---|"]
        for flags, meaning in records:
            lines.append(f"| `{flags}` | {_text(meaning).replace(chr(10), ' ')} |")
        lines.append("")
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        if not getattr(sub, "hidden", False):
            _command_markdown(sub, [*path, name], lines)


def cli_markdown() -> str:
    """Every ``svfx`` command as Markdown: the root's help and options, then each command."""
    import typer.main

    from cli.main import app

    lines: list[str] = []
    _command_markdown(typer.main.get_command(app), ["svfx"], lines)
    return "\n".join(lines[2:]) + "\n"  # the page has its own title


def infra_markdown(name: str) -> str:
    """``infra/<name>/README.md`` with its links to the other recipes' READMEs pointed at
    their pages here (``slurm/README.md`` -> ``slurm.md``); the page includes it."""
    text = (ROOT / "infra" / name / "README.md").read_text()
    text = re.sub(r"\]\(\.\./(\w+)/README\.md", r"](\1.md", text)
    return re.sub(r"\]\((\w+)/README\.md", r"](\1.md", text)


def generate(_app: object = None) -> None:
    """Write every generated file (Sphinx's builder-inited event calls it)."""
    _write(GENERATED / "openapi.json", json.dumps(openapi_document(), indent=1) + "\n")
    _write(GENERATED / "passes.md", passes_markdown())
    _write(GENERATED / "cli.md", cli_markdown())
    _write(GENERATED / "infra" / "overview.md", infra_overview())
    for name in INFRA:
        _write(GENERATED / "infra" / f"{name}.md", infra_markdown(name))


def infra_overview() -> str:
    """``infra/README.md``, its table's links pointed at the recipes' pages."""
    text = (ROOT / "infra" / "README.md").read_text()
    return re.sub(r"\]\((\w+)/README\.md\)", r"](\1.md)", text)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
