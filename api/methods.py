"""Methods per path, answered for the whole application rather than route by route: GET and
POST of ``/api/shots`` live on two routers, and Starlette answers OPTIONS or a wrong method
from the first route whose path matches, so it would name only that route's methods; and
FastAPI's routes answer GET but not HEAD."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def methods_on_path(routes: Iterable[BaseRoute], scope: Scope) -> set[str]:
    """Every method of every route whose path matches the request's (empty: unknown path),
    with HEAD wherever GET is, and OPTIONS."""
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches(scope)
            if match is not Match.NONE:
                methods |= route.methods
    if "GET" in methods:
        methods.add("HEAD")
    return methods | {"OPTIONS"} if methods else methods


def _without_body(send: Send) -> Send:
    """``send`` with every body chunk emptied (headers, Content-Length included, kept)."""

    async def send_headers_only(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return send_headers_only


class MethodsPerPath:
    """ASGI middleware over ``routes`` (every route of the application, routers' included:
    FastAPI keeps an included router as one opaque entry of ``app.routes``). On a known path:
    OPTIONS answers 204 with ``Allow`` listing every method; HEAD is answered as GET without
    the body (same status and headers); a method no route takes is 405 with the full
    ``Allow``. Unknown paths go on to the router (404)."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        methods = methods_on_path(self.routes, scope)
        allow = {"Allow": ", ".join(sorted(methods))}
        if not methods or (method in methods and method not in ("HEAD", "OPTIONS")):
            await self.app(scope, receive, send)
        elif method == "OPTIONS":
            await Response(status_code=204, headers=allow)(scope, receive, send)
        elif method == "HEAD":
            await self.app({**scope, "method": "GET"}, receive, _without_body(send))
        else:
            detail = f"{method} is not allowed here; allowed: {allow['Allow']}"
            await JSONResponse({"detail": detail}, 405, headers=allow)(scope, receive, send)
