"""Bad requests get OpenAI-shaped errors with the right status, through the real server and
the official client; the server's own limits (body size, queue) answer 413 and 429."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.server.conftest import KEY_A, Server, start

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

AUTH = {"Authorization": f"Bearer {KEY_A}"}


def post(server: Server, body: object, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions",
                      content=raw if raw is not None else json.dumps(body).encode(),
                      headers={**AUTH, "Content-Type": "application/json", **(headers or {})},
                      timeout=60)


def error_of(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "\n" not in body["error"]["message"]
    return body["error"]


USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("body", "param", "word"), [
    ({"messages": USER, "temperature": "hot"}, "temperature", "temperature"),
    ({"messages": USER, "temperature": -1}, "temperature", "temperature"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"messages": []}, "messages", "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages", "role"),
    ({"messages": USER, "n": 2}, "n", "n"),
    ({"messages": USER, "stop": [""]}, "stop", "stop"),
    ({"messages": "hello"}, "messages", "messages"),
    ({}, "messages", "messages"),
    ({"messages": USER, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}]}, "tools", "object"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}],
      "response_format": {"type": "json_object"}}, "response_format", "tools"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                 "image_url": {"url": "x"}}]}]},
     "messages[0].content", "text parts"),
    ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format", "schema"),
    # strict types, as OpenAI's: a string or a boolean is no number
    ({"messages": USER, "temperature": "0.5"}, "temperature", "valid number"),
    ({"messages": USER, "temperature": True}, "temperature", "valid number"),
    ({"messages": USER, "max_tokens": "10"}, "max_tokens", "valid integer"),
    ({"messages": USER, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage", "valid boolean"),
    # a union names the field, not pydantic's member tag, and every way the value failed
    ({"messages": USER, "stop": 5}, "stop", "a valid string or a valid list"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "valid string"),
    # what the engines cannot do is refused, never silently dropped
    ({"messages": USER, "logprobs": True}, "logprobs", "not supported"),
    # a call waits for its result (OpenAI refuses it too)
    ({"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages", "tool call without its result"),
    ({"messages": USER, "frequency_penalty": 2.5}, "frequency_penalty", "[-2, 2]"),
    ({"messages": USER, "logit_bias": {"50256": -100}}, "logit_bias", "not supported"),
    ({"messages": USER, "modalities": ["text", "audio"]}, "modalities", "only text"),
    ({"messages": USER, "audio": {"voice": "alloy", "format": "wav"}}, "audio", "only text"),
    ({"messages": USER, "prediction": {"type": "content", "content": "x"}}, "prediction",
     "not supported"),
    # one range on every engine, OpenAI's (vLLM refused 2-5 with its own message, no param)
    ({"messages": USER, "temperature": 3}, "temperature", "[0, 2]"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_input_is_400(server: Server, body: dict, param: str | None, word: str,
                          stream: bool) -> None:
    before = len(server.manager.list_sessions())  # type: ignore[attr-defined]
    err = error_of(post(server, {**body, "stream": stream},
                        {"X-Session-ID": f"bad-{uuid.uuid4().hex[:6]}"}), 400)
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_value"
    if param is not None:
        assert err["param"] == param
    assert word in str(err["message"])
    assert len(server.manager.list_sessions()) == before  # type: ignore[attr-defined]


def test_other_statuses(server: Server) -> None:
    e = error_of(post(server, {"messages": USER}, {"Authorization": "Bearer nope"}), 401)
    assert e["code"] == "invalid_api_key"
    # the key is checked before the body is read: no key, bad JSON or a body too large: 401
    for raw in (b"{not json", json.dumps({"messages": [{"role": "user", "content": "a" * 70_000}]
                                          }).encode()):
        e = error_of(post(server, None, {"Authorization": ""}, raw=raw), 401)
        assert e["code"] == "invalid_api_key"
    error_of(httpx.get(server.url + "/v1/models"), 401)
    e = error_of(post(server, {"model": "gpt-4o", "messages": USER}), 404)
    assert e["param"] == "model" and e["code"] == "model_not_found"
    e = error_of(httpx.get(server.url + "/v1/sessions/nobody-here", headers=AUTH), 404)
    assert e["code"] == "session_not_found"
    e = error_of(post(server, {"messages": USER}, {"X-Session-ID": "x" * 300}), 400)
    assert e["param"] == "X-Session-ID"
    # the key's hidden namespace shares the 128 characters: the limit says so, naming the field
    e = error_of(post(server, {"messages": USER}, {"X-Session-ID": "x" * 120}), 400)
    assert e["param"] == "X-Session-ID" and "limit with an API key is 110" in str(e["message"])
    big = {"messages": [{"role": "user", "content": "a" * 70_000}]}
    assert error_of(post(server, big), 413)["code"] == "request_too_large"
    # the same body streamed without Content-Length (chunked): 413 too, not 400 "error
    # parsing the body" (the overrun was raised inside FastAPI's body parser); a small one
    # streamed so reaches the route whole
    raw = json.dumps(big).encode()
    chunked = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                         content=iter([raw[i:i + 8192] for i in range(0, len(raw), 8192)]),
                         headers={**AUTH, "Content-Type": "application/json"})
    assert "content-length" not in chunked.request.headers
    assert error_of(chunked, 413)["code"] == "request_too_large"
    small = json.dumps({"messages": USER, "max_tokens": 2}).encode()
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   content=iter([small[:10], small[10:]]),
                   headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    # every response says not to frame or sniff it; no schema route (it needed no key)
    for header in ("x-frame-options", "x-content-type-options", "content-security-policy"):
        assert header in r.headers, header
    assert httpx.get(server.url + "/openapi.json").status_code == 404
    e = error_of(post(server, {"messages": USER}, {"X-Session-ID": ".."}), 400)
    assert e["param"] == "X-Session-ID" and "no URL can name" in str(e["message"])
    e = error_of(post(server, None, raw=b"{not json"), 400)
    assert e["message"].startswith("the request body is not valid JSON") and e["param"] is None
    # curl -d without -H 'Content-Type: application/json' (the README's example did that)
    e = error_of(post(server, None, {"Content-Type": "application/x-www-form-urlencoded"},
                      raw=json.dumps({"messages": USER}).encode()), 400)
    assert "Content-Type: application/json" in str(e["message"]), e
    assert "x-www-form-urlencoded" in str(e["message"]) and e["param"] is None
    e = error_of(post(server, None, raw=b'{"messages": "\xff"}'), 400)  # not UTF-8
    assert e["code"] == "invalid_value" and str(e["message"]).startswith("request body: ")
    e = error_of(post(server, {"messages": USER, "stream": "yes"}), 400)
    assert e["param"] == "stream"
    e = error_of(httpx.get(server.url + "/v1/nothing", headers=AUTH), 404)
    assert (e["type"], e["code"]) == ("invalid_request_error", "unknown_url")
    # the legacy function fields are refused, not dropped; a tool_choice needs tools, except
    # "auto"/"none", which are no-ops without them; tools must be OpenAI function tools
    for field, value, says in (("tool_choice", "required", "needs tools"),
                               ("functions", [{"name": "f"}], "use tools"),
                               ("function_call", "auto", "use tools"),
                               ("tools", [{"type": "function"}], "not an OpenAI function tool")):
        e = error_of(post(server, {"messages": USER, field: value}), 400)
        assert e["param"] == field and says in str(e["message"]), e
    e = error_of(post(server, {"messages": USER, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}}}], "tool_choice": "g"}), 400)
    assert e["param"] == "tool_choice", e
    e = error_of(post(server, {"messages": [
        {"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "mul", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "user", "content": "ok"}]}), 400)
    assert e["param"] == "messages[1].tool_calls", e
    # the default penalties change nothing, so they are accepted
    ok = post(server, {"messages": USER, "max_tokens": 1, "presence_penalty": 0,
                       "frequency_penalty": 0.0, "logprobs": False, "tool_choice": "auto"})
    assert ok.status_code == 200, ok.text


def test_an_unknown_session_keeps_the_connection(server: Server) -> None:
    """A 404 for an unknown session is an answer, not a crash: the same keep-alive connection
    serves the next request (the catch-all handler re-raised it, and the server dropped the
    connection under the client)."""
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as h:
        for method in ("GET", "DELETE"):
            err = error_of(h.request(method, "/v1/sessions/nobody-here"), 404)
            assert err["code"] == "session_not_found"
            assert h.get("/health").status_code == 200


def test_openai_client_raises_typed_errors(server: Server) -> None:
    c = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_A, max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=server.model, messages=USER, temperature=7)
    assert e.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong",
                      max_retries=0).models.list()


def test_queue_full_is_429(server: Server) -> None:
    """With room for one request, a second one while the first streams is refused at once."""
    from suffixmem.server import ServerConfig, create_app

    app = create_app(server.manager, ServerConfig(max_pending=1))  # type: ignore[arg-type]
    uv, thread, url = start(app)
    try:
        long = {"messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": 200, "ignore_eos": True, "stream": True, "temperature": 0}
        with httpx.stream("POST", url + "/v1/chat/completions", json=long, timeout=60) as r:
            assert r.status_code == 200
            r2 = httpx.post(url + "/v1/chat/completions", json={"messages": USER}, timeout=60)
            e = error_of(r2, 429)
            assert e["code"] == "queue_full" and r2.headers["retry-after"] == "1"
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert app.state.service.pending == 0
        ok = httpx.post(url + "/v1/chat/completions",
                        json={"messages": USER, "max_tokens": 4}, timeout=60)
        assert ok.status_code == 200, ok.text
    finally:
        uv.should_exit = True  # type: ignore[attr-defined]
        thread.join(30)


def test_a_resent_agent_history_keeps_its_tool_calls(server: Server) -> None:
    """An OpenAI-style agent history (an assistant's ``tool_calls``, a ``tool`` result naming
    its call by id) is stored as the adapters render it: the call and the named result, where
    the calls were dropped (an empty assistant message) and the result was bare."""
    sid = "agent-history"
    history = [
        {"role": "user", "content": "What is 6*7?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "mul", "arguments": '{"a": 6, "b": 7}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "user", "content": "Say the result."}]
    r = post(server, {"messages": history, "max_tokens": 4, "temperature": 0},
             {"X-Session-ID": sid})
    assert r.status_code == 200, r.text
    stored = httpx.get(f"{server.url}/v1/sessions/{sid}", headers=AUTH).json()["messages"]
    assert [(m["role"], m["content"]) for m in stored[:3]] == [
        ("user", "What is 6*7?"),
        ("assistant", '{"arguments": {"a": 6, "b": 7}, "name": "mul"}'),
        ("tool", '{"tool": "mul", "result": "42"}')]


@pytest.mark.parametrize("stream", [False, True])
def test_any_session_id_is_echoed_stored_once_and_reachable(server: Server, stream: bool) -> None:
    """A ``prompt_cache_key`` a header cannot carry (``é``, ``日本語``, an emoji) or one with a
    "/": the turn answers 200 and is stored once, the echoed ``X-Session-ID`` is
    percent-encoded, the request's slot is given back, and the session can be read and
    deleted. (The echo failed after the turn: a 400 for a stored turn, and a streamed one kept
    its slot for good, so ``--max-pending`` of them answered every client 429.)"""
    from urllib.parse import quote, unquote

    for key in (f"café ☕ 日本語 {stream}", f"team/a/{stream}"):
        r = post(server, {"messages": USER, "max_tokens": 2, "stream": stream,
                          "prompt_cache_key": key})
        assert r.status_code == 200, r.text
        assert unquote(r.headers["X-Session-ID"]) == key
        assert r.headers["X-Session-ID"].isascii()
        sid = quote(key, safe="")
        got = httpx.get(f"{server.url}/v1/sessions/{sid}", headers=AUTH)
        assert got.status_code == 200, got.text
        assert [m["role"] for m in got.json()["messages"]] == ["user", "assistant"]
        assert httpx.delete(f"{server.url}/v1/sessions/{sid}", headers=AUTH).status_code == 200
    assert httpx.get(server.url + "/health").json()["pending"] == 0


def test_user_names_no_session_and_an_empty_system_message_reads_as_none(server: Server
                                                                         ) -> None:
    """OpenAI's ``user`` is one end user's id across all their conversations: it names no
    session (a new conversation continued the last one). An empty system message is no
    system message, as OpenAI reads it."""
    before = len(server.manager.list_sessions())  # type: ignore[attr-defined]
    for text in ("My code is 4417.", "Hello, who are you?"):
        r = post(server, {"messages": [{"role": "user", "content": text}], "max_tokens": 2,
                          "user": "end-user-7"})
        assert r.status_code == 200, r.text
        assert r.json()["suffixmem"]["history"] == "stateless"
        assert "X-Session-ID" not in r.headers
    assert len(server.manager.list_sessions()) == before  # type: ignore[attr-defined]
    r = post(server, {"messages": [{"role": "system", "content": ""}, *USER], "max_tokens": 2})
    assert r.status_code == 200, r.text



def test_a_stream_whose_client_left_before_its_first_line_gives_its_slot_back(
        server: Server) -> None:
    """The client is gone before the response's first line: the SSE lines are never iterated,
    so their own ``finally`` never runs; the response releases the request's slot and aborts
    the turn anyway, and the session's next request works and finds nothing stored."""
    import asyncio

    from suffixmem.server.app import ReleasingStream
    from suffixmem.server.protocol import ChatCompletionRequest
    from suffixmem.server.serving import namespace

    service = server.app.state.service  # type: ignore[attr-defined]
    cid = f"gone-{uuid.uuid4().hex[:6]}"
    sid = service.session_id(namespace(KEY_A), cid, "X-Session-ID")
    req = ChatCompletionRequest.model_validate(
        {"messages": USER, "stream": True, "max_tokens": 4})

    async def gone(_: object) -> None:
        raise OSError("the client went away")

    async def disconnect() -> dict[str, str]:
        return {"type": "http.disconnect"}

    async def run() -> None:
        lines, release = await service.stream(req, sid, cid)
        response = ReleasingStream(lines, release, media_type="text/event-stream")
        with pytest.raises(Exception):  # noqa: B017 - Starlette's ClientDisconnect
            await response({"type": "http", "asgi": {"spec_version": "2.4"}}, disconnect, gone)

    asyncio.run(run())
    assert httpx.get(server.url + "/health").json()["pending"] == 0
    r = post(server, {"messages": USER, "max_tokens": 2}, {"X-Session-ID": cid})
    assert r.status_code == 200, r.text
    assert r.json()["suffixmem"]["history"] == "new"  # the abandoned turn stored nothing
