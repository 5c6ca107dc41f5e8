"""A JSON request body read with bounds: at most MAX_BODY_BYTES (413 past that, read no
further), UTF-8, nested at most MAX_DEPTH deep (json.loads has no depth bound: 100000 '['
raise RecursionError), and every string in it is text (no control characters or lone
surrogates, which the file system and PostgreSQL refuse with errors of their own)."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import HTTPException, Request

MAX_BODY_BYTES = 2**20
MAX_DEPTH = 32
# api.params.TEXT_PATTERN's characters, and lone surrogates (JSON can escape them)
_NOT_TEXT = re.compile(r"[\x00-\x1f\x7f-\x9f\ufffd\ud800-\udfff]")


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in the JSON ``text``: brackets inside strings (and
    escaped quotes in them) do not count. Linear, no recursion, whatever the input."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def not_text(value: Any, where: str = "body") -> str | None:
    """Where in ``value`` (parsed JSON) a key or string holds something that is not text."""
    if isinstance(value, str):
        return where if _NOT_TEXT.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = not_text(key, f"a key in {where}") or not_text(item, f"{where}.{key}")
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = not_text(item, f"{where}[{index}]")
            if found:
                return found
    return None


async def read_bounded(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit``."""
    too_large = HTTPException(413, f"the body is larger than {limit} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(body: bytes) -> Any:
    """``body`` as JSON; 422 for anything that is not UTF-8 JSON within the depth bound or
    that holds strings which are not text."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(422, "the body is not UTF-8 text: send a JSON ShotSpec") from None
    if nesting_depth(text) > MAX_DEPTH:
        raise HTTPException(422, f"the body nests deeper than {MAX_DEPTH} levels") from None
    try:
        data = json.loads(text)
    except ValueError:  # JSONDecodeError, and numbers past Python's int digit limit
        raise HTTPException(422, "the body is not JSON: send a ShotSpec object") from None
    where = not_text(data)
    if where:
        raise HTTPException(422, f"{where} holds control characters or is not valid text")
    return data
