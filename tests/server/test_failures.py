"""Failures after streaming began, and the status of every library error.

A failing engine here is the real vLLM engine wrapped so that its stream raises after two
tokens (fault injection; everything else is the real engine and manager)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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
from suffixmem.server.errors import to_api_error
from tests.server.conftest import start


@pytest.mark.parametrize(("exc", "status", "code"), [
    (UnknownSessionError("s"), 404, "session_not_found"),
    (ContextWindowError(5000, 4096), 400, "context_length_exceeded"),
    (InvalidRequestError("temperature must be in [0, 2], got 9"), 400, "invalid_value"),
    (SessionBusyError("busy"), 409, "session_busy"),
    (CapacityError("full"), 503, "unavailable"),
    (EngineClosedError("closed"), 503, "unavailable"),
    (StoreError("db down"), 503, "unavailable"),
    (UpstreamError("every replica is down"), 503, "unavailable"),  # was a 500 and a traceback
    (RuntimeError("secret internals"), 500, "internal_error"),
])
def test_error_mapping(exc: Exception, status: int, code: str) -> None:
    err = to_api_error(exc)
    assert (err.status, err.body.code) == (status, code)
    assert "secret" not in err.body.message  # a 500 never leaks the exception text
    if status == 503:
        assert err.headers == {"Retry-After": "1"}


def test_a_session_id_is_shown_without_its_keys_namespace() -> None:
    from suffixmem.server.serving import namespace

    err = to_api_error(UnknownSessionError(namespace("sk-a") + "other"))
    assert err.body.message == "unknown session 'other'"


class FailingEngine:
    """The real engine whose ``stream`` raises CapacityError after two tokens."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def stream(self, request: Any) -> Iterator[Any]:
        events = self._engine.stream(request)
        try:
            for n, e in enumerate(events):
                if n == 2:
                    raise CapacityError("KV cache exhausted (injected)")
                yield e
        finally:
            events.close()


@pytest.mark.slow
@pytest.mark.vllm
def test_mid_stream_failure_sends_error_event_and_stores_nothing(
        vllm_engine: Any, tmp_path: Path) -> None:
    from suffixmem.conversation.manager import ConversationManager
    from suffixmem.server import create_app

    mgr = ConversationManager(FailingEngine(vllm_engine),  # type: ignore[arg-type]
                              database_url=f"sqlite:///{tmp_path / 'f.db'}")
    app = create_app(mgr)
    uv, thread, url = start(app)
    try:
        sid = f"fail-{uuid.uuid4().hex[:6]}"
        body = {"messages": [{"role": "user", "content": "Tell me a story."}],
                "max_tokens": 50, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60,
                          headers={"X-Session-ID": sid}) as r:
            assert r.status_code == 200
            data = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert data[-1] == "[DONE]"
        events = [json.loads(d) for d in data[:-1]]
        assert "error" in events[-1] and events[-1]["error"]["code"] == "unavailable"
        assert any(c["choices"] and c["choices"][0]["delta"].get("content")
                   for c in events[:-1])  # it failed after streaming began
        assert not any(c.get("choices") and c["choices"][0].get("finish_reason")
                       for c in events[:-1])
        assert mgr.list_sessions() == []
        assert app.state.service.pending == 0
    finally:
        uv.should_exit = True  # type: ignore[attr-defined]
        thread.join(30)
        mgr.close()
