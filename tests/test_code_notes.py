"""Product code says what a thing is and why; lab notes live in the docs. Checked on the source
so the rule holds by itself: no date (YYYY-MM-DD), no "core-s" figure, no commit hash after
"commit" and no machine name (Xeon, EPYC, H100, H200) in a product module. Measurements, with
their command and machine, go to docs/design/*.md or docs/performance/; the code links there.
The catalog's migrations are generated history and stay aside."""

from __future__ import annotations

import re
from pathlib import Path

from tests.product_code import ROOT, product_files

# What a lab note leaves behind, each with the word the failure names it by.
NOTES = (
    ("date", re.compile(r"\b\d{4}-[01]\d-[0-3]\d\b")),
    ("benchmark figure", re.compile(r"\bcore-s\b", re.IGNORECASE)),
    ("commit hash", re.compile(r"\bcommits?\W{1,3}(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", re.IGNORECASE)),
    ("machine name", re.compile(r"\b(?:Xeon|EPYC|H100|H200)\b", re.IGNORECASE)),
)


def lab_notes(root: Path) -> list[str]:
    """One line per lab note found in product code: ``path:line kind: "match"``."""
    found = []
    for relative in product_files(root):
        lines = (root / relative).read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            for kind, pattern in NOTES:
                for match in pattern.finditer(line):
                    found.append(f'{relative}:{number} {kind}: "{match.group(0)}"')
    return found


def test_product_code_holds_no_lab_notes():
    found = lab_notes(ROOT)
    assert not found, (
        "lab notes in product code (move the figures, with their command and machine, to "
        "docs/design/ and keep what the thing is and why):\n" + "\n".join(found)
    )


def test_the_checker_sees_lab_notes(tmp_path: Path):
    package = tmp_path / "tasks" / "inner"
    package.mkdir(parents=True)
    (package / "noted.py").write_text(
        '"""Blends frames.\n'  # 1
        "\n"
        "Measured 2026-11-27 on a 2-core Xeon: 1.7 core-s a frame (commit 1a8165b).\n"  # 3
        '"""\n'
        "\n"
        "SIDE = 1024  # a real constant stays\n"  # 6
        "# on an H100: see the docs (commit the file first; committed abcdefg)\n"  # 7
    )
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "clean.py").write_text(
        '"""What it is and why (docs/design/allocator.md)."""\n'
        "VERSION = '2.13'  # numbers, hex-free words after commit: commit message\n"
    )
    migrations = tmp_path / "schemas" / "catalog" / "migrations"
    migrations.mkdir(parents=True)
    (migrations / "0001_first.py").write_text('"""Revision 0001, created 2026-11-21."""\n')
    assert lab_notes(tmp_path) == [
        'tasks/inner/noted.py:3 date: "2026-11-27"',
        'tasks/inner/noted.py:3 benchmark figure: "core-s"',
        'tasks/inner/noted.py:3 commit hash: "commit 1a8165b"',
        'tasks/inner/noted.py:3 machine name: "Xeon"',
        'tasks/inner/noted.py:7 machine name: "H100"',
    ]
