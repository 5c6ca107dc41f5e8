"""The write endpoints' guard: ``Authorization: Bearer <token>`` against SVFX_API_TOKEN.

No token configured: every write is refused (403) with how to enable them. A missing token is
401, a wrong one 403; tokens are compared in constant time."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.context import ApiContext, context

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="the server's SVFX_API_TOKEN, as 'Authorization: Bearer <token>'",
)

DISABLED = (
    "write endpoints are disabled: set SVFX_API_TOKEN (or api_token in svfx.toml) where the "
    "API server runs, restart it, and send 'Authorization: Bearer <token>'"
)


def require_writer(
    ctx: Annotated[ApiContext, Depends(context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """FastAPI dependency: passes only a request that carries the configured token."""
    check_token(ctx, None if credentials is None else credentials.credentials)


def check_token(ctx: ApiContext, token: str | None) -> None:
    """HTTPException unless ``token`` is the configured one (401 missing, 403 wrong or writes
    disabled), for the bearer header and for the pages' forms alike."""
    if not ctx.token:
        raise HTTPException(403, DISABLED)
    if not token:
        raise HTTPException(
            401,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(token.encode(), ctx.token.encode()):
        raise HTTPException(403, "wrong bearer token")
