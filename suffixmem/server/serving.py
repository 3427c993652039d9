"""The serving logic behind the routes: OpenAI requests in, ConversationManager turns out.

``ChatService`` knows nothing about HTTP routing; ``app`` maps routes onto it. Every turn goes
through the manager (``astream_complete``), so sessions, the semantic
temperature, prompt layout and atomic commits are the library's, not the server's.

**Sessions.** The session is named by the ``X-Session-ID`` header, else ``prompt_cache_key``;
without either the request is stateless (nothing stored). ``user`` is OpenAI's end-user id, the
same for all of a user's conversations, so it names no session (their conversations would read
as one). The response echoes the id in ``X-Session-ID``, percent-encoded (UTF-8) where it holds
characters a header cannot carry. With a session the client may send either

- the whole conversation, OpenAI style: reconciled with the stored history (appended when the
  stored history is a prefix of it, appended and read from the window when it is the stored
  history less its oldest exchanges, otherwise replaced atomically with the turn); or
- only the new message: a request holding exactly one user message (optionally after the
  session's own system prompt) continues a session that already has history (the manager's
  reconciliation reads it so for every surface). To start such a session over,
  ``DELETE /v1/sessions/{id}`` first.

**Namespaces.** With API keys, every session id is stored as ``<namespace>.<id>``, the
namespace a hash of the key, so one key can never read, continue or delete another's sessions
(an id of another key is simply unknown: 404).

**Admission.** At most ``max_pending`` turns run or wait at once; beyond that a request gets
429 at once (with ``Retry-After``) instead of queueing without bound.

**Disconnects.** The SSE generator closes the manager's stream when the client goes away (the
close is shielded from the cancellation that announced it), which aborts the engine request; the
manager stores nothing of a turn that did not finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from suffixmem.conversation.manager import ConversationManager, TurnResult
from suffixmem.conversation.records import turn_summaries
from suffixmem.conversation.turns import alast_event
from suffixmem.engine.protocol import Message, TokenEvent
from suffixmem.errors import InvalidRequestError
from suffixmem.server.errors import APIError, invalid_value, to_api_error
from suffixmem.server.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    TurnInfo,
    Usage,
)
from suffixmem.server.tools import Reply as ToolReply
from suffixmem.server.tools import Tools, message_text, read_reply, read_tools
from suffixmem.tool_calls import AnswerStream

SESSION_HEADER = "X-Session-ID"


@dataclass(slots=True)
class ServerConfig:
    """``api_keys``: accepted bearer keys (empty: no auth, one shared namespace);
    ``max_body_bytes``: request bodies above this get 413; ``max_pending``: turns running or
    waiting at once before 429; ``served_model_name``: the id in ``/v1/models`` (default: the
    engine's model name, a model folder's own name rather than its path, which ``/health``
    would show anyone); any other ``model`` in a request is 404 (the folder's path is still
    accepted). ``allowed_hosts``: the ``Host`` header values (without port) a request may
    carry, ``None`` for any; ``serve`` on loopback sets the loopback names, so a web page on
    another origin cannot reach it through DNS rebinding."""

    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 4 * 1024 * 1024
    max_pending: int = 64
    served_model_name: str | None = None
    extra_model_names: tuple[str, ...] = field(default=())
    allowed_hosts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise InvalidRequestError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_pending < 1:
            raise InvalidRequestError(f"max_pending must be >= 1, got {self.max_pending}")
        if any(not k or not k.strip() for k in self.api_keys):
            raise InvalidRequestError("api_keys must be non-empty strings")


def _public_name(model: str) -> str:
    """A model's name as the server shows it: a folder or file path's last part (the path
    tells anyone who can reach ``/health`` how the host is laid out)."""
    if "/" in model or os.sep in model:
        return Path(model).name or model
    return model


def namespace(api_key: str | None) -> str:
    """The session-id prefix of ``api_key`` ("" when the server has no keys)."""
    if api_key is None:
        return ""
    return "k" + hashlib.sha256(api_key.encode()).hexdigest()[:16] + "."


class ChatService:
    """OpenAI chat completions, models and sessions over one ``ConversationManager``."""

    def __init__(self, manager: ConversationManager, config: ServerConfig | None = None) -> None:
        self.manager = manager
        self.config = config or ServerConfig()
        engine_model = manager.engine.model_name
        self.model_name = self.config.served_model_name or _public_name(engine_model)
        # a request naming the model by its folder's path is still served (unless renamed)
        self._also = (engine_model,) if self.config.served_model_name is None and \
            engine_model != self.model_name else ()
        self.pending = 0  # turns admitted and not finished (touched on the event loop only)

    # -- models / health ------------------------------------------------------------------------
    def models(self) -> ModelList:
        names = (self.model_name, *self.config.extra_model_names)
        return ModelList(data=[ModelCard(id=n, max_model_len=self.manager.engine.max_model_len)
                               for n in names])

    def health(self) -> dict[str, Any]:
        """``status`` "ok", or "unavailable" with the engine's ``reason`` (every remote replica
        down, the engine closed): a load balancer then stops sending turns that would fail."""
        probe = getattr(self.manager.engine, "unavailable", None)
        reason = probe() if probe is not None else None
        health = {"status": "unavailable" if reason else "ok", "model": self.model_name,
                  "pending": self.pending, "max_pending": self.config.max_pending,
                  "kv": self._kv_use()}
        return health | ({"reason": reason} if reason else {})

    def _kv_use(self) -> dict[str, Any]:
        """The KV pool's and the disk tier's use, for an operator sizing them
        (``--kv-cache-gib``, ``--kv-tier-gib``); aggregate figures only, no session's."""
        stats = self.manager.engine.stats()
        tier = {k: stats.extra[k] for k in ("tier_bytes", "tier_files", "tier_evictions",
                                            "tier_hit_rate") if k in stats.extra}
        return {"used_bytes": stats.kv_used_bytes, "capacity_bytes": stats.kv_capacity_bytes,
                "hit_rate": round(stats.hit_rate, 4), **tier}

    # -- sessions -------------------------------------------------------------------------------
    @staticmethod
    def session_id(ns: str, client_id: str | None, field_name: str) -> str | None:
        """The stored id of ``client_id`` within namespace ``ns`` (validated; None: none)."""
        if client_id is None:
            return None
        from suffixmem.conversation.validation import MAX_ID_LEN, check_session_id

        try:
            check_session_id(client_id, field_name)
        except InvalidRequestError as e:
            raise invalid_value(str(e), field_name) from None
        if client_id in (".", ".."):  # a URL path cannot hold them: /v1/sessions/.. is /v1/
            raise invalid_value(f"{field_name} must not be {client_id!r} (no URL can name "
                                "that session)", field_name)
        if len(ns) + len(client_id) > MAX_ID_LEN:  # the key's prefix shares the stored limit
            raise invalid_value(f"{field_name} is too long: {len(client_id)} characters, the "
                                f"limit with an API key is {MAX_ID_LEN - len(ns)}", field_name)
        return ns + client_id

    async def list_sessions(self, ns: str) -> dict[str, Any]:
        infos = await asyncio.to_thread(self.manager.list_sessions)
        data = [{"id": s.id[len(ns):], "title": s.title, "messages": s.message_count,
                 "updated_at": s.updated_at.isoformat()} for s in infos if s.id.startswith(ns)]
        return {"object": "list", "data": data}

    async def get_session(self, ns: str, client_id: str) -> dict[str, Any]:
        sid = self.session_id(ns, client_id, "session")
        assert sid is not None

        def read() -> dict[str, Any]:
            info = self.manager.get_session(sid)
            history = self.manager.store.messages(sid)
            stats = self.manager.stats(sid)
            turns = self.manager.store.turn_events(sid)
            return {
                "id": client_id, "object": "session", "system_prompt": info.system_prompt,
                "temperature": info.temperature, "temperature_hot": info.temperature_hot,
                "temperature_cold": info.temperature_cold,
                "created_at": info.created_at.isoformat(),
                "messages": [{"role": m.role, "content": m.content} for m in history],
                "turns": turn_summaries([m.position for m in history], turns),
                "usage": {k: stats[k] for k in ("turns", "prompt_tokens", "cached_tokens",
                                                "output_tokens", "hit_rate", "mean_ttft_s")},
            }

        return await asyncio.to_thread(read)

    async def delete_session(self, ns: str, client_id: str) -> dict[str, Any]:
        sid = self.session_id(ns, client_id, "session")
        await asyncio.to_thread(self.manager.delete_session, sid)  # type: ignore[arg-type]
        return {"id": client_id, "object": "session.deleted", "deleted": True}

    # -- chat completions -----------------------------------------------------------------------
    def _sampling(self, req: ChatCompletionRequest) -> dict[str, Any]:
        if req.n != 1:
            raise invalid_value("n must be 1", "n")
        for legacy in ("functions", "function_call"):
            if getattr(req, legacy) is not None:
                raise invalid_value(f"{legacy} is not supported; use tools", legacy)
        if req.logprobs or req.top_logprobs:
            field = "logprobs" if req.logprobs else "top_logprobs"
            raise invalid_value(f"{field} is not supported", field)
        if req.logit_bias:
            raise invalid_value("logit_bias is not supported", "logit_bias")
        if req.stream_options is not None and not req.stream:
            # as OpenAI and vLLM answer it: the options would be silently meaningless
            raise invalid_value("stream_options is only allowed when stream is true",
                                "stream_options")
        if req.audio is not None or any(m != "text" for m in req.modalities or ()):
            field = "audio" if req.audio is not None else "modalities"
            raise invalid_value(f"{field}: only text output is supported", field)
        if req.prediction is not None:
            raise invalid_value("prediction (predicted outputs) is not supported", "prediction")
        if req.model is not None and req.model not in (self.model_name, *self._also,
                                                       *self.config.extra_model_names):
            raise APIError(404, f"model {req.model!r} is not served here; see /v1/models",
                           param="model", code="model_not_found")
        stop = req.stop
        sampling: dict[str, Any] = {
            "max_tokens": req.max_completion_tokens if req.max_completion_tokens is not None
            else req.max_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
            "stop": tuple(stop) if isinstance(stop, list) else stop, "seed": req.seed,
            "ignore_eos": req.ignore_eos, "frequency_penalty": req.frequency_penalty,
            "presence_penalty": req.presence_penalty,
        }
        fmt = req.response_format
        if fmt is not None and fmt.type == "json_object":
            sampling["json_schema"] = {"type": "object"}
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise invalid_value("response_format.json_schema.schema is required",
                                    "response_format")
            sampling["json_schema"] = fmt.json_schema.schema_
        return sampling

    async def _events(self, req: ChatCompletionRequest, sid: str | None, ns: str = "",
                      tools: Tools | None = None) -> AsyncIterator[TokenEvent | TurnResult]:
        """The manager's event stream for ``req`` (``astream_complete``, whose reconciliation
        continues a session sent only its new message); raises before any event for bad
        input."""
        if not req.messages:
            raise invalid_value("messages must not be empty", "messages")
        names: dict[str, str] = {}
        # OpenAI's "developer" role is its newer name for "system" (vLLM's server reads it so)
        msgs = [Message("system" if m.role == "developer" else m.role, message_text(i, m, names))
                for i, m in enumerate(req.messages)]
        if req.messages[-1].role == "assistant" and req.messages[-1].tool_calls:
            raise invalid_value(f"messages[{len(msgs) - 1}] is a tool call without its result: "
                                "nothing to answer (send the tool message after it)", "messages")
        if msgs[0].role == "system" and not msgs[0].content.strip():
            msgs = msgs[1:]  # an app with no instructions sends one empty: OpenAI reads none
        sampling = self._sampling(req)
        schema = "json_schema" in sampling and sampling["json_schema"] is not None
        if tools is not None:
            if schema:
                raise invalid_value("response_format cannot be combined with tools",
                                    "response_format")
            msgs = tools.prompt(msgs)  # the reply's shape is the tools' schema, not shown
            sampling["json_schema"] = tools.schema
        # stateless: the key's namespace scopes the derived cache key (no sharing across keys);
        # "only the new message" continues a session (docs/server.md)
        return self.manager.astream_complete(sid, msgs, show_schema=schema, anon_scope=ns,
                                             continue_single=True, **sampling)

    def _admit(self) -> None:
        if self.pending >= self.config.max_pending:
            raise APIError(429, f"the server is busy ({self.pending} requests in flight); "
                           "retry shortly", type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": "1"})
        self.pending += 1

    async def complete(self, req: ChatCompletionRequest, sid: str | None, client_id: str | None,
                       disconnected: Callable[[], Awaitable[bool]] | None = None, ns: str = ""
                       ) -> ChatCompletion | None:
        """The whole turn; None if ``disconnected()`` turned true first (the turn was aborted
        and nothing stored: there is nobody left to answer)."""
        tools = read_tools(req.tools, req.tool_choice)
        self._admit()
        events = None
        try:
            events = await self._events(req, sid, ns, tools)
            drain = asyncio.ensure_future(alast_event(events))
            while not drain.done():
                await asyncio.wait({drain}, timeout=0.25)
                if not drain.done() and disconnected is not None and await disconnected():
                    drain.cancel()  # aborts the engine request: the manager closes the turn
                    with contextlib.suppress(asyncio.CancelledError):
                        await drain
                    return None
            turn = drain.result()
        except Exception as e:
            raise to_api_error(e) from e
        finally:
            self.pending -= 1
            if events is not None:
                with anyio.CancelScope(shield=True):
                    await events.aclose()
        reply = (read_reply(turn.text, turn.finish_reason) if tools is not None and tools.schema
                 else ToolReply(turn.text, None, turn.finish_reason))
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}", model=self.model_name,
            choices=[Choice(message=AssistantMessage(content=reply.content,
                                                     tool_calls=reply.tool_calls),
                            finish_reason=reply.finish_reason)],
            usage=_usage(turn), suffixmem=_info(turn, client_id))

    async def stream(self, req: ChatCompletionRequest, sid: str | None, client_id: str | None,
                     ns: str = "") -> tuple[AsyncIterator[str], Callable[[], Awaitable[None]]]:
        """Admit and validate now (errors become an HTTP status), then the SSE lines and
        ``release``: the response must await it once it ends, however it ends (it gives back
        the request's slot and aborts the turn once; a stream never iterated, its client gone
        before the first line, has no ``finally`` of its own to run)."""
        tools = read_tools(req.tools, req.tool_choice)
        self._admit()
        events = None
        released = False

        async def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.pending -= 1
            if events is not None:
                # the client may be gone: the cancellation that said so must not cancel the abort
                with anyio.CancelScope(shield=True):
                    await events.aclose()

        try:
            events = await self._events(req, sid, ns, tools)
            # the manager validates on the first step: wait for it so bad input is a 400
            first = await anext(events)
        except BaseException as e:
            await release()
            if isinstance(e, StopAsyncIteration | Exception):
                raise to_api_error(e) from e
            raise
        return self._sse(first, events, req, client_id, release, tools), release

    async def _sse(self, first: TokenEvent | TurnResult, events: Any,
                   req: ChatCompletionRequest, client_id: str | None,
                   release: Callable[[], Awaitable[None]],
                   tools: Tools | None = None) -> AsyncIterator[str]:
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())  # one timestamp for every chunk of the stream, as OpenAI's
        usage = req.stream_options is not None and req.stream_options.include_usage
        # a reply that may be a call: its answer's text streams, a call is read whole
        answer = AnswerStream() if tools is not None and tools.schema is not None else None

        def chunk(**kw: Any) -> str:
            c = ChatCompletionChunk(id=cid, created=created, model=self.model_name, **kw)
            return f"data: {c.model_dump_json(exclude_none=True)}\n\n"

        try:
            # OpenAI opens a text reply with content "", a tool call with none (the openai
            # SDK's stream helper fired an empty content event for a call)
            yield chunk(choices=[ChunkChoice(delta=Delta(
                role="assistant", content="" if answer is None else None))])
            turn: TurnResult | None = None
            async for e in _chain(first, events):
                if isinstance(e, TurnResult):
                    turn = e
                elif text := (e.text if answer is None else answer.feed(e.text)):
                    yield chunk(choices=[ChunkChoice(delta=Delta(content=text))])
            assert turn is not None
            finish = turn.finish_reason
            if answer is not None:
                reply = read_reply(turn.text, finish)
                calls = [{"index": i, **c} for i, c in enumerate(reply.tool_calls or ())]
                rest = answer.rest(reply.content)
                if calls or rest:
                    yield chunk(choices=[ChunkChoice(delta=Delta(content=rest or None,
                                                                 tool_calls=calls or None))])
                finish = reply.finish_reason
            yield chunk(choices=[ChunkChoice(delta=Delta(), finish_reason=finish)],
                        suffixmem=_info(turn, client_id))
            if usage:
                yield chunk(choices=[], usage=_usage(turn))
        except Exception as e:  # mid-stream: the turn was not stored; say so in the stream
            err = to_api_error(e)
            yield f"data: {json.dumps({'error': err.body.model_dump()})}\n\n"
        finally:
            await release()
        yield "data: [DONE]\n\n"


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for e in rest:
        yield e


def _usage(turn: TurnResult) -> Usage:
    out = len(turn.token_ids)
    return Usage(prompt_tokens=turn.prompt_tokens, completion_tokens=out,
                 total_tokens=turn.prompt_tokens + out,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=turn.cached_tokens))


def _info(turn: TurnResult, client_id: str | None) -> TurnInfo:
    return TurnInfo(session_id=client_id, history=turn.history, ttft_s=turn.ttft_s,
                    latency_s=turn.latency_s, temperature=turn.temperature,
                    topic_jump=turn.topic_jump)
