"""Sphinx configuration of the sapiens-vfx documentation site (MyST Markdown).

Build it strictly, as CI does (`make docs`):

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

Every warning fails that build: a broken link or anchor, a cross-reference with no target,
a page left out of every toctree. The reference pages are generated from the code when the
build starts (``_ext/svfx_docs.py``, into ``_generated/``, which git ignores).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS / "_ext"), str(DOCS.parent)]

project = "sapiens-vfx"
author = "sapiens-vfx contributors"
copyright = "sapiens-vfx contributors; Apache-2.0"

extensions = [
    "myst_parser",
    "sphinxcontrib.openapi",
    "svfx_docs",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "_ext", "Thumbs.db", ".DS_Store"]

# MyST: heading anchors for `[text](page.md#a-heading)` links (checked: a missing anchor is a
# warning), tables, definition lists, `{directive}` fences.
myst_heading_anchors = 4
myst_enable_extensions = ["deflist", "colon_fence", "attrs_inline"]
# A link to a file or anchor that does not exist is a warning (and so fails the strict build).
nitpicky = True
suppress_warnings: list[str] = []

html_theme = "alabaster"
html_title = "sapiens-vfx"
html_static_path: list[str] = []
html_theme_options = {"description": "Sapiens2 human-vision passes for VFX plates"}
