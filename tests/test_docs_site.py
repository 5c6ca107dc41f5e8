"""The docs site's guards, beyond what `make docs` shows by building it: the README's links
land on files that exist (the README is not part of the Sphinx build), and the strict build
really fails on a page left out of every toctree, a broken link and a missing anchor (a small
site with docs/conf.py and one of each, built as `make docs` builds)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# the strict build of the Makefile's `docs` target
STRICT = ["-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html"]


def test_readme_links_land_on_files() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    assert local, "the README links into docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_readme_points_into_the_docs_site() -> None:
    text = (ROOT / "README.md").read_text()
    for page in ("docs/user/index.md", "docs/operations/index.md", "docs/reference/cli.md"):
        assert f"({page})" in text, f"README does not link {page}"
    assert len(text.splitlines()) <= 250, "the README is a front door; detail goes to docs/"


def test_strict_build_fails_on_orphan_page_broken_link_and_anchor(tmp_path: Path) -> None:
    """docs/conf.py's settings on a small site (the generated reference pages left out: they
    take the build's time, not its strictness): the strict build fails and names each fault."""
    pytest.importorskip("myst_parser")
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(DOCS / "conf.py", docs / "conf.py")
    (docs / "index.md").write_text("# Site\n\n```{toctree}\npage\n```\n")
    (docs / "page.md").write_text(
        "# Page\n\n## A heading\n\n[here](#a-heading), [gone](no-such-page.md) and "
        "[no anchor](index.md#no-such-heading)\n"
    )
    (docs / "orphan.md").write_text("# Orphan\n\nIn no toctree.\n")
    run = subprocess.run(
        [sys.executable, *STRICT, "-D", "extensions=myst_parser", str(docs), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode != 0
    assert "orphan.md: WARNING: document isn't included in any toctree" in run.stderr
    assert "no-such-page.md" in run.stderr
    assert "local id not found in doc 'index': 'no-such-heading'" in run.stderr
    assert "a-heading" not in run.stderr  # an anchor that exists is no warning
