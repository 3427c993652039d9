"""Errors of ``suffixmem serve`` in OpenAI's shape, and the one mapping from suffixmem's own
exceptions onto HTTP statuses (docs/server.md has the table)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse

from suffixmem.conversation.locks import SessionBusyError
from suffixmem.engine.routing import UpstreamError
from suffixmem.errors import (
    CapacityError,
    ContextWindowError,
    EngineClosedError,
    InvalidRequestError,
    StoreError,
    UnknownSessionError,
)
from suffixmem.server.protocol import ChatCompletionRequest, ErrorBody, ErrorResponse

log = logging.getLogger(__name__)


class APIError(Exception):
    """An error with its HTTP status, in OpenAI's shape."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message=message, type=type, param=param, code=code)
        self.headers = headers or {}


def invalid_value(message: str, param: str | None) -> APIError:
    """The 400 for bad input (OpenAI's ``invalid_request_error`` with code ``invalid_value``),
    so that no check forgets the code."""
    return APIError(400, message, param=param, code="invalid_value")


def to_api_error(exc: BaseException) -> APIError:
    """Map any exception onto an ``APIError``: suffixmem's own errors to 4xx/503, anything
    else to 500 (logged; never the outcome of bad input, which the library rejects first)."""
    if isinstance(exc, APIError):
        return exc
    # a session id is shown as its client sent it, without the key's namespace prefix
    msg = _NAMESPACE.sub("", " ".join(str(exc).split()))
    if isinstance(exc, UnknownSessionError):
        return APIError(404, msg, param="session", code="session_not_found")
    if isinstance(exc, ContextWindowError):
        return APIError(400, msg, param="messages", code="context_length_exceeded")
    if isinstance(exc, SessionBusyError):
        return APIError(409, msg, type="conflict_error", code="session_busy")
    if isinstance(exc, CapacityError | EngineClosedError | StoreError | UpstreamError):
        return APIError(503, msg, type="server_error", code="unavailable",
                        headers={"Retry-After": "1"})
    if isinstance(exc, InvalidRequestError | ValueError):
        return invalid_value(msg, _param_of(msg))
    log.error("internal error", exc_info=exc)
    return APIError(500, "internal server error", type="server_error", code="internal_error")


_NAMESPACE = re.compile(r"(?<=')k[0-9a-f]{16}\.")  # serving.namespace(key), inside quotes


def _param_of(message: str) -> str | None:
    """The request field a library error names: its first word when that is a field
    (``stop[0] is empty`` -> ``stop``), else ``messages`` when it is about a message."""
    m = re.match(r"([a-z_]+)", message)
    if m and m.group(1) in ChatCompletionRequest.model_fields:
        return m.group(1)
    return "messages" if re.search(r"\bmessages?\b|\brole\b", message) else None


# pydantic names the union member that failed in an error's location ("str",
# "list[ContentPart]"); OpenAI's params name fields only
_MEMBER_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _field(loc: Sequence[Any]) -> str | None:
    """An error location as OpenAI writes a param: ``messages[0].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "body" and part not in _MEMBER_TAGS and "[" not in part:
            out += f".{part}" if out else part
    return out or None


def validation_error(errors: Sequence[Mapping[str, Any]],
                     content_type: str | None = None) -> APIError:
    """One 400 for FastAPI's validation errors: the first error's field, and every way its
    value failed (a union reports one error per member: "stop: Input should be a valid string
    or a valid list"). A body that is not JSON says so, without pydantic's location, and a body
    that was not sent as JSON (``curl -d`` without a Content-Type) names the header."""
    if not errors:
        return invalid_value("invalid request body", None)
    first = errors[0]
    if tuple(first.get("loc", ())) == ("body",) and "json" not in (content_type or ""):
        return invalid_value("the request body must be JSON, sent with 'Content-Type: "
                             f"application/json' (it came as {content_type or 'no type'})", None)
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error")
        return invalid_value("the request body is not valid JSON"
                             + (f" ({detail})" if detail else ""), None)
    param = _field(first.get("loc", ()))
    wants = list(dict.fromkeys(str(e.get("msg", "invalid value")) for e in errors
                               if _field(e.get("loc", ())) == param))
    said = wants[0] + "".join(f" or {w.removeprefix('Input should be ')}" for w in wants[1:])
    return invalid_value(f"{param or 'body'}: {said}", param)


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=err.body).model_dump(), status_code=err.status,
                        headers=err.headers)
