"""Naming templates that say where plates live in a bucket, for example
``{show}/{seq}/{shot}/plates/{plate}/{name}.####.exr``.

Fields in braces match one path component's worth of text (never a ``/``); ``{show}``,
``{seq}`` (or ``{sequence}``) and ``{shot}`` are required, ``{plate}`` (or ``{element}``) names
the plate element when a shot has several. Exactly one frame token: ``####`` or ``@@@@``
(padding = the count; a frame may be longer), ``%04d``, or a lone ``#`` (four digits, as in
fileseq).
Everything else is literal. A key either matches the whole template or is reported as
unmatched: nothing is guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import SvfxError

REQUIRED = ("show", "seq", "shot")
ALIASES = {"sequence": "seq", "element": "plate"}
_TOKEN = re.compile(r"\{(?P<field>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<frame>%0?(?P<pad>\d*)d|#+|@+)")


class TemplateError(SvfxError, ValueError):
    """A template that cannot be used; the message says why."""


@dataclass(frozen=True)
class TemplateMatch:
    fields: dict[str, str]  # canonical names: show, seq, shot, plate, and any others
    frame: int
    pattern: str  # the key with its frame replaced by the template's frame token


@dataclass(frozen=True)
class PlateTemplate:
    text: str
    regex: re.Pattern[str]
    fields: tuple[str, ...]
    frame_token: str

    @classmethod
    def parse(cls, text: str) -> PlateTemplate:
        text = text.strip().strip("/")
        if not text:
            raise TemplateError("the naming template is empty")
        parts: list[str] = []
        fields: list[str] = []
        frame_tokens: list[str] = []
        last = 0
        for token in _TOKEN.finditer(text):
            parts.append(re.escape(text[last : token.start()]))
            last = token.end()
            if token.group("field"):
                name = ALIASES.get(token.group("field"), token.group("field"))
                if name in fields:
                    raise TemplateError(f"template {text!r} names {{{name}}} twice")
                fields.append(name)
                # non-greedy, so '{name}.####.exr' leaves the frame to the frame token
                parts.append(f"(?P<{name}>[^/]+?)")
            else:
                frame_tokens.append(token.group("frame"))
                parts.append(f"(?P<_frame>-?{_digits(token.group('frame'))})")
        parts.append(re.escape(text[last:]))
        if len(frame_tokens) != 1:
            raise TemplateError(
                f"template {text!r} must hold exactly one frame token (####, @@@@ or %04d); "
                f"found {len(frame_tokens)}"
            )
        missing = [f"{{{f}}}" for f in REQUIRED if f not in fields]
        if missing:
            raise TemplateError(f"template {text!r} lacks {', '.join(missing)}")
        return cls(text, re.compile("".join(parts) + r"\Z"), tuple(fields), frame_tokens[0])

    def match(self, key: str) -> TemplateMatch | None:
        found = self.regex.match(key)
        if not found:
            return None
        frame_at = found.span("_frame")
        pattern = key[: frame_at[0]] + self.frame_token + key[frame_at[1] :]
        fields = {name: found.group(name) for name in self.fields}
        return TemplateMatch(fields=fields, frame=int(found.group("_frame")), pattern=pattern)


def _digits(token: str) -> str:
    if token.startswith("%"):
        pad = token[1:-1].lstrip("0")
        return rf"\d{{{int(pad)},}}" if pad else r"\d+"
    if token == "#":  # fileseq: a lone '#' stands for four digits
        return r"\d{4,}"
    return rf"\d{{{len(token)},}}"
