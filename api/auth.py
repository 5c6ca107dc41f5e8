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
    if not ctx.token:
        raise HTTPException(403, DISABLED)
    if credentials is None:
        raise HTTPException(
            401,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(credentials.credentials.encode(), ctx.token.encode()):
        raise HTTPException(403, "wrong bearer token")
