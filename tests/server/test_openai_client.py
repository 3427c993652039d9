"""The official ``openai`` client against ``suffixmem serve``: sync, async and streaming, with
cached tokens rising within a session, both history styles, and stateless requests."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

from suffixmem.server.serving import namespace
from suffixmem.tool_calls import parse_reply
from tests.server.conftest import KEY_A, Server

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SYSTEM = "You are a terse assistant. Answer in one short sentence."


def client(server: Server, key: str = KEY_A) -> object:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def test_models_and_health(server: Server) -> None:
    models = client(server).models.list()  # type: ignore[attr-defined]
    assert [m.id for m in models.data] == [server.model]
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["model"] == server.model
    # the pool's use, for an operator sizing it (no key needed: aggregate figures only)
    kv = health["kv"]
    assert 0 <= kv["used_bytes"] <= kv["capacity_bytes"] and kv["capacity_bytes"] > 0
    assert 0 <= kv["hit_rate"] <= 1


def test_sync_full_history_cached_tokens_rise(server: Server) -> None:
    """OpenAI style: the client resends the whole conversation; the server appends it to the
    stored session and the shared prefix is served from the cache."""
    c = client(server)
    sid = f"sync-{uuid.uuid4().hex[:8]}"
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Name a planet of the solar system."}]
    cached, prompts = [], []
    for question in ("And a moon of that planet?", "How far is it from the Sun?"):
        r = c.chat.completions.create(  # type: ignore[attr-defined]
            model=server.model, messages=msgs, max_tokens=12, temperature=0,
            extra_headers={"X-Session-ID": sid})
        assert r.choices[0].message.content
        assert r.usage.prompt_tokens_details is not None
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        prompts.append(r.usage.prompt_tokens)
        assert 0 < r.usage.completion_tokens <= 12
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": question}]
    assert prompts[1] > prompts[0]
    assert cached[1] > cached[0] and cached[1] >= 32
    stored = server.manager.history(namespace(KEY_A) + sid)  # type: ignore[attr-defined]
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]


def test_streaming_new_message_only_with_usage(server: Server) -> None:
    """The client sends only the new message (``prompt_cache_key`` names the session); the
    server keeps the history; usage arrives in a final chunk with no choices."""
    c = client(server)
    key = f"stream-{uuid.uuid4().hex[:8]}"
    cached, texts = [], []
    for text in ("Tell me a fact about cats.", "And one about dogs?", "Which is bigger?"):
        stream = c.chat.completions.create(  # type: ignore[attr-defined]
            model=server.model, messages=[{"role": "user", "content": text}],
            max_tokens=16, temperature=0, stream=True, prompt_cache_key=key,
            stream_options={"include_usage": True})
        chunks = list(stream)
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert len({ch.created for ch in chunks}) == 1  # one timestamp per stream, as OpenAI
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert content
        assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks)
        texts.append(content)
        cached.append(chunks[-1].usage.prompt_tokens_details.cached_tokens)
    assert cached[0] < cached[1] < cached[2]
    r = httpx.get(f"{server.url}/v1/sessions/{key}",
                                headers={"Authorization": f"Bearer {KEY_A}"}).json()
    assert [m["content"] for m in r["messages"] if m["role"] == "assistant"] == texts
    assert [t["cached_tokens"] for t in r["turns"]] == cached
    assert r["usage"]["turns"] == 3


def test_text_parts_and_stream_options_as_vllm_reads_them(server: Server) -> None:
    """Text parts of one message are joined by a newline, as vLLM's server joins them (they
    ran together: "Name a" + "planet." read "Name aplanet."); ``stream_options`` without
    ``stream`` is a 400, as OpenAI and vLLM answer it (it was silently meaningless)."""
    c = client(server)
    key = f"parts-{uuid.uuid4().hex[:8]}"
    c.chat.completions.create(  # type: ignore[attr-defined]
        model=server.model, max_tokens=2, temperature=0, prompt_cache_key=key,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Name a"},
                                               {"type": "text", "text": "planet."}]}])
    r = httpx.get(f"{server.url}/v1/sessions/{key}",
                  headers={"Authorization": f"Bearer {KEY_A}"}).json()
    assert r["messages"][0]["content"] == "Name a\nplanet."
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(  # type: ignore[attr-defined]
            model=server.model, max_tokens=2, messages=[{"role": "user", "content": "Hi"}],
            stream_options={"include_usage": True})
    assert bad.value.body["param"] == "stream_options"  # type: ignore[index]


def test_async_client_and_stateless(server: Server) -> None:
    async def run() -> tuple[list[int], int]:
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY_A, max_retries=0)
        sid = f"async-{uuid.uuid4().hex[:8]}"
        cached = []
        for text in ("Say hello.", "Say goodbye."):
            r = await c.chat.completions.create(
                model=server.model, messages=[{"role": "user", "content": text}],
                max_tokens=8, temperature=0, extra_body={"prompt_cache_key": sid})
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
        # two sessions at once stream independently
        a, b = await asyncio.gather(*(c.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": f"Count to {n}."}],
            max_tokens=8, temperature=0) for n in (3, 4)))
        assert a.choices[0].message.content and b.choices[0].message.content
        await c.close()
        return cached, len(server.manager.list_sessions())  # type: ignore[attr-defined]

    before = len(server.manager.list_sessions())  # type: ignore[attr-defined]
    cached, after = asyncio.run(run())
    assert cached[1] > cached[0]
    assert after == before + 1  # the stateless requests stored no session


MUL = {"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def test_tool_calls_round_trip_with_the_cache(server: Server) -> None:
    """OpenAI tool calling over HTTP: a forced call comes back as ``tool_calls`` whose
    arguments follow the tool's schema; the client resends the call and its result, which
    continue the stored session (the call re-serialised still matches the generated reply)
    from the cache; streamed, the call arrives as one ``tool_calls`` delta."""
    c = client(server)
    sid = f"tools-{uuid.uuid4().hex[:8]}"
    msgs: list[dict[str, object]] = [{"role": "user", "content": "What is 6 times 7?"}]
    r = c.chat.completions.create(  # type: ignore[attr-defined]
        model=server.model, messages=msgs, tools=[MUL], tool_choice="required",
        max_tokens=40, temperature=0, extra_headers={"X-Session-ID": sid})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "multiply"
    args = json.loads(call.function.arguments)
    assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
    msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    r2 = c.chat.completions.create(  # type: ignore[attr-defined]
        model=server.model, messages=msgs, tools=[MUL], tool_choice="none", max_tokens=12,
        temperature=0, extra_headers={"X-Session-ID": sid})
    assert r2.choices[0].message.content and not r2.choices[0].message.tool_calls
    assert r2.choices[0].finish_reason in ("stop", "length")  # "none": an answer, no call
    assert not r2.choices[0].message.content.lstrip().startswith("{")  # text, not the JSON
    assert r2.model_extra["suffixmem"]["history"] == "appended"
    assert r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 32
    stream = c.chat.completions.create(  # type: ignore[attr-defined]
        model=server.model, messages=[{"role": "user", "content": "Multiply 3 by 5."}],
        tools=[MUL], tool_choice={"type": "function", "function": {"name": "multiply"}},
        max_tokens=40, temperature=0, stream=True)
    deltas = [ch.choices[0] for ch in stream if ch.choices]
    assert all(d.delta.content is None for d in deltas)  # a call carries no text, not even ""
    calls = [d.delta.tool_calls for d in deltas if d.delta.tool_calls]
    assert len(calls) == 1 and calls[0][0].function.name == "multiply"
    assert json.loads(calls[0][0].function.arguments).keys() == {"a", "b"}
    assert deltas[-1].finish_reason == "tool_calls"


def test_a_plain_answer_under_tools_streams_as_it_is_generated(server: Server) -> None:
    """Under tools the reply is JSON (a call, or ``{"response": ...}``); a plain answer's text
    streams in pieces as it is generated (it came as one delta at the end), and the pieces
    join to the answer the session stored, JSON and escapes read."""
    c = client(server)
    sid = f"tools-stream-{uuid.uuid4().hex[:8]}"
    stream = c.chat.completions.create(  # type: ignore[attr-defined]
        model=server.model, messages=[{"role": "user", "content": "Greet the team warmly."}],
        tools=[MUL], tool_choice="none", max_tokens=24, temperature=0, stream=True,
        extra_headers={"X-Session-ID": sid})
    deltas = [ch.choices[0] for ch in stream if ch.choices]
    pieces = [d.delta.content for d in deltas if d.delta.content]
    assert not any(d.delta.tool_calls for d in deltas)
    stored = server.manager.history(namespace(KEY_A) + sid)  # type: ignore[attr-defined]
    assert parse_reply(stored[-1].content).text == "".join(pieces)
    assert len(pieces) >= 4 and not pieces[0].lstrip().startswith("{")


def test_an_edit_leaves_each_reply_with_its_own_turn(server: Server) -> None:
    """``GET /v1/sessions/{id}``: each turn names its reply (``message_index``); after an edit
    abandons the second turn, that turn names none and the new reply names the new turn."""
    c = client(server)
    sid = f"edit-{uuid.uuid4().hex[:8]}"
    msgs: list[dict[str, str]] = [{"role": "user", "content": "Name a planet."}]
    usage = []
    for follow_up in ("Name a moon of it.", "Which is the largest moon of all the planets?"):
        r = c.chat.completions.create(  # type: ignore[attr-defined]
            model=server.model, messages=msgs, max_tokens=8, temperature=0,
            extra_headers={"X-Session-ID": sid})
        usage.append(r.usage.prompt_tokens)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": follow_up}]
    r = c.chat.completions.create(  # the second question is asked again, longer
        model=server.model, messages=msgs[:2] + msgs[-1:], max_tokens=8, temperature=0,
        extra_headers={"X-Session-ID": sid})
    assert r.model_extra["suffixmem"]["history"] == "rewritten"
    s = httpx.get(f"{server.url}/v1/sessions/{sid}",
                  headers={"Authorization": f"Bearer {KEY_A}"}).json()
    assert [m["role"] for m in s["messages"]] == ["user", "assistant"] * 2
    assert [t["message_index"] for t in s["turns"]] == [1, None, 3]
    assert s["turns"][2]["prompt_tokens"] == r.usage.prompt_tokens != usage[1]
    assert s["temperature_hot"] is None and s["temperature_cold"] is None  # the server's range


def test_penalties_are_applied(server: Server) -> None:
    """``frequency_penalty``/``presence_penalty`` reach the engine (they were refused): a
    reply that repeats itself greedily comes out different, and with fewer repeats."""
    c = client(server)

    def reply(**penalties: float) -> str:
        r = c.chat.completions.create(  # type: ignore[attr-defined]
            model=server.model, max_tokens=32, temperature=0, **penalties,
            messages=[{"role": "user", "content": "Write the word cat ten times."}])
        return str(r.choices[0].message.content)

    plain, penalised = reply(), reply(frequency_penalty=1.0, presence_penalty=0.5)
    assert plain.lower().count("cat") > penalised.lower().count("cat")


def test_the_developer_role_is_read_as_system(server: Server) -> None:
    """OpenAI's newer name for the system role (refused with a 400 before)."""
    c = client(server)
    sid = f"dev-{uuid.uuid4().hex[:8]}"
    r = c.chat.completions.create(  # type: ignore[attr-defined]
        model=server.model, max_tokens=4, temperature=0, extra_headers={"X-Session-ID": sid},
        messages=[{"role": "developer", "content": "Answer in one word."},
                  {"role": "user", "content": "Name a colour."}])
    assert r.choices[0].message.content
    info = server.manager.get_session(namespace(KEY_A) + sid)  # type: ignore[attr-defined]
    assert info.system_prompt == "Answer in one word."
