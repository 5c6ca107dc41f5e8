"""Small shots for the worker, flow and CLI tests: the demo plate at a small size, specs,
settings under a temporary SVFX_HOME, and tiny untrained checkpoints. Dask is imported only by
``local_client``: the CUDA checks use the rest on a GPU node, which the GPU kit gives no Dask."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.demo import DEMO_COLORSPACE, write_demo_plate
from schemas.passes import zarr_arrays
from schemas.settings import Settings

if TYPE_CHECKING:
    from distributed import Client

SMALL = (320, 180)  # w, h: two tiny-model tiles across, one down


def make_plate(directory: Path, frames: int = 4, size: tuple[int, int] = SMALL) -> str:
    return write_demo_plate(directory, frames, *size)


def spec_data(pattern: str, output_root: Path, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "plate": pattern,
        "show": "demo",
        "sequence": "sq010",
        "shot": "sh010",
        "colorspace": DEMO_COLORSPACE,
        "output_root": str(output_root),
        "chunk_frames": 4,
        "review_clips": False,
    }
    data.update(extra)
    return data


def small_chunk_job(
    root: Path,
    pattern: str,
    spec: Any,
    frames: tuple[int, ...],
    *,
    version: str = "v001",
    keypoints: int = 308,
    provenance: dict[str, str] | None = None,
) -> Any:
    """A chunk job of `frames` of a small demo plate (`SMALL`), its checkpoints chosen as the
    flow chooses them (untrained under `root/ckpt` without a root) and its Zarr store created
    as the shot runner creates it, under `root/out`."""
    from storage.location import Location
    from storage.zarr_store import create_shot_store
    from tasks.checkpoints.choice import resolve_checkpoints
    from tasks.checkpoints.files import seg_class_names
    from tasks.chunk_worker import ChunkJob
    from tasks.output_paths import ShotOutputPaths

    choice = resolve_checkpoints(
        spec.model_passes,
        spec.model_size,
        explicit=dict(spec.checkpoints),
        untrained_dir=root / "ckpt",
        family=spec.family,
    )
    paths = ShotOutputPaths.for_shot(str(root / "out"), "demo", "sq010", "sh010", version)
    w, h = SMALL
    classes = seg_class_names(choice.checkpoints)
    create_shot_store(
        paths.zarr, frames, h, w, zarr_arrays(spec.passes), spec.max_people, {}, 8,
        keypoints=keypoints, seg_classes=classes,
    )  # fmt: skip
    return ChunkJob(
        index=0,
        frames=frames,
        plate_uris=tuple(pattern.replace("####", f"{f:04d}") for f in frames),
        plate=Location(pattern),
        store_indices=tuple(range(len(frames))),
        spec=spec.model_dump(mode="json"),
        plate_colorspace="Linear Rec.709 (sRGB)",
        checkpoints=choice.checkpoints,
        paths=paths,
        frame_hw=(h, w),
        provenance=dict(provenance or {}),
    )


def settings_for(home: Path, **extra: Any) -> Settings:
    return Settings(home=home, allowed_roots=[str(home)], local_workers=2, **extra)


def local_client(workers: int = 2) -> Iterator[Client]:
    """A LocalCluster of worker processes (one thread each, no dashboard) and its client,
    for a module-scoped fixture: ``client = pytest.fixture(scope="module")(local_client)``."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as local,
        Client(local) as client,
    ):
        yield client
