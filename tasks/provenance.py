"""What every output's provenance names about this platform itself, and about the chunk
that made it (`ChunkContext`: worker, software, device, checkpoints, colour, tiling)."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from schemas import passes as pass_table
from schemas.summaries import ChunkContext

if TYPE_CHECKING:
    from tasks.chunk_job import ChunkJob
    from tasks.colour import ColourConversion


def platform_version() -> str:
    """This platform's version, as installed (recorded in every output's provenance)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sapiens-vfx")
    except PackageNotFoundError:
        return "0+unknown"


def chunk_context(
    job: ChunkJob, colour: ColourConversion, environment: dict[str, Any], tiling: dict[str, Any]
) -> ChunkContext:
    """What made a chunk's frames besides their inputs (recorded with every frame)."""
    return ChunkContext(
        worker=f"{socket.gethostname()}:{os.getpid()}",
        environment=environment,
        checkpoints={name: ref.as_dict() for name, ref in job.checkpoints.items()},
        colour={
            **colour.to_model_info.as_dict(),
            **{p.name: colour.albedo_info.description for p in pass_table.PASSES if p.scene_linear},
        },
        tiling=tiling,
    )


def environment(
    device: Any, dtype: Any, precision_reason: str = "", compiled: str = ""
) -> dict[str, Any]:
    """The software and device a chunk ran on, the precision of its arithmetic and why, and
    which models ran compiled (`tasks.model_cache.compile_note`)."""
    import platform

    import torch

    from tasks.precision import cpu_name

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {
        "platform_version": platform_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
        "device_name": name or platform.machine(),
        "precision": str(dtype).removeprefix("torch."),
        "precision_reason": precision_reason,
        "compiled": compiled,
    }
