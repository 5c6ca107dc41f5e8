"""`svfx submit-edit`: cuts in (OTIO, CMX3600 EDL, FCP 7 XML) -> one shot per clip.

Most rules are tested on `flows.edit_cuts` directly (reading a cut into clip records, then
planning): shot names from clips, markers and templates, frame ranges with handles, plate
patterns, clips sharing a plate submitted once, overlapping shots, clips without a name,
plates outside the allowed roots, missing frames. The command is run for its table and exit
codes, an unreadable cut, and once for real: two tiny clips through the flow into the catalog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import opentimelineio as otio
import pytest
from rich.console import Console

from cli import console as cli_console
from cli import submit as submit_commands
from flows.cut_planning import CutPlan, plan_cut
from flows.edit_cuts import CutError, CutOptions, load_cut, read_cut
from flows.plate_template import TemplateError
from tests.plates import write_sequence
from tests.shot_helpers import make_plate
from tests.test_cli import _svfx_env, as_json, invoke, why

RT = otio.opentime.RationalTime
TR = otio.opentime.TimeRange
SHARED = {"passes": "matte", "colorspace": "lin_rec709"}


# -- helpers -------------------------------------------------------------------------------------
def plate(root: Path, shot: str, frames: range, name: str | None = None) -> str:
    """Tiny EXRs at root/shot/plate/<name>.####.exr; returns the pattern."""
    name = name or f"{shot}_plate"
    write_sequence(root / shot / "plate", frames, name=name)
    return str(root / shot / "plate" / f"{name}.####.exr")


def sequence_ref(pattern: str, first: int, count: int) -> otio.schema.ImageSequenceReference:
    """An OTIO image-sequence reference for `dir/name.####.exr`, time 0 = image `first`."""
    directory, _, name = pattern.rpartition("/")
    prefix, _, suffix = name.partition("####")
    return otio.schema.ImageSequenceReference(
        target_url_base=f"file://{directory}/",
        name_prefix=prefix,
        name_suffix=suffix,
        start_frame=first,
        frame_zero_padding=4,
        rate=24,
        available_range=TR(RT(0, 24), RT(count, 24)),
    )


def clip(name: str, ref: Any, start: int, length: int, marker: str = "") -> otio.schema.Clip:
    made = otio.schema.Clip(
        name=name, media_reference=ref, source_range=TR(RT(start, 24), RT(length, 24))
    )
    if marker:
        made.markers.append(
            otio.schema.Marker(name=marker, marked_range=TR(RT(start, 24), RT(0, 24)))
        )
    return made


def write_otio(path: Path, *clips: otio.schema.Clip, adapter: str | None = None) -> Path:
    timeline = otio.schema.Timeline(name="cut", global_start_time=RT(86400, 24))
    track = otio.schema.Track(name="V1")
    timeline.tracks.append(track)
    for item in clips:
        track.append(item)
    otio.adapters.write_to_file(timeline, str(path), adapter_name=adapter)
    return path


def plan(cut: Path, root: Path, *, roots: list[str] | None = None, **options: Any) -> CutPlan:
    opts = CutOptions(show="abc", seq="sq010", **options)
    return plan_cut(
        load_cut(str(cut), opts),
        show="abc",
        seq="sq010",
        submit=SHARED,
        roots=roots or [str(root)],
        output_root=str(root / "out"),
        source=str(cut),
    )


def problems(result: CutPlan) -> dict[str, str]:
    return {c.label: "; ".join(c.problems) for c in result.clips if c.problems}


# -- reading each format --------------------------------------------------------------------------
def test_otio_image_sequences_give_shots_frames_with_handles_and_plates(tmp_path):
    p10 = plate(tmp_path, "sh010", range(1001, 1025))
    p20 = plate(tmp_path, "sh020", range(1001, 1013))
    cut = write_otio(
        tmp_path / "cut.otio",
        clip("sh010", sequence_ref(p10, 1001, 24), 4, 10),  # images 1005-1014
        otio.schema.Gap(duration=RT(5, 24)),
        clip("sh020", sequence_ref(p20, 1001, 12), 2, 8),  # images 1003-1010
    )
    result = plan(cut, tmp_path, handles=2)
    assert not result.refused, problems(result)
    one, two = result.clips
    assert (one.index, one.name, one.shot, one.frames, one.plate) == (
        1,
        "sh010",
        "sh010",
        "1003-1016",
        p10,
    )
    assert (two.shot, two.frames, two.plate) == ("sh020", "1001-1012", p20)
    assert one.record == "01:00:00:00-01:00:00:10" and two.record == "01:00:00:15-01:00:00:23"
    assert [(s.shot, s.frames, s.plate) for s in result.shots] == [
        ("abc/sq010/sh010", "1003-1016", p10),
        ("abc/sq010/sh020", "1001-1012", p20),
    ]
    spec = result.shots[0].spec
    assert (spec.plate, spec.frames, spec.passes, spec.colorspace) == (
        p10,
        "1003-1016",
        ("matte",),
        "lin_rec709",
    )


EDL = """TITLE: abc_cut_v001
FCM: NON-DROP FRAME

001  A001C003 V     C        00:00:41:19 00:00:41:23 01:00:00:00 01:00:00:04
* FROM CLIP NAME:  A001C003_take2
* LOC: 01:00:00:01 YELLOW  sh010
002  A001C004 V     C        00:00:41:17 00:00:41:21 01:00:00:04 01:00:00:08
* LOC: 01:00:00:05 YELLOW  sh020
003  A001C005 V     C        00:00:41:17 00:00:41:21 01:00:00:08 01:00:00:12
"""


def test_edl_shots_named_by_loc_markers_with_plates_from_a_root(tmp_path):
    p10 = plate(tmp_path / "plates", "sh010", range(1001, 1010))
    p20 = plate(tmp_path / "plates", "sh020", range(1000, 1006))
    cut = tmp_path / "cut.edl"
    cut.write_text(EDL)
    result = plan(
        cut, tmp_path, shot_template="{marker}", plates_root=str(tmp_path / "plates"), handles=1
    )
    one, two, _ = result.clips
    # source timecode counted in frames: 00:00:41:19 at 24 fps is frame 1003
    assert (one.name, one.shot, one.frames, one.plate) == (
        "A001C003_take2",
        "sh010",
        "1002-1007",
        p10,
    )
    assert (two.name, two.shot, two.frames, two.plate) == ("", "sh020", "1000-1005", p20)
    assert one.markers == ("sh010",)
    assert problems(result) == {
        "clip 3 (no name)": "no shot name: the clip has no marker (an EDL * LOC: line) to name "
        "its shot"
    }
    assert [s.shot for s in result.shots] == ["abc/sq010/sh010", "abc/sq010/sh020"]
    # 23.976 as typed is 24000/1001; timecode still counts 24 frames a second
    ntsc = plan(
        cut, tmp_path, shot_template="{marker}", plates_root=str(tmp_path / "plates"), rate=23.976
    )
    assert [c.frames for c in ntsc.clips] == ["1003-1006", "1001-1004", "1001-1004"]

    # named by the clip (the default): the event without * FROM CLIP NAME has no name
    by_clip = plan(cut, tmp_path, plates_root=str(tmp_path / "plates"))
    assert problems(by_clip)["clip 2 (no name)"] == "no shot name: the clip has no name"
    assert "clip 1 'A001C003_take2'" in problems(by_clip)  # no plate A001C003_take2/plate/...


def test_fcp_xml_written_by_otio_maps_its_first_frame_urls(tmp_path):
    p10 = plate(tmp_path, "sh010", range(1001, 1031))
    first_frame = p10.replace("####", "1001")
    ref = otio.schema.ExternalReference(
        target_url=f"file://{first_frame}", available_range=TR(RT(86400, 24), RT(30, 24))
    )
    movie = otio.schema.ExternalReference(
        target_url="file:///editorial/A001C003.mov", available_range=TR(RT(0, 24), RT(30, 24))
    )
    cut = write_otio(
        tmp_path / "cut.xml",
        clip("sh010", ref, 86405, 10),
        clip("sh020", movie, 0, 10),
        adapter="fcp_xml",
    )
    assert cut.read_text().startswith("<?xml") and "<xmeml" in cut.read_text()
    result = plan(cut, tmp_path, handles=3)
    first, _ = result.clips
    # the URL's frame 1001 is the start of the available range: source 86405 is image 1006
    assert (first.shot, first.frames, first.plate, first.problems) == (
        "sh010",
        "1003-1018",
        p10,
        (),
    )
    assert problems(result) == {
        "clip 2 'sh020'": "no plate: its media file:///editorial/A001C003.mov is not an image "
        "sequence; give --plates-root (and --plate-template)"
    }
    assert [s.shot for s in result.shots] == ["abc/sq010/sh010"]


def test_shot_template_fields_and_unknown_fields(tmp_path):
    p10 = plate(tmp_path, "sh010", range(1001, 1011))
    cut = write_otio(tmp_path / "cut.otio", clip("A001C003", sequence_ref(p10, 1001, 10), 0, 4))
    result = plan(cut, tmp_path, shot_template="{seq}_{index:03d}0")
    assert result.clips[0].shot == "sq010_0010"
    with pytest.raises(TemplateError, match=r"names unknown fields \{foo\}"):
        plan(cut, tmp_path, shot_template="{foo}")


# -- planning ------------------------------------------------------------------------------------
def test_clips_sharing_a_plate_submit_once_with_their_frames_united(tmp_path):
    p10 = plate(tmp_path, "sh010", range(1001, 1021))
    ref = sequence_ref(p10, 1001, 20)
    cut = write_otio(
        tmp_path / "cut.otio",
        clip("sh010", ref.clone(), 0, 4),  # 1001-1004
        clip("sh010", ref.clone(), 9, 3),  # 1010-1012
        clip("sh010", ref.clone(), 2, 4),  # 1003-1006
    )
    result = plan(cut, tmp_path)
    (shot,) = result.shots
    assert shot.frames == "1001-1006,1010-1012" and shot.spec.frames == "1001-1006,1010-1012"
    assert shot.clips == ("clip 1 'sh010'", "clip 2 'sh010'", "clip 3 'sh010'")


def test_overlapping_shots_are_refused_by_name_and_the_rest_goes_on(tmp_path):
    a = plate(tmp_path, "a", range(1001, 1011))
    b = plate(tmp_path, "b", range(1001, 1011))
    c = plate(tmp_path, "sh020", range(1001, 1011))
    cut = write_otio(
        tmp_path / "cut.otio",
        clip("sh010", sequence_ref(a, 1001, 10), 0, 4),
        clip("sh010", sequence_ref(b, 1001, 10), 0, 4),
        clip("sh020", sequence_ref(c, 1001, 10), 0, 4),
    )
    result = plan(cut, tmp_path)
    found = problems(result)
    assert set(found) == {"clip 1 'sh010'", "clip 2 'sh010'"}
    why_refused = found["clip 1 'sh010'"]
    assert why_refused.startswith("overlapping shots: abc/sq010/sh010 would be made from 2 plates")
    assert f"clip 1 'sh010' from {a}" in why_refused and f"clip 2 'sh010' from {b}" in why_refused
    assert [s.shot for s in result.shots] == ["abc/sq010/sh020"]


def test_a_clip_without_a_name_or_with_a_bad_one_is_refused(tmp_path):
    p = plate(tmp_path, "sh010", range(1001, 1011))
    ref = sequence_ref(p, 1001, 10)
    cut = write_otio(
        tmp_path / "cut.otio",
        clip("", ref.clone(), 0, 4),
        clip("sh 010", ref.clone(), 0, 4),
        clip("sh010", ref.clone(), 0, 4),
    )
    result = plan(cut, tmp_path)
    found = problems(result)
    assert found["clip 1 (no name)"] == "no shot name: the clip has no name"
    assert "shot: 'sh 010' is not a usable name" in found["clip 2 'sh 010'"]
    assert [s.shot for s in result.shots] == ["abc/sq010/sh010"]


def test_a_plate_outside_the_allowed_roots_is_refused(tmp_path, tmp_path_factory):
    outside = plate(tmp_path_factory.mktemp("elsewhere"), "sh010", range(1001, 1011))
    inside = plate(tmp_path, "sh020", range(1001, 1011))
    cut = write_otio(
        tmp_path / "cut.otio",
        clip("sh010", sequence_ref(outside, 1001, 10), 0, 4),
        clip("sh020", sequence_ref(inside, 1001, 10), 0, 4),
    )
    result = plan(cut, tmp_path)
    why_refused = problems(result)["clip 1 'sh010'"]
    assert f"plate {outside}" in why_refused and "lies outside the allowed roots" in why_refused
    assert [s.shot for s in result.shots] == ["abc/sq010/sh020"]


def test_frames_missing_or_a_missing_plate_name_the_clip_and_frames(tmp_path):
    p10 = plate(tmp_path, "sh010", [*range(1001, 1005), *range(1006, 1011)])  # 1005 missing
    p20 = plate(tmp_path, "sh020", range(1001, 1011))
    cut = write_otio(
        tmp_path / "cut.otio",
        clip("sh010", sequence_ref(p10, 1001, 10), 2, 4),  # 1003-1006: a hole
        clip("sh020", sequence_ref(p20, 1001, 10), 6, 4),  # 1007-1010, handles 1011
        clip("sh030", sequence_ref(p20.replace("sh020", "sh030"), 1001, 10), 0, 4),
        clip("sh040", sequence_ref(p20, 1001, 10), 0, 4),  # 1001-1004, handles 1000
    )
    result = plan(cut, tmp_path, handles=1)
    found = problems(result)
    assert (
        found["clip 1 'sh010'"]
        == f"frames 1005 of 1002-1007 are not on disk ({p10} holds 1001-1004,1006-1010)"
    )
    assert (
        found["clip 2 'sh020'"]
        == f"frames 1011 of 1006-1011 are not on disk ({p20} holds 1001-1010)"
    )
    assert found["clip 3 'sh030'"].startswith("plate not found:")
    assert found["clip 4 'sh040'"].startswith("frames 1000 of 1000-1005")
    assert result.shots == ()


def test_a_source_range_outside_the_media_is_named(tmp_path):
    p10 = plate(tmp_path, "sh010", range(1001, 1011))
    cut = write_otio(tmp_path / "cut.otio", clip("sh010", sequence_ref(p10, 1001, 10), 8, 5))
    why_refused = problems(plan(cut, tmp_path))["clip 1 'sh010'"]
    assert why_refused.startswith("its source range") and "outside its media's" in why_refused


def test_an_unreadable_cut_is_one_error_naming_the_file(tmp_path):
    for name, text in (
        ("bad.edl", "001  A V C 00:00:00:00 xx\n"),
        ("bad.otio", "{not json"),
        ("bad.xml", "<xmeml><x>"),
    ):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(CutError, match=rf"^{path}: cannot read it as "):
            read_cut(str(path))
    with pytest.raises(CutError, match=r"unknown cut format '\.txt'"):
        read_cut(str(tmp_path / "cut.txt"))
    with pytest.raises(CutError, match="no such file"):
        read_cut(str(tmp_path / "gone.otio"))


# -- the command ---------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    _svfx_env(monkeypatch, tmp_path / "home", tmp_path)
    monkeypatch.setattr(cli_console, "console", Console(width=400))  # table cells unfolded

    def must_not_run(*_: Any, **__: Any) -> None:
        raise AssertionError("a dry run must not run a flow")

    monkeypatch.setattr(submit_commands, "_run_flow", must_not_run)
    return tmp_path


def test_dry_run_prints_the_table_and_exits_2_when_a_clip_has_a_problem(home):
    p10 = plate(home, "sh010", range(1001, 1011))
    good = write_otio(home / "good.otio", clip("sh010", sequence_ref(p10, 1001, 10), 0, 4))
    result = invoke(
        "submit-edit", str(good), "--show", "abc", "--seq", "sq010", "--handles", "1", "--dry-run"
    )
    assert result.exit_code == 2, why(result)  # with handles, frame 1000 is not on disk
    refused_line = "clip 1 'sh010': frames 1000 of 1000-1005 are not on disk"
    assert refused_line in result.stdout.splitlines()[-1] and not result.stderr

    result = invoke("submit-edit", str(good), "--show", "abc", "--seq", "sq010", "--dry-run")
    assert result.exit_code == 0, why(result)
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["1", "sh010", "01:00:00:00-01:00:00:04", "sh010", "1001-1004"] in rows
    assert ["abc/sq010/sh010", "1001-1004", "1", p10] in rows
    assert "refused" not in result.stdout

    report = as_json(
        invoke("submit-edit", str(good), "--show", "abc", "--seq", "sq010", "--dry-run", "--json")
    )
    assert report["shots"] == [
        {
            "shot": "abc/sq010/sh010",
            "plate": p10,
            "frames": "1001-1004",
            "clips": ["clip 1 'sh010'"],
        }
    ]


def test_an_unparseable_cut_exits_2_with_one_line(home):
    cut = home / "cut.edl"
    cut.write_text("001  A V C 00:00:00:00 xx\n")
    result = invoke("submit-edit", str(cut), "--show", "abc", "--seq", "sq010")
    assert result.exit_code == 2, why(result)
    assert result.stderr.startswith(f"error: {cut}: cannot read it as cmx_3600: ")
    assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout
    assert isinstance(result.exception, SystemExit)  # no traceback


# -- one real run --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dask_address():
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as local:
        yield local.scheduler_address


@pytest.mark.timeout(300)
def test_two_clips_run_through_the_flow_into_the_catalog(
    tmp_path, monkeypatch, prefect_api, dask_address
):
    _svfx_env(monkeypatch, tmp_path / "home", tmp_path)
    refs = {}
    for shot in ("sh010", "sh020"):
        pattern = make_plate(tmp_path / shot, frames=2)
        refs[shot] = sequence_ref(pattern, 1001, 2)
    cut = write_otio(tmp_path / "cut.otio", *(clip(s, r, 0, 2) for s, r in refs.items()))
    result = invoke(
        "submit-edit", str(cut), "--show", "abc", "--seq", "sq010",
        "--passes", "matte", "--colorspace", "lin_rec709", "--output", str(tmp_path / "out"),
        "--no-previews", "--dask-address", dask_address, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, why(result)
    report = as_json(result)
    assert [(s["shot"], s["result"]["status"]) for s in report["shots"]] == [
        ("abc/sq010/sh010", "complete"),
        ("abc/sq010/sh020", "complete"),
    ]
    shots = as_json(invoke("catalog", "shots", "--show", "abc", "--json"))
    assert {(r["shot"], r["job_status"], r["passes"]["matte"]) for r in shots} == {
        ("sh010", "complete", 2),
        ("sh020", "complete", 2),
    }
