"""The templates of cuts in (``svfx submit-edit``): the fields a clip offers, and a template
filled from them, or why not (a field the clip lacks is a problem of that clip, never a guess).
The rules are in ``flows.edit_cuts``."""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from .plate_template import TemplateError

DEFAULT_SHOT_TEMPLATE = "{clip}"
DEFAULT_PLATE_TEMPLATE = "{shot}/plate/{shot}_plate.####.exr"
CLIP_FIELDS = ("clip", "marker", "source", "reel", "index", "track", "show", "seq", "sequence")
PLATE_FIELDS = (*CLIP_FIELDS, "shot")

_MISSING = {
    "clip": "the clip has no name",
    "marker": "the clip has no marker (an EDL * LOC: line) to name its shot",
    "source": "the clip has no source file name",
    "reel": "the clip has no reel name",
    "track": "the clip's track has no name",
    "shot": "the clip has no shot name",
}


def template_fields(template: str, known: tuple[str, ...], option: str) -> list[str]:
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise TemplateError(f"{option} {template!r} is not a valid template: {exc}") from None
    unknown = [f"{{{f}}}" for f in names if f not in known]
    if unknown:
        raise TemplateError(
            f"{option} {template!r} names unknown fields {', '.join(unknown)}; "
            f"known: {', '.join('{' + k + '}' for k in known)}"
        )
    return names


def fill_template(
    template: str, fields: Mapping[str, Any], markers: tuple[str, ...]
) -> tuple[str, str]:
    """(the filled template, "") or ("", why not) when the clip lacks a field it uses (the
    template's fields were checked before any clip was read: ``template_fields``)."""
    for name in template_fields(template, tuple(fields), "template"):
        if fields.get(name) in ("", None):
            if name == "marker" and len(markers) > 1:
                listed = ", ".join(markers)
                return "", f"several markers ({listed}): which names the shot is ambiguous"
            return "", _MISSING.get(name, f"the clip has no {name}")
    try:
        return template.format(**fields).strip(), ""
    except (ValueError, TypeError) as exc:  # e.g. {clip:03d}
        return "", f"template {template!r}: {exc}"
