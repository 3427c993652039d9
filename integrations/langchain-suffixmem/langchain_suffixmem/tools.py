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
from suffixmem.tool_calls import ToolSpec, parse_reply, reply_schema, tools_prompt


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """LangChain tools (``BaseTool``, functions, Pydantic classes, TypedDicts, OpenAI dicts)
    in OpenAI's function format, which the model's ``tools`` keyword carries."""
    return [convert_to_openai_tool(t) for t in tools]


def specs(tools: Sequence[dict[str, Any]]) -> list[ToolSpec]:
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequestError(
                f"tools[{i}] is not an OpenAI function tool ({{'type': 'function', "
                "'function': {'name': ...}}); pass tools through bind_tools")
        out.append(ToolSpec(fn["name"], fn.get("description") or "",
                            fn.get("parameters") or {"type": "object", "properties": {}}))
    return out


def choice_name(tool_choice: Any, tools: Sequence[ToolSpec]) -> str | None:
    """LangChain's ``tool_choice`` spellings -> ``suffixmem.tool_calls`` choices: ``None`` /
    "auto", "none", "any" / "required" / ``True`` (one tool must be called), a tool's name or
    ``{"type": "function", "function": {"name": ...}}``; Anthropic's ``{"type": "auto" |
    "any" | "none"}`` and ``{"type": "tool", "name": ...}`` too (its tools bind as well)."""
    if tool_choice is None or tool_choice is False:
        return None
    if tool_choice is True:
        return "required"
    if isinstance(tool_choice, dict) and tool_choice.get("type") in ("auto", "any", "none"):
        tool_choice = tool_choice["type"]
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        if not isinstance(name, str):
            raise InvalidRequestError(f"tool_choice: cannot read a tool name from {tool_choice}")
        tool_choice = name
    if not isinstance(tool_choice, str):
        raise InvalidRequestError(
            f"tool_choice must be a string, dict or bool, got {type(tool_choice).__name__}")
    return tool_choice


def with_tools_prompt(messages: list[Message], tools: Any) -> list[Message]:
    """``messages`` with the tools described at the end of the system prompt (added if none)."""
    if not tools:
        return messages
    text = tools_prompt(specs(tools))
    if messages and messages[0].role == "system":
        return [Message("system", f"{messages[0].content}\n\n{text}"), *messages[1:]]
    return [Message("system", text), *messages]


def tool_schema(tools: Any, tool_choice: Any) -> dict[str, Any] | None:
    """The reply's JSON schema for bound ``tools`` (OpenAI format) and ``tool_choice``."""
    if not tools:
        if tool_choice not in (None, False, "auto", "none"):
            raise InvalidRequestError(f"tool_choice {tool_choice!r} given without tools")
        return None
    spec = specs(tools)
    return reply_schema(spec, choice_name(tool_choice, spec))


def reply_chunk(text: str) -> AIMessageChunk:
    """The reply (generated under ``tool_schema``) as one chunk: tool-call chunks with fresh
    ids, or the answer's text; the generated text is kept as ``response_metadata[RAW_KEY]``."""
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
    return AIMessageChunk(content=reply.text, response_metadata=meta)
