"""Every table the CLI prints reads at 80 columns: shot names and dates are never cut nor
folded, the summary's paths are relative to the shot's folder (printed once) and each stays on
one line. Rendered with a rich Console of width 80, as a terminal of that width would."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from cli import catalog as catalog_commands
from cli import console as console_module
from cli import submit as submit_commands

FOLDER = "/shows/abcdef/passes/abcdef/sq0100/sh0200_bg01/bg01/sapiens2_v001"
NAME = "sh0200_bg01_sapiens2_v001"
SHOT = "abcdef/sq0100/sh0200_bg01"


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> Console:
    screen = Console(record=True, width=80, color_system=None)
    for module in (console_module, catalog_commands, submit_commands):
        monkeypatch.setattr(module, "console", screen)
    monkeypatch.setattr(catalog_commands, "err", screen)
    monkeypatch.setattr(submit_commands, "err", screen)
    return screen


def _lines(screen: Console) -> list[str]:
    """The printed lines; the table's are at most 80 wide (a sentence beside a table is left
    for the terminal to wrap)."""
    lines = screen.export_text().splitlines()
    drawn = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert drawn and all(len(line) <= 80 for line in drawn), "\n".join(lines)
    return lines


def _job(job_id: int, **extra: Any) -> dict[str, Any]:
    show, sequence, shot = SHOT.split("/")
    return {
        "id": job_id,
        "show": show,
        "sequence": sequence,
        "shot": shot,
        "status": "partial",
        "submitter": "a.compositor@farm-node-042.studio.example",
        "created_at": "2026-11-25T19:33:11.444513+00:00",
        "frames_done": 20,
        "frames_skipped": 1,
        "frames_failed": 3,
        "frames_total": 24,
        "message": "20 done, 1 already done of 24 frames; 3 failed (see svfx status 12)",
        **extra,
    }


def test_status_keeps_shot_names_and_dates_whole(narrow: Console) -> None:
    catalog_commands.show_jobs([_job(12), _job(1234)], as_json=False)
    lines = _lines(narrow)
    rows = [line for line in lines if SHOT in line]
    assert len(rows) == 2 and all("2026-11-25 19:33:11Z" in row for row in rows)
    assert all("21/24" in row for row in rows)  # finished of total, then the failed
    said = "job 12 (a.compositor@farm-node-042.studio.example): 20 done, 1 already done"
    assert any(line.startswith(said) for line in lines)


def test_catalog_tables_keep_names_and_dates_whole(narrow: Console) -> None:
    output = {
        "frame": 1042,
        "pass_name": "pointmap",
        "kind": "exr",
        "part": "CryptoBodyPart00",
        "uri": f"{FOLDER}/{NAME}.1042.exr",
        "created_at": "2026-11-25T19:33:11.444513+00:00",
    }
    console_module.table([output], list(output))
    shot = {"show": "abcdef", "sequence": "sq0100", "shot": "sh0200_bg01_longer_name"}
    console_module.table([{**shot, "passes": {"normal": 24, "pointmap": 24}}], [*shot, "passes"])
    lines = _lines(narrow)
    assert any("2026-11-25 19:33:11Z" in line for line in lines)
    assert any("abcdef" in line and "sq0100" in line and shot["shot"] in line for line in lines)
    assert "…" not in "\n".join(lines)  # nothing cut, the long URI folds


def test_the_summary_prints_the_folder_once_and_paths_relative_on_one_line(
    narrow: Console,
) -> None:
    extras = {
        f"{kind}_{name}": f"{FOLDER}/{sub}/{NAME}_{name}{suffix}"
        for name in ("pointmap", "normal")
        for kind, sub, suffix in (
            ("contact_sheet", "previews", "_contact.jpg"),
            ("review_clip", "review", ".mp4"),
        )
    }
    result = {
        "job_id": 7,
        "status": "complete",
        "total": 24,
        "done": [],
        "skipped": list(range(24)),
        "failed": {},
        "output_root": FOLDER,
        "exr_pattern": f"{FOLDER}/{NAME}.%04d.exr",
        "zarr": f"{FOLDER}/{NAME}.zarr",
        "extras": {"nuke_script": f"{FOLDER}/{NAME}.nk", **extras},
        "flagged": {"normal": list(range(1001, 1025))},
    }
    submit_commands._print_result(result)
    text = narrow.export_text(clear=False)
    assert text.count(FOLDER) == 1 and f"outputs in {FOLDER}" in text
    lines = _lines(narrow)
    for path in (f"{NAME}.%04d.exr", f"previews/{NAME}_pointmap_contact.jpg"):
        assert any(f" {path} " in line for line in lines), path  # whole, on one line
    assert "1001, 1002" in text and "1024" in text  # the flicker list wraps, not cut


def test_the_summary_gives_the_gates_tiles_and_each_note_once_with_its_frames(
    narrow: Console,
) -> None:
    result = {
        "job_id": 8,
        "status": "complete",
        "total": 6,
        "done": list(range(1001, 1007)),
        "skipped": [],
        "failed": {},
        "output_root": FOLDER,
        "exr_pattern": f"{FOLDER}/{NAME}.%04d.exr",
        "zarr": f"{FOLDER}/{NAME}.zarr",
        "tiles": {"run": 54, "skipped": 72},
        "notes": {
            "person gate: no person found; the tiled passes hold their background": [
                1004, 1005, 1006,
            ],
        },
    }  # fmt: skip
    submit_commands._print_result(result)
    text = narrow.export_text(clear=False)
    assert "tiles run / skipped" in text and "54 / 72" in text
    assert text.count("no person found") == 1
    assert "frames 1004-1006: person gate: no person found" in " ".join(text.split())
