"""A small completed shot to publish (tiny UNTRAINED models, 4 frames, one pass with its
review clip and contact sheet), run in-process, and a mockgun ShotGrid with the schema of
``tests/data/shotgrid``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster

from schemas.catalog import open_catalog
from schemas.catalog.writer import Catalog
from schemas.settings import Settings
from tests.shot_helpers import make_plate, settings_for, spec_data

SCHEMA = Path(__file__).resolve().parent / "data" / "shotgrid"


def in_process_client() -> Any:
    """For a module-scoped fixture: one in-process worker (the tiny models are quick)."""
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
        as local,
        Client(local) as client,
    ):  # fmt: skip
        yield client


def run_shot(home: Path, client: Client, version: str = "v001", **extra: Any) -> tuple[int, str]:
    """A completed 4-frame shot of the normal pass (clip and contact sheet made); returns
    its job id and output folder."""
    from flows.planning import plan_shot
    from flows.shot_runner import run_planned_shot
    from schemas.spec import parse_spec

    settings = settings_for(home)
    plates = home / "plates"
    demo = str(plates / "astronaut.####.exr")
    pattern = demo if plates.is_dir() else make_plate(plates, frames=4)
    data = spec_data(pattern, home / "out", passes="normal", review_clips=True, version=version)
    data.update(extra)
    catalog = open_catalog(settings.catalog)
    result = run_planned_shot(plan_shot(parse_spec(data), settings), catalog, client)
    assert result.status == "complete", result.failed
    return result.job_id, result.output_root


def catalog_of(settings: Settings) -> Catalog:
    return open_catalog(settings.catalog)


def mockgun(project: str | None = "demo") -> Any:
    """A fresh mockgun with our schema, a project named ``project``, and uploads recorded
    (mockgun's own ``upload`` is not implemented): ``sg.uploads`` lists (type, id, field,
    path, bytes)."""
    from shotgun_api3.lib import mockgun as mg

    class Recording(mg.Shotgun):
        uploads: list[tuple[str, int, str, str, bytes]]

        def upload(self, entity_type, entity_id, path, field_name=None, **_kw):  # type: ignore[override]
            self.uploads.append((entity_type, entity_id, field_name, path, Path(path).read_bytes()))
            self.update(entity_type, entity_id, {field_name: {"name": Path(path).name}})
            return entity_id

        def upload_thumbnail(self, entity_type, entity_id, path, **_kw):  # type: ignore[override]
            self.uploads.append((entity_type, entity_id, "image", path, Path(path).read_bytes()))
            return entity_id

    mg.Shotgun.set_schema_paths(str(SCHEMA / "schema.pickle"), str(SCHEMA / "schema_entity.pickle"))
    sg = Recording("https://mock.shotgrid.test", script_name="svfx", api_key="k")
    sg.uploads = []
    if project:
        sg.create("Project", {"name": project})
    return sg
