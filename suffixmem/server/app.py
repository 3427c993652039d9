"""The FastAPI application of ``suffixmem serve``: routes, auth, limits and the error handler.

Routes only translate HTTP to ``ChatService`` calls. Every error, ours or FastAPI's, leaves
through one handler in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
The web chat page is served from the package's ``static/`` folder at ``/``.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from importlib.resources import files
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from suffixmem.conversation.manager import ConversationManager
from suffixmem.errors import SuffixmemError
from suffixmem.server.errors import (
    APIError,
    error_response,
    invalid_value,
    to_api_error,
    validation_error,
)
from suffixmem.server.guards import BodyLimit, HostCheck, KeyCheck, SecurityHeaders
from suffixmem.server.protocol import ChatCompletionRequest
from suffixmem.server.serving import SESSION_HEADER, ChatService, ServerConfig, namespace

STATIC = files("suffixmem.server") / "static"
# what a session id echoed in a header keeps as is: printable ASCII but the space and "%"
HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


class ReleasingStream(StreamingResponse):
    """A stream that awaits ``release`` when it ends, however it ends: a client gone before
    the first line leaves the lines never iterated, and their own ``finally`` never runs."""

    def __init__(self, content: Any, release: Callable[[], Awaitable[None]], **kw: Any) -> None:
        super().__init__(content, **kw)
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.release()


def create_app(manager: ConversationManager, config: ServerConfig | None = None) -> FastAPI:
    """The server's ASGI app over ``manager`` (whose engine and database the caller owns)."""
    service = ChatService(manager, config)
    keys = service.config.api_keys
    # no schema route either: every route but /health and the page needs the key (docs)
    app = FastAPI(title="suffixmem", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service

    def ns_of(request: Request) -> str:
        """The caller's session namespace; 401 without a valid key when keys are required."""
        if not keys:
            return ""
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            for k in keys:
                if hmac.compare_digest(k.encode(), token.encode()):
                    return namespace(k)
        raise APIError(401, "missing or invalid API key (Authorization: Bearer KEY)",
                       type="authentication_error", code="invalid_api_key")

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc.errors(),
                                               request.headers.get("content-type")))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # OpenAI answers an unknown route with an invalid_request_error too
        if exc.status_code == 404:
            return error_response(APIError(
                404, f"no route {request.method} {request.url.path}", code="unknown_url"))
        if exc.status_code == 400:  # FastAPI could not read the body (not UTF-8, say)
            return error_response(invalid_value(f"request body: {exc.detail}", None))
        return error_response(APIError(exc.status_code, str(exc.detail)))

    async def _mapped(_: Request, exc: Exception) -> JSONResponse:
        return error_response(to_api_error(exc))

    # the library's errors (an unknown session, a busy one, bad input) are answers, not
    # crashes: a handler per class runs inside Starlette's exception middleware and the
    # connection stays open. The catch-all below runs in its server-error middleware, which
    # re-raises after answering, so a keep-alive client would lose its connection.
    for expected in (SuffixmemError, ValueError):
        app.add_exception_handler(expected, _mapped)

    @app.exception_handler(Exception)
    async def _other(_: Request, exc: Exception) -> JSONResponse:
        return error_response(to_api_error(exc))

    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any] | JSONResponse:
        state = service.health()
        if state["status"] == "ok":
            return state
        return JSONResponse(state, status_code=503, headers={"Retry-After": "1"})

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        ns_of(request)
        return service.models().model_dump()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest, request: Request,
        x_session_id: str | None = Header(default=None, alias=SESSION_HEADER),
    ) -> Response:
        ns = ns_of(request)
        if x_session_id is not None:
            client_id, field = x_session_id, SESSION_HEADER
        else:  # ``user`` (one per end user, not per conversation) names no session
            client_id, field = body.prompt_cache_key, "prompt_cache_key"
        sid = service.session_id(ns, client_id, field)
        # an HTTP header carries Latin-1 only: the echo is percent-encoded (UTF-8) where the id
        # holds more, and built before the turn, so it cannot fail after the turn was stored
        headers = {SESSION_HEADER: quote(client_id, safe=HEADER_SAFE)} if client_id else {}
        if body.stream:
            lines, release = await service.stream(body, sid, client_id, ns)
            return ReleasingStream(lines, release, media_type="text/event-stream",
                                   headers={"Cache-Control": "no-cache", **headers})
        result = await service.complete(body, sid, client_id, request.is_disconnected, ns)
        if result is None:  # the client left; nginx's 499, for the access log only
            return Response(status_code=499)
        return JSONResponse(result.model_dump(exclude_none=True), headers=headers)

    @app.get("/v1/sessions")
    async def list_sessions(request: Request) -> dict[str, Any]:
        return await service.list_sessions(ns_of(request))

    # ``:path``: an id may hold a "/" (sent as %2F), as a header or prompt_cache_key may
    @app.get("/v1/sessions/{session_id:path}")
    async def get_session(session_id: str, request: Request) -> dict[str, Any]:
        return await service.get_session(ns_of(request), session_id)

    @app.delete("/v1/sessions/{session_id:path}")
    async def delete_session(session_id: str, request: Request) -> dict[str, Any]:
        return await service.delete_session(ns_of(request), session_id)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"))

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    app.add_middleware(BodyLimit, limit=service.config.max_body_bytes)
    if keys:
        app.add_middleware(KeyCheck, check=ns_of)
    app.add_middleware(SecurityHeaders)
    if service.config.allowed_hosts is not None:  # added last, so it runs first
        app.add_middleware(HostCheck, allowed=service.config.allowed_hosts)
    return app
