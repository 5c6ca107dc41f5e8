"""Cuts as editors make them: `svfx submit-edit` on EDLs and XMLs shaped like exports from
Avid, Premiere and Hiero (`tests/cuts/`), whose clips are named `ZZ100_501 (LAY3)`, the shot
ID plus a take, and `--shot-pattern` pulling the ID out of a clip's name, source file,
markers or reel. The files hold what those exports hold: black, dissolves (`* TO CLIP
NAME:`), speed effects (M2), audio events, several reels, `* LOC:` markers with notes,
`* SOURCE FILE:` and `* FROM FILE:` comments, FCP XML clip markers and an audio track.

Also the `--dry-run` report at 80 columns: short cells that never wrap a shot name, and the
problems listed under the tables, one line per problem naming its clip.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cli import console as cli_console
from cli import submit as submit_commands
from flows.cut_planning import CutPlan, plan_cut
from flows.edit_cuts import CutOptions, load_cut
from flows.shot_patterns import ShotPatternError, parse_shot_pattern
from tests.plates import write_sequence
from tests.test_cli import _svfx_env, invoke, why

CUTS = Path(__file__).parent / "cuts"
SHOT_ID = r"(?P<shot>ZZ\d+_\d+)"


def plan(cut: Path, root: Path, **options: Any) -> CutPlan:
    opts = CutOptions(show="zz", seq="zz100", **options)
    return plan_cut(
        load_cut(str(cut), opts),
        show="zz",
        seq="zz100",
        submit={"passes": "matte", "colorspace": "lin_rec709"},
        roots=[str(root)],
        output_root=str(root / "out"),
        source=str(cut),
    )


def shots(result: CutPlan) -> dict[str, str]:
    """clip label -> shot name, for the clips that have one."""
    return {c.label: c.shot for c in result.clips if c.shot}


def problems(result: CutPlan) -> dict[str, str]:
    return {c.label: "; ".join(c.problems) for c in result.clips if c.problems}


def plates(root: Path, frames_by_shot: dict[str, range]) -> None:
    """Plates under root as the default --plate-template names them."""
    for shot, frames in frames_by_shot.items():
        write_sequence(root / shot / "plate", frames, name=f"{shot}_plate")


# -- the pattern ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("(?P<shot>ZZ\\d+_\\d+)", "must start with the field it reads (clip:, source:, marker:"),
        ("name:(?P<shot>.+)", "must start with the field it reads"),
        ("clip:(?P<shot>ZZ\\d+_\\d+", "is not a valid regular expression: missing ), unterminated"),
        ("clip:ZZ\\d+_\\d+", "has no group named shot: write (?P<shot>...)"),
        ("clip:(?P<id>ZZ\\d+)", "has no group named shot"),
    ],
)
def test_a_pattern_that_cannot_be_used_is_one_error_naming_it(text, said):
    with pytest.raises(ShotPatternError) as caught:
        parse_shot_pattern(text)
    message = str(caught.value)
    assert message.startswith(f"--shot-pattern '{text}' ") and said in message
    assert "\n" not in message


def test_a_pattern_finds_the_id_inside_the_name_and_reads_only_its_field():
    pattern = parse_shot_pattern(f"clip:{SHOT_ID}")
    assert pattern.field == "clip" and pattern.groups == ("shot",)
    assert pattern.extract(("ZZ100_501 (LAY3)",)) == ({"shot": "ZZ100_501"}, "")
    # a colon inside the regex is the regex's, not a field
    non_capturing = parse_shot_pattern(r"marker:(?:VFX )?(?P<shot>ZZ\d+_\d+)")
    assert non_capturing.extract(("VFX ZZ100_502",)) == ({"shot": "ZZ100_502"}, "")
    by_marker = parse_shot_pattern(f"marker:{SHOT_ID}")
    assert by_marker.extract(("ZZ100_501 fix", "ZZ100_501")) == ({"shot": "ZZ100_501"}, "")
    assert by_marker.extract(("ZZ100_501", "ZZ100_502 too")) == (
        {},
        f"--shot-pattern marker:{SHOT_ID} finds several shots (ZZ100_501, ZZ100_502): ambiguous",
    )


# -- Avid Media Composer EDL ----------------------------------------------------------------------
def test_avid_edl_shot_ids_from_clip_names_with_takes(tmp_path):
    """Black skipped; the dissolve's incoming clip named by its TO CLIP NAME; the M2 speed
    effect and the B (video + audio) event are video clips; audio events are not clips."""
    plates(
        tmp_path,
        {
            "ZZ100_501": range(1242029, 1242101),  # 60 frames, then 12 under the dissolve
            "ZZ100_503": range(1036800, 1036824),  # 12:00:00:00, one second of source
            "ZZ100_505": range(864000, 864048),
        },
    )
    pattern = parse_shot_pattern(f"clip:{SHOT_ID}")
    result = plan(
        CUTS / "avid_zz100_v012.edl", tmp_path, shot_pattern=pattern, plates_root=str(tmp_path)
    )
    assert [c.name for c in result.clips] == [
        "ZZ100_501 (LAY3)",
        "ZZ100_502 (ANIM1)",
        "ZZ100_503 (COMP2) SLOMO",
        "ZZ100 504 TEMP",
        "ZZ100_505 (LAY1)",
    ]
    # record timecodes as the EDL writes them (the adapter keeps the first in the track)
    assert [c.record for c in result.clips][:2] == [
        "01:00:00:00-01:00:02:12",
        "01:00:02:12-01:00:05:06",  # the dissolve's incoming clip, from the cut point
    ]
    assert shots(result) == {
        "clip 1 'ZZ100_501 (LAY3)'": "ZZ100_501",
        "clip 2 'ZZ100_502 (ANIM1)'": "ZZ100_502",
        "clip 3 'ZZ100_503 (COMP2) SLOMO'": "ZZ100_503",
        "clip 5 'ZZ100_505 (LAY1)'": "ZZ100_505",
    }
    found = problems(result)
    assert found["clip 4 'ZZ100 504 TEMP'"] == (
        f"no shot name: --shot-pattern clip:{SHOT_ID} does not match its name 'ZZ100 504 TEMP'"
    )
    assert found["clip 2 'ZZ100_502 (ANIM1)'"].startswith("plate not found:")  # not pulled yet
    assert [(s.shot, s.frames) for s in result.shots] == [
        # EDL source timecode counted in frames; the outgoing clip plays on for the 12
        # frames of the dissolve after its cut
        ("zz/zz100/ZZ100_501", "1242029-1242100"),
        # M2 at 12 fps over 2 s of record: the 24 source frames it plays, not 48
        ("zz/zz100/ZZ100_503", "1036800-1036823"),
        ("zz/zz100/ZZ100_505", "864000-864047"),
    ]


def test_avid_edl_shot_ids_from_loc_markers_with_notes(tmp_path):
    pattern = parse_shot_pattern(rf"marker:^{SHOT_ID}\b")
    result = plan(
        CUTS / "avid_zz100_v012.edl", tmp_path, shot_pattern=pattern, plates_root=str(tmp_path)
    )
    assert shots(result) == {
        "clip 1 'ZZ100_501 (LAY3)'": "ZZ100_501",  # LOC "ZZ100_501 VFX ADD MUZZLE FLASH"
        "clip 2 'ZZ100_502 (ANIM1)'": "ZZ100_502",
        "clip 5 'ZZ100_505 (LAY1)'": "ZZ100_505",  # two LOCs, one shot: not ambiguous
    }
    found = problems(result)
    assert found["clip 3 'ZZ100_503 (COMP2) SLOMO'"] == (
        f"no shot name: the clip has no marker for --shot-pattern marker:^{SHOT_ID}\\b"
    )
    assert found["clip 4 'ZZ100 504 TEMP'"] == (
        f"no shot name: --shot-pattern marker:^{SHOT_ID}\\b does not match its markers "
        "'NEEDS SHOT ID FROM EDITORIAL'"
    )


def test_pattern_groups_fill_the_shot_template(tmp_path):
    pattern = parse_shot_pattern(rf"clip:^{SHOT_ID} \((?P<task>[A-Z]+)\d+\)")
    result = plan(
        CUTS / "avid_zz100_v012.edl",
        tmp_path,
        shot_pattern=pattern,
        shot_template="{shot}_{task}",
    )
    assert list(shots(result).values()) == [
        "ZZ100_501_LAY",
        "ZZ100_502_ANIM",
        "ZZ100_503_COMP",
        "ZZ100_505_LAY",
    ]


# -- Premiere Pro EDL -----------------------------------------------------------------------------
def test_premiere_edl_shot_ids_from_source_file_names(tmp_path):
    """AX reels (no reel), clips renamed in the timeline, the ID only in `* SOURCE FILE:`."""
    by_clip = plan(CUTS / "premiere_zz100_v012.edl", tmp_path, shot_pattern=parse_shot_pattern(
        f"clip:{SHOT_ID}"
    ))  # fmt: skip
    assert len(by_clip.clips) == 4 and not shots(by_clip)  # 'ZZ100 501 take 3': no match
    pattern = parse_shot_pattern(f"source:^{SHOT_ID}_")
    result = plan(
        CUTS / "premiere_zz100_v012.edl", tmp_path, shot_pattern=pattern, plates_root=str(tmp_path)
    )
    assert shots(result) == {
        "clip 1 'ZZ100 501 take 3'": "ZZ100_501",
        "clip 2 'ZZ100 502 take 1'": "ZZ100_502",
        "clip 3 'ZZ100 503 take 2'": "ZZ100_503",
    }
    assert problems(result)["clip 4 'temp title card'"] == (
        f"no shot name: --shot-pattern source:^{SHOT_ID}_ does not match its source file name "
        "'TITLE_CARD_TEMP.psd'"
    )


# -- Hiero / Nuke Studio EDL: image sequences named by * FROM FILE --------------------------------
def test_hiero_edl_plates_from_the_cut_and_ids_from_names_or_reels(tmp_path):
    cut = tmp_path / "hiero_zz100_v012.edl"
    shutil.copy(CUTS / cut.name, cut)
    write_sequence(tmp_path / "plates/ZZ100_501", range(1001, 1009), name="ZZ100_501_plate_v001")
    write_sequence(tmp_path / "plates/ZZ100_502", range(1001, 1007), name="ZZ100_502_plate_v002")
    result = plan(cut, tmp_path, shot_pattern=parse_shot_pattern(rf"clip:^{SHOT_ID}_plate"))
    assert [(s.shot, s.frames, s.plate) for s in result.shots] == [
        (
            "zz/zz100/ZZ100_501",
            "1001-1004",
            f"{tmp_path}/plates/ZZ100_501/ZZ100_501_plate_v001.####.exr",
        ),
        (
            "zz/zz100/ZZ100_502",
            "1003-1005",
            f"{tmp_path}/plates/ZZ100_502/ZZ100_502_plate_v002.####.exr",
        ),
    ]
    assert list(problems(result)) == ["clip 3 'ref_bg_cleanplate'"]
    by_reel = plan(cut, tmp_path, shot_pattern=parse_shot_pattern("reel:^(?P<shot>.+)$"))
    assert list(shots(by_reel).values()) == ["ZZ100_501", "ZZ100_502", "ZZ100_503"]


# -- Premiere Pro FCP 7 XML -----------------------------------------------------------------------
def test_premiere_xml_clip_names_markers_and_first_frame_urls(tmp_path):
    cut = tmp_path / "premiere_zz100_v012.xml"
    cut.write_text((CUTS / cut.name).read_text().replace("/PLATES/", f"{tmp_path}/"))
    write_sequence(tmp_path / "ZZ100_501/plate", range(1001, 1049), name="ZZ100_501_plate_v001")
    write_sequence(tmp_path / "ZZ100_502/plate", range(1001, 1049), name="ZZ100_502_plate_v002")
    result = plan(cut, tmp_path, shot_pattern=parse_shot_pattern(f"clip:{SHOT_ID}"), handles=2)
    # in 4 of media whose URL names frame 1001: frames 1005-1024, handles 1003-1026
    assert [(s.shot, s.frames) for s in result.shots] == [("zz/zz100/ZZ100_501", "1003-1026")]
    assert problems(result)["clip 2 'ZZ100_502 (ANIM1)'"].startswith("frames 999-1000 of")
    assert problems(result)["clip 3 'ZZ100 503 TEMP (COMP2)'"].startswith(
        f"no shot name: --shot-pattern clip:{SHOT_ID} does not match its name "
        "'ZZ100 503 TEMP (COMP2)'; no plate: its media file://localhost/Volumes/editorial/media/"
    )
    by_marker = plan(cut, tmp_path, shot_pattern=parse_shot_pattern(f"marker:{SHOT_ID}"))
    assert shots(by_marker) == {"clip 1 'ZZ100_501 (LAY3)'": "ZZ100_501"}
    by_source = plan(cut, tmp_path, shot_pattern=parse_shot_pattern(f"source:^{SHOT_ID}_plate"))
    assert list(shots(by_source).values()) == ["ZZ100_501", "ZZ100_502"]


# -- the command ---------------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    _svfx_env(monkeypatch, tmp_path / "home", tmp_path)
    monkeypatch.setattr(cli_console, "console", Console(width=80))  # an 80-column terminal

    def must_not_run(*_: Any, **__: Any) -> None:
        raise AssertionError("a dry run must not run a flow")

    monkeypatch.setattr(submit_commands, "_run_flow", must_not_run)
    return tmp_path


def submit_edit(cut: Path, *options: str) -> Any:
    return invoke("submit-edit", str(cut), "--show", "zz", "--seq", "zz100", *options)


def test_dry_run_reads_at_80_columns_with_problems_under_the_tables(home):
    plates(home, {"ZZ100_501": range(1242029, 1242101), "ZZ100_505": range(864000, 864048)})
    result = submit_edit(
        CUTS / "avid_zz100_v012.edl",
        "--shot-pattern", f"clip:{SHOT_ID}", "--plates-root", str(home), "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 2, why(result)
    lines = result.stdout.splitlines()
    table, _, listed = result.stdout.partition("refused: 3 of 5 clips\n")
    assert listed, why(result)
    # every clip's row holds its shot name and frames whole, on one line
    for shot, frames in (("ZZ100_501", "1242029-1242100"), ("ZZ100_505", "864000-864047")):
        assert any(shot in line and frames in line for line in lines), table
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert "zz/zz100/ZZ100_501" in table and "zz/zz100/ZZ100_505" in table
    problem_lines = listed.splitlines()
    assert len(problem_lines) == 3  # one line each, however long: nothing folds them
    assert problem_lines[0].startswith("clip 2 'ZZ100_502 (ANIM1)': plate not found: ")
    assert problem_lines[1].startswith("clip 3 'ZZ100_503 (COMP2) SLOMO': plate not found: ")
    assert problem_lines[2] == (
        f"clip 4 'ZZ100 504 TEMP': no shot name: --shot-pattern clip:{SHOT_ID} does not match "
        "its name 'ZZ100 504 TEMP'"
    )
    assert "plate not found" not in table  # problems are not squeezed into cells


@pytest.mark.parametrize(
    "pattern",
    ["(?P<shot>ZZ\\d+_\\d+)", "clip:(?P<shot>ZZ\\d+", "clip:ZZ\\d+_\\d+"],
)
def test_a_bad_pattern_stops_the_command_with_one_line(home, pattern):
    result = submit_edit(CUTS / "avid_zz100_v012.edl", "--shot-pattern", pattern, "--dry-run")
    assert result.exit_code == 2, why(result)
    assert result.stderr.startswith(f"error: --shot-pattern '{pattern}' ")
    assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout
    assert isinstance(result.exception, SystemExit)


def test_a_template_naming_a_field_the_pattern_lacks_stops_the_command(home):
    result = submit_edit(
        CUTS / "avid_zz100_v012.edl",
        "--shot-pattern", f"clip:{SHOT_ID}", "--shot-template", "{shot}_{take}", "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 2, why(result)
    assert "names unknown fields {take}" in result.stderr and not result.stdout
