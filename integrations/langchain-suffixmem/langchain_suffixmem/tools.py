"""LangChain's side of tool calling (``bind_tools``): tools and ``tool_choice`` into
``suffixmem.tool_calls`` specs, and a reply back into an ``AIMessageChunk`` with
``tool_call_chunks`` (ids included) in LangChain's standard shape."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessageChunk
from langchain_core.utils.function_calling import convert_to_openai_tool

from langchain_suffixmem.messages import RAW_KEY
from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError
from suffixmem.tool_calls import (
    AnswerStream,
    openai_choice,
    openai_specs,
    parse_reply,
    reply_schema,
)
from suffixmem.tool_calls import with_tools_prompt as _with_tools_prompt


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """LangChain tools (``BaseTool``, functions, Pydantic classes, TypedDicts, OpenAI dicts)
    in OpenAI's function format, which the model's ``tools`` keyword carries."""
    return [convert_to_openai_tool(t) for t in tools]


def with_tools_prompt(messages: list[Message], tools: Any) -> list[Message]:
    """``messages`` with the bound tools described at the end of the system prompt."""
    return _with_tools_prompt(messages, openai_specs(tools) if tools else [])


def tool_schema(tools: Any, tool_choice: Any) -> dict[str, Any] | None:
    """The reply's JSON schema for bound ``tools`` (OpenAI format) and ``tool_choice``."""
    if not tools:
        if tool_choice not in (None, False, "auto", "none"):
            raise InvalidRequestError(f"tool_choice {tool_choice!r} given without tools")
        return None
    return reply_schema(openai_specs(tools), openai_choice(tool_choice))


def reply_chunk(text: str, streamed: AnswerStream | None = None) -> AIMessageChunk:
    """The reply (generated under ``tool_schema``) as the last chunk: tool-call chunks with
    fresh ids, or the answer's text less what ``streamed`` already gave; the generated text is
    kept as ``response_metadata[RAW_KEY]``."""
    reply = parse_reply(text)
    meta = {RAW_KEY: text}
    if reply.calls:
        return AIMessageChunk(
            content="", response_metadata=meta,
            tool_call_chunks=[
                {"name": c.name, "args": json.dumps(c.arguments), "id": c.id, "index": i,
                 "type": "tool_call_chunk"}
                for i, c in enumerate(reply.calls)])
    if reply.error is not None:
        # cut off (max_tokens) or otherwise unreadable: the raw text, and why
        meta["suffixmem_tool_error"] = reply.error
    content = reply.text if streamed is None else streamed.rest(reply.text)
    return AIMessageChunk(content=content, response_metadata=meta)
