"""The manager's event streams as LlamaIndex responses, for ``SuffixMemLLM`` (``base.py``).

Contract: ``responses(events, respond, final, deadline)`` (and ``aresponses``, its asyncio
twin) turns one turn's ``TokenEvent``s into cumulative responses ``respond(text, delta, None)``
and its closing ``Result``/``TurnResult`` into ``respond(text, "", final(event))``; a deadline
passed between tokens raises ``TimeoutError``; closing the responses closes (aborts) the
events, so an abandoned turn stores nothing. ``respond`` is one of ``chat_response``,
``completion_response`` or one ``tool_responder()`` (a plain answer's text streams, a tool
call's JSON is held back until the reply is complete; filter its ``None``s with ``skip_none``).
Each final response carries ``usage(...)`` in ``raw["usage"]`` and ``additional_kwargs``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
)
from llama_index.llms.suffixmem.messages import STORED_KEY
from llama_index.llms.suffixmem.tools import reply_message

from suffixmem.conversation.manager import TurnResult
from suffixmem.engine.protocol import Result, TokenEvent
from suffixmem.tool_calls import AnswerStream

Respond = Callable[[str, str, "dict[str, Any] | None"], Any]


def text_session_key(prompt: str) -> str:
    """The cache namespace of a raw completion without a session (derived from its start)."""
    return "anon-" + hashlib.sha256(prompt[:1024].encode("utf-8", "surrogatepass")).hexdigest()[:16]


def usage(event: Result | TurnResult, model_name: str) -> dict[str, Any]:
    """The usage LlamaIndex reads (``prompt_tokens``, ``completion_tokens``, ``total_tokens``)
    plus ``cached_tokens``, ``ttft_s``/``latency_s`` (seconds), finish reason, session, and for
    a chat turn its topic verdict and temperature."""
    result = event.result if isinstance(event, TurnResult) else event
    out: dict[str, Any] = {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.output_tokens,
        "total_tokens": result.prompt_tokens + result.output_tokens,
        "cached_tokens": result.cached_tokens,
        "ttft_s": result.ttft_s,
        "latency_s": result.latency_s,
        "finish_reason": result.finish_reason,
        "session_id": result.session_key,
        "model_name": model_name,
    }
    if isinstance(event, TurnResult):
        out.update(session_id=event.session_id, topic_jump=event.topic_jump,
                   temperature=event.temperature, history=getattr(event, "history", None))
    return out


def _marker(u: dict[str, Any]) -> dict[str, Any]:
    # where a stored reply sits: rides on the message, which a chat engine hands to its memory
    return {k: u[k] for k in (STORED_KEY,) if k in u}


def chat_response(text: str, delta: str, u: dict[str, Any] | None) -> ChatResponse:
    if u is None:
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
                            delta=delta)
    message = ChatMessage(role=MessageRole.ASSISTANT, content=text, additional_kwargs=_marker(u))
    return ChatResponse(message=message, delta=delta, raw={"usage": u}, additional_kwargs=u)


def completion_response(text: str, delta: str, u: dict[str, Any] | None) -> CompletionResponse:
    if u is None:
        return CompletionResponse(text=text, delta=delta)
    return CompletionResponse(text=text, delta=delta, raw={"usage": u}, additional_kwargs=u)


def tool_responder() -> Respond:
    """A fresh ``respond`` for one reply under tools: a plain answer's text streams as it is
    generated (``AnswerStream``), a call comes as one response once complete; ``None`` for a
    token with nothing to show."""
    answer = AnswerStream()

    def respond(text: str, delta: str, u: dict[str, Any] | None) -> ChatResponse | None:
        if u is None:
            piece = answer.feed(delta)
            if not piece:
                return None
            return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT,
                                                    content=answer.text), delta=piece)
        message = reply_message(text, _marker(u))
        if message.additional_kwargs.get("tool_calls"):
            u = {**u, "finish_reason": "tool_calls"}  # OpenAI's, as the server says
        return ChatResponse(message=message, delta=answer.rest(message.content),
                            raw={"usage": u}, additional_kwargs=u)

    return respond


def _check(deadline: float | None, timeout: float | None) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeoutError(f"no complete reply within {timeout} s; request aborted")


def responses(events: Iterator[Any], respond: Respond,
              final: Callable[[Any], dict[str, Any]], timeout: float | None) -> Iterator[Any]:
    """See the module docstring (``timeout``: seconds, or ``None``)."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    text = ""
    try:
        for event in events:
            if isinstance(event, TokenEvent):
                _check(deadline, timeout)
                if event.text:
                    text += event.text
                    yield respond(text, event.text, None)
            else:
                yield respond(text, "", final(event))
    finally:
        events.close()  # type: ignore[attr-defined]  # early close aborts: nothing stored


async def aresponses(events: AsyncIterator[Any], respond: Respond,
                     final: Callable[[Any], dict[str, Any]], timeout: float | None
                     ) -> AsyncIterator[Any]:
    """``responses`` for asyncio; ``final`` (SQL) runs in a worker thread."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    text = ""
    try:
        async for event in events:
            if isinstance(event, TokenEvent):
                _check(deadline, timeout)
                if event.text:
                    text += event.text
                    yield respond(text, event.text, None)
            else:
                done: Awaitable[dict[str, Any]] = asyncio.to_thread(final, event)
                yield respond(text, "", await done)
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def skip_none(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for r in items:
        if r is not None:
            yield r
