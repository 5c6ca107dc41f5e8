"""``--shot-pattern``: the shot ID pulled out of one field of a clip by a regular expression
with a named group ``shot`` (cuts in; the rules are in ``flows.edit_cuts``).

Editors name clips ``ZZ100_501 (LAY3)``: the shot ID plus a take. The pattern is written
``FIELD:REGEX`` (``clip:(?P<shot>[A-Z]+\\d+_\\d+)``) because a regex only means something
against the text it was written for; the field is required, so a regex that itself holds a
colon (``(?:...)``) is never mistaken for one. The regex is searched for (``re.search``), so
the take around the ID needs no pattern of its own; anchor it with ``^``/``$`` to be strict.
A clip it does not match has no shot name: nothing is guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import SvfxError

# the fields a pattern may read, and what each is in the cut (docs/user/cuts.md)
PATTERN_FIELDS = {
    "clip": "its name",
    "source": "its source file name",
    "marker": "its markers",
    "reel": "its reel",
}


class ShotPatternError(SvfxError, ValueError):
    """A ``--shot-pattern`` that cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class ShotPattern:
    """A regular expression with a group ``shot``, and the clip field it reads."""

    field: str
    regex: re.Pattern[str]

    @property
    def text(self) -> str:
        return f"{self.field}:{self.regex.pattern}"

    @property
    def groups(self) -> tuple[str, ...]:
        """The named groups, each a field the shot template may use."""
        return tuple(self.regex.groupindex)

    def extract(self, values: tuple[str, ...]) -> tuple[dict[str, str], str]:
        """(the named groups of the one match, "") or ({}, why not), searching each of the
        field's values (a clip has several markers)."""
        if not values:
            return {}, f"the clip has no {self.field} for --shot-pattern {self.text}"
        found = {}
        for value in values:
            match = self.regex.search(value)
            if match and match.group("shot"):
                groups = {k: v or "" for k, v in match.groupdict().items()}
                found.setdefault(groups["shot"], groups)
        if not found:
            said = ", ".join(repr(v) for v in values)
            return (
                {},
                f"--shot-pattern {self.text} does not match {PATTERN_FIELDS[self.field]} {said}",
            )
        if len(found) > 1:
            shots = ", ".join(found)
            return {}, f"--shot-pattern {self.text} finds several shots ({shots}): ambiguous"
        return next(iter(found.values())), ""


def parse_shot_pattern(text: str) -> ShotPattern:
    """The pattern ``FIELD:REGEX``; ShotPatternError naming it when it cannot be used."""
    field, colon, pattern = text.partition(":")
    if not colon or field not in PATTERN_FIELDS:
        known = ", ".join(f"{f}:" for f in PATTERN_FIELDS)
        raise ShotPatternError(
            f"--shot-pattern '{text}' must start with the field it reads ({known}), "
            "e.g. 'clip:(?P<shot>[A-Z]+\\d+_\\d+)'"
        )
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ShotPatternError(
            f"--shot-pattern '{text}' is not a valid regular expression: {exc}"
        ) from None
    if "shot" not in regex.groupindex:
        raise ShotPatternError(
            f"--shot-pattern '{text}' has no group named shot: write (?P<shot>...) around "
            "the shot ID"
        )
    return ShotPattern(field, regex)
