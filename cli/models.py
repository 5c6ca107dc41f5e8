"""`svfx models`: the checkpoints under the checkpoint root (verified), and `svfx models
convert`, which turns a released Sapiens v1 `.pth` into a `.safetensors` file the loader takes
(the loader itself refuses every pickle). torch is never imported here: listing imports it
inside the command, converting needs only numpy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .console import (
    EXIT_FAILED,
    EXIT_OK,
    JsonOpt,
    console,
    err,
    fail,
    get_settings,
    print_json,
    refused,
    table,
)

models_app = typer.Typer(rich_markup_mode=None)


@models_app.callback(invoke_without_command=True)
def models(
    ctx: typer.Context,
    checkpoint_root: Annotated[
        str | None, typer.Option(help="default SVFX_CHECKPOINT_ROOT")
    ] = None,
    full: Annotated[
        bool, typer.Option(help="also check every tensor's shape and that every weight is finite")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The checkpoints under the checkpoint root (Sapiens2 and converted v1), with family,
    arch, task, size and sha256, verified.
    `svfx models convert SRC DST` converts a released Sapiens v1 .pth to safetensors."""
    if ctx.invoked_subcommand is not None:
        return
    from tasks.checkpoints.errors import CheckpointError
    from tasks.checkpoints.files import scan_checkpoints
    from tasks.checkpoints.verify import verify_checkpoint_once

    settings = get_settings()
    root = checkpoint_root or settings.checkpoint_root
    if not root:
        raise fail("no checkpoint root: pass --checkpoint-root or set SVFX_CHECKPOINT_ROOT")
    if not Path(root).is_dir():
        raise fail(f"checkpoint root {root} is not a directory")
    rows: list[dict[str, Any]] = []
    bad = 0
    for item in scan_checkpoints(root):
        if isinstance(item, CheckpointError):
            bad += 1
            rows.append({"path": item.path, "status": f"BAD: {item.reason}"})
            continue
        row = {**item.as_dict(), "size": f"{item.size_bytes / 2**20:.1f} MiB", "status": "ok"}
        if full:  # shapes against the model and every weight finite (remembered once passed)
            try:
                verify_checkpoint_once(item)
            except CheckpointError as exc:
                bad += 1
                row["status"] = f"BAD: {exc.reason}"
        if not item.trained:
            row["status"] += " (UNTRAINED)"
        rows.append(row)
    if as_json:
        print_json(rows)
    elif not rows:
        console.print(f"no *.safetensors under {root}")
    else:
        table(rows, ["path", "family", "arch", "task", "size", "sha256", "status"])
    raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


@models_app.command()
def convert(
    src: Annotated[
        str,
        typer.Argument(
            metavar="SRC", help="a released Sapiens v1 .pth (or _torchscript/_bfloat16 .pt2)"
        ),
    ],
    dst: Annotated[str, typer.Argument(metavar="DST", help="the .safetensors file to write")],
    force: Annotated[bool, typer.Option(help="replace DST if it exists")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Convert a released Sapiens v1 checkpoint to safetensors. Its pickle is read with an
    allow-list (tensor rebuilds, storages, the pose meta's numpy arrays and ConfigDict):
    nothing in the file is run. Family, size and task come from the tensors; DST records
    them with the source's name and sha256."""
    from storage.errors import StorageError
    from tasks.checkpoints.convert import convert_checkpoint
    from tasks.checkpoints.errors import CheckpointError

    try:
        result = convert_checkpoint(src, dst, force=force)
    except (CheckpointError, StorageError) as exc:
        raise refused(exc) from None
    except OSError as exc:  # e.g. DST's directory cannot be created
        raise fail(f"{dst}: {exc.strerror or exc}") from None
    if as_json:
        print_json(result.as_dict())
        raise typer.Exit(EXIT_OK)
    meta = result.metadata
    what = f"{meta['family']} {meta['size']} {meta['task']}"
    if "keypoints" in meta:
        what += f" ({meta['keypoints']} keypoints, {meta['keypoint_set']})"
    if "classes" in meta:
        what += f" ({meta['classes']} classes)"
    lines = [
        f"wrote {result.dst}",
        f"  model: {what}",
        f"  {result.tensors} tensors, {result.size_bytes / 2**20:.1f} MiB, "
        f"from {meta['source_format']} {meta['source_file']}",
        f"  sha256: {result.sha256}",
        f"  source sha256: {result.source_sha256}",
    ]
    for line in lines:  # plain text, never folded: paths and hashes are copied from here
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for note in result.notes:
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_OK)
