"""The ASGI guards in front of ``suffixmem serve``'s routes, outermost first: the ``Host``
check, the API key, the body limit; and the headers every response carries.

Contract:
- ``HostCheck``: a request whose ``Host`` (without port) is not one of ``allowed`` gets 421
  before anything else runs. A server on loopback allows the loopback names only, so a web page
  on another origin cannot reach it by rebinding its DNS name to 127.0.0.1 (the page runs on
  the attacker's origin, so the browser's same-origin rules do not stop it; only the ``Host``
  header tells).
- ``KeyCheck``: 401 for a ``/v1/`` request without a valid key before anything reads its body.
- ``BodyLimit``: 413 for a body over ``limit`` bytes, by ``Content-Length`` up front, else by
  reading the streamed body first (up to the limit) and handing it on whole.
- ``SecurityHeaders``: every response says not to frame it, not to sniff its type, to send no
  referrer, and (the page) to load scripts and styles from this origin only.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from suffixmem.server.errors import APIError, error_response

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# the page has no inline script or style and loads nothing from elsewhere (static/)
SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy",
     b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
]


def host_of(scope: Scope) -> str:
    """The request's ``Host`` header without its port (brackets of an IPv6 address dropped)."""
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = value.decode("latin-1").strip().lower()
            if host.startswith("["):  # [::1]:8000
                return host[1:host.find("]")] if "]" in host else host
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return ""


class HostCheck:
    """421 for a request whose ``Host`` is not ``allowed`` (module docstring)."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app, self.allowed = app, {h.lower() for h in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and host_of(scope) not in self.allowed:
            await error_response(APIError(
                421, f"this server answers only to the host names {sorted(self.allowed)} "
                "(a page on another origin that reached it through DNS is refused); start it "
                "with --host to serve others", code="misdirected_request"))(scope, receive, send)
            return
        await self.app(scope, receive, send)


class KeyCheck:
    """401 for an ``/v1/`` request without a valid key before anything reads its body: an
    unauthenticated caller learns nothing of the body's rules or size limit (OpenAI's order)."""

    def __init__(self, app: ASGIApp, check: Callable[[Request], str]) -> None:
        self.app, self.check = app, check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            try:
                self.check(Request(scope))
            except APIError as e:
                await error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """413 for request bodies over ``limit`` bytes (module docstring). A streamed body is read
    here first: counted while FastAPI read it, an overrun raised inside its body parser, which
    answered 400 "error parsing the body"."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = error_response(APIError(
            413, f"request body is larger than {self.limit} bytes", param="body",
            code="request_too_large"))
        length = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                length = value
        if length is not None:
            if length.isdigit() and int(length) > self.limit:
                await too_big(scope, receive, send)
                return
            await self.app(scope, receive, send)  # the server holds it to its length
            return
        body, seen = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client left
                await self.app(scope, _replay([msg], receive), send)
                return
            seen += len(msg.get("body", b""))
            if seen > self.limit:
                await too_big(scope, receive, send)
                return
            body.append(msg)
            if not msg.get("more_body", False):
                break
        await self.app(scope, _replay(body, receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that first gives back ``messages`` (a body already read), then the real one
    (a disconnect while the route runs)."""
    pending = list(messages)

    async def again() -> Message:
        return pending.pop(0) if pending else await receive()

    return again


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every response (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
