"""Every refusal has the one documented shape, ``{"detail": "<what was wrong>"}`` (Problem):
FastAPI's own validation errors (a list of dicts) are turned into one readable sentence that
names each bad parameter and why, and errors shown to a caller always carry their reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api.responses import Problem

INVALID: dict[int | str, dict[str, Any]] = {
    422: {"model": Problem, "description": "a parameter is invalid (each one named, and why)"},
}
_PLACES = {"query": "query parameter", "path": "path parameter", "header": "header"}


def _where(loc: Sequence[Any]) -> str:
    """'query parameter limit', 'path parameter job_id', 'body field tiling.overlap'."""
    place, *names = [str(part) for part in loc] or ["request"]
    if place == "body":
        return f"body field {'.'.join(names)}" if names else "body"
    return f"{_PLACES.get(place, place)} {'.'.join(names)}".strip()


def validation_detail(errors: Sequence[Any]) -> str:
    """One line per error: where it is and pydantic's reason (never the input itself)."""
    lines = [f"{_where(e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in errors]
    return "invalid request: " + "; ".join(lines) if lines else "invalid request"


async def validation_problem(request: Request, exc: Exception) -> JSONResponse:
    """Exception handler: a RequestValidationError as a 422 Problem."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return JSONResponse({"detail": validation_detail(errors)}, status_code=422)


def reason(exc: BaseException) -> str:
    """What went wrong, for a message: the exception's text, or its type when it has none
    (``str(TimeoutError())`` is empty and ``str(Exception(None))`` is 'None'), and the cause it
    was raised from when there is one."""
    text = str(exc).strip()
    said = f"{type(exc).__name__}: {text}" if text and text != "None" else type(exc).__name__
    cause = exc.__cause__
    return f"{said} (caused by {reason(cause)})" if cause is not None else said
