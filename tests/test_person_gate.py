"""The person gate (``--tiles people``): the tiled passes run only on tiles near the people a
whole-frame look finds; pixels near a person equal the all-tiles result bit for bit, the rest
hold each pass's declared background, and every frame says what the gate did."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sapiens
from sapiens.seg_classes import BACKGROUND, SEG_CLASSES
from schemas import passes as pass_table
from schemas.spec import parse_spec
from tasks.frame_inference import FrameInference
from tasks.person_gate import (
    PLUGIN_VARIABLE,
    PersonGateError,
    PersonLook,
    background_values,
    load_plugin,
)
from tasks.tiling import Region, plan_frame
from tests.frame_helpers import frame_spec, read_frame
from tests.model_helpers import tiny

# The figure a stand-in look knows about: a module the plugin variable can name.
_FIGURE = types.ModuleType("svfx_test_figure")
sys.modules[_FIGURE.__name__] = _FIGURE


def _figure_look(frames: torch.Tensor, look: torch.Tensor) -> torch.Tensor:
    """The drawn figure's coverage of each look pixel (red over the grey plate), at the
    model look's size: what a model that sees exactly the figure would say."""
    figure = (frames[:, 0] > 0.6).float()[:, None]
    return F.interpolate(figure, size=look.shape[-2:], mode="area")[:, 0]


def _nobody(frames: torch.Tensor, look: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(look)


_FIGURE.figure = _figure_look
_FIGURE.nobody = _nobody


def _spec(tiles: str, passes: tuple[str, ...], tile_hw: tuple[int, int] | None = None):
    tiling = {"tile_height": tile_hw[0], "tile_width": tile_hw[1]} if tile_hw else {}
    return frame_spec(passes, batch_size=4, previews=False, tiles=tiles, tiling=tiling)


_MODELS = {"normal": ("normal", 2), "matte": ("matting", 4), "seg": ("seg", 5)}


def _inference(tiles: str, passes: tuple[str, ...], tile_hw=None) -> FrameInference:
    models = {name: tiny(*_MODELS[name][:1], seed=_MODELS[name][1]) for name in passes}
    predictor = sapiens.Predictor(models, batch_size=4)
    return FrameInference(_spec(tiles, passes, tile_hw), predictor, SEG_CLASSES)


def _plate(height: int, width: int, figure: Region | None) -> np.ndarray:
    """A grey plate with a little texture and, in ``figure``, a red person-sized block."""
    rng = np.random.default_rng(7)
    rgb = (0.3 + 0.05 * rng.random((height, width, 3))).astype(np.float32)
    if figure is not None:
        rgb[figure.slices] = (0.9, 0.4, 0.3)
    return rgb


# -- the table and the look --------------------------------------------------------------------


def test_every_tiled_pass_declares_its_background_and_no_other_pass_does():
    for spec in pass_table.PASSES:
        assert (spec.background is not None) == (spec.inference == "tiled"), spec.name


def test_background_values_are_nothing_or_certain_background():
    assert background_values(pass_table.BY_NAME["normal"], SEG_CLASSES) == [0.0, 0.0, 0.0]
    assert background_values(pass_table.BY_NAME["matte"], SEG_CLASSES) == [0.0]
    seg = background_values(pass_table.BY_NAME["seg"], SEG_CLASSES)
    assert len(seg) == len(SEG_CLASSES) and seg[BACKGROUND] == 1.0 and sum(seg) == 1.0
    with pytest.raises(ValueError, match="never gated"):
        background_values(pass_table.BY_NAME["pointmap"], SEG_CLASSES)


def test_a_tile_runs_when_its_box_grown_by_the_margin_meets_a_person():
    mask = np.zeros((54, 102), dtype=bool)  # a 4096x2160 frame seen at about 1/40
    mask[20, 50] = True  # frame rows 800-840, columns 2008-2048
    look = PersonLook(mask, 2160, 4096)
    margin = look.margin_px()
    assert margin == 128
    assert look.touches(Region(700, 1900, 900, 2100))  # over it
    assert look.touches(Region(0, 2048 + margin - 1, 768, 3000))  # within the margin
    assert not look.touches(Region(0, 2048 + margin + 41, 768, 3000))  # a look pixel beyond
    assert not look.touches(Region(1200, 0, 2160, 4096))
    assert not PersonLook(np.zeros((4, 4), dtype=bool), 100, 100).found


def test_the_plugin_variable_names_a_callable_or_is_refused_by_name():
    assert load_plugin("svfx_test_figure:figure") is _figure_look
    for text in ("svfx_test_figure:missing", "no_such_module_xyz:f", "svfx_test_figure"):
        with pytest.raises(PersonGateError, match=PLUGIN_VARIABLE):
            load_plugin(text)


# -- through the model stage -------------------------------------------------------------------


@pytest.mark.slow
def test_a_60px_person_in_a_4k_frame_is_found_and_computed_as_with_every_tile(monkeypatch):
    # A distant person: 60 px tall, 14 wide, at 4096x2160 with 1024x768 tiles. The look sees it
    # at a quarter of the side (its coverage, as a model seeing exactly the figure would say).
    monkeypatch.setenv(PLUGIN_VARIABLE, "svfx_test_figure:figure")
    figure = Region(1500, 3001, 1560, 3015)
    rgb = _plate(2160, 4096, figure)
    passes = ("normal", "matte")
    gated = _inference("people", passes, (1024, 768))
    every = _inference("all", passes, (1024, 768))
    (frame,) = gated.run([read := read_frame(rgb)])
    (reference,) = every.run([read_frame(rgb)])
    got, want = frame.arrays.wait(), reference.arrays.wait()

    plan = plan_frame(2160, 4096, "normal", (1024, 768), 128)
    near = [t for t in plan.tiles if _meets(t.box, figure, 128)]
    assert 0 < len(near) < len(plan.tiles)
    assert read.summary.tiles == {
        "run": 2 * len(near),
        "skipped": 2 * (len(plan.tiles) - len(near)),
    }
    around = Region(figure.y0 - 128, figure.x0 - 128, figure.y1 + 128, figure.x1 + 128)
    for name in passes:  # exactly the all-tiles values on and around the person
        assert np.array_equal(got[name][(..., *around.slices)], want[name][(..., *around.slices)])
    far = Region(0, 0, 700, 1500)  # no tile that runs reaches it: the background
    assert not got["normal"][(..., *far.slices)].any() and not got["matte"][far.slices].any()
    assert not any("no person" in note for note in read.summary.notes)


def _meets(box: Region, figure: Region, margin: int) -> bool:
    return (
        box.y0 < figure.y1 + margin
        and figure.y0 - margin < box.y1
        and box.x0 < figure.x1 + margin
        and figure.x0 - margin < box.x1
    )


def test_a_frame_with_nobody_holds_every_background_and_says_so(monkeypatch):
    monkeypatch.setenv(PLUGIN_VARIABLE, "svfx_test_figure:nobody")
    (frame,) = _inference("people", ("normal", "seg")).run(
        [read := read_frame(_plate(300, 430, None))]
    )
    got = frame.arrays.wait()
    assert read.summary.tiles["run"] == 0 and read.summary.tiles["skipped"] > 0
    assert not got["normal"].any()
    assert (got["seg"] == BACKGROUND).all() and (got["seg/id"].view(np.uint32) == BACKGROUND).all()
    assert not got["nonfinite/normal"] and not got["nonfinite/seg"]
    assert "person gate: no person found" in " ".join(read.summary.notes)


def test_an_untrained_look_runs_every_tile_and_says_so(monkeypatch):
    monkeypatch.delenv(PLUGIN_VARIABLE, raising=False)
    rgb = _plate(300, 430, Region(100, 100, 200, 150))
    (frame,) = _inference("people", ("normal", "seg")).run([read := read_frame(rgb)])
    (reference,) = _inference("all", ("normal", "seg")).run([every := read_frame(rgb)])
    assert read.summary.tiles["skipped"] == 0 and read.summary.tiles == every.summary.tiles
    assert any("the seg model is untrained" in note for note in read.summary.notes)
    assert not every.summary.notes
    got, want = frame.arrays.wait(), reference.arrays.wait()
    assert all(np.array_equal(got[k], want[k]) for k in want)


# -- the setting -------------------------------------------------------------------------------


def test_the_setting_is_in_the_cache_key_and_every_tile_keeps_the_old_keys():
    people, every = _spec("people", ("normal",)), _spec("all", ("normal",))
    assert people.tiles == "people"  # the default
    data = every.model_dump()
    data.pop("tiles")
    assert parse_spec(data).settings_digest() != every.settings_digest()
    assert people.settings_digest() != every.settings_digest()


def _write_normals(path, provenance: dict[str, str]) -> None:
    from storage.exr_writer import write_passes_exr
    from storage.frame import Frame

    plane = np.zeros((8, 8), dtype=np.float16)
    window = (0, 0, 7, 7)
    plate = Frame(np.zeros((8, 8, 3), np.float32), "/p/plate.1001.exr", 1001, window, window)
    parts = {"N": {"N.x": plane, "N.y": plane, "N.z": plane}}
    write_passes_exr(str(path), plate, pass_table.exr_layers(["normal"]), parts, provenance)


@pytest.mark.parametrize("before", [None, "all", "people"])
def test_a_resubmit_with_another_tiles_setting_than_the_versions_files_is_refused(tmp_path, before):
    from flows.inputs import tiles_problem
    from schemas.spec import TILES_KEY
    from tasks.output_paths import ShotOutputPaths

    paths = ShotOutputPaths.for_shot(str(tmp_path), "s", "q", "h", "v001")
    assert tiles_problem(_spec("people", ("normal",)), paths) is None  # nothing written yet
    tmp_path.joinpath(paths.root).mkdir(parents=True)
    _write_normals(paths.exr(1001), {TILES_KEY: before} if before else {})
    written = before or "all"  # a version made before the gate ran every tile
    other = "people" if written == "all" else "all"
    assert tiles_problem(_spec(written, ("normal",)), paths) is None
    problem = tiles_problem(_spec(other, ("normal",)), paths)
    assert problem is not None and "\n" not in problem
    assert problem.startswith(paths.exr(1001))
    assert "version v001 of s/q/h" in problem
    assert f"made with tiles {written}, this submit asks for tiles {other}" in problem


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_through_the_flow_the_catalog_records_each_frames_tiles(tmp_path, monkeypatch, prefect_api):
    from distributed import Client, LocalCluster
    from sqlalchemy import select

    from bench.io import write_plates
    from flows.process_shot import process_shot
    from schemas.catalog import open_catalog
    from schemas.catalog.models import JobFrame
    from storage.exr_layout import exr_attribute
    from tests.shot_helpers import spec_data

    monkeypatch.setenv("SVFX_HOME", str(tmp_path))
    monkeypatch.setenv("SVFX_ALLOWED_ROOTS", str(tmp_path))
    monkeypatch.delenv("SVFX_CATALOG_URL", raising=False)
    monkeypatch.delenv("SVFX_CHECKPOINT_ROOT", raising=False)
    monkeypatch.setenv(PLUGIN_VARIABLE, "bench.standins:figure_look")  # workers inherit it
    pattern = write_plates(tmp_path / "plates", 360, 640, 2, "realistic")
    spec = spec_data(pattern, tmp_path / "out", passes=["normal", "seg"], colorspace="lin_rec709")
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as local,
        Client(local),
    ):
        result = process_shot(spec, local.scheduler_address)
    assert result["status"] == "complete", result["failed"]
    catalog = open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    with catalog.engine.connect() as conn:
        rows = conn.execute(select(JobFrame.frame, JobFrame.tiles_run, JobFrame.tiles_skipped))
        tiles = {frame: (run, skipped) for frame, run, skipped in rows}
    plan = plan_frame(360, 640, "normal", (256, 192), 48)
    assert set(tiles) == {1001, 1002}
    for run, skipped in tiles.values():  # two passes; the figure is in the middle third
        assert run + skipped == 2 * len(plan.tiles) and run > 0 and skipped > 0
    assert result["tiles"] == {  # the shot's summary adds them up
        "run": sum(run for run, _ in tiles.values()),
        "skipped": sum(skipped for _, skipped in tiles.values()),
    }
    assert result["notes"] == {}  # the figure was found in both frames
    exr = sorted((tmp_path / "out").rglob("*.exr"))[0]
    assert exr_attribute(str(exr), "svfx/tiles") == "people"
