"""OpenAI tool calling over HTTP (``tools``, ``tool_choice``), by the guided decoding the
adapters use (``suffixmem.tool_calls``): the tools are described at the end of the system
prompt and the reply is constrained to one tool call or, under "auto", a plain answer (under
"none" only that answer). A call comes back as the message's ``tool_calls`` (``finish_reason``
"tool_calls"); streamed, a plain answer's text arrives as it is generated and a call as one
delta once complete, since a call can only be read whole. One call per reply
(``parallel_tool_calls`` is accepted; the model makes at most one). ``message_text`` renders a
resent agent history's calls and results."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError
from suffixmem.server.errors import invalid_value
from suffixmem.server.protocol import ChatMessage
from suffixmem.tool_calls import (
    ToolSpec,
    openai_choice,
    openai_specs,
    parse_reply,
    render_calls,
    render_result,
    reply_schema,
    with_tools_prompt,
)


@dataclass(frozen=True, slots=True)
class Tools:
    """A request's tools, read: ``specs`` for the prompt and ``schema`` for the reply (under
    ``tool_choice`` "none" the plain answer only)."""

    specs: tuple[ToolSpec, ...]
    schema: dict[str, Any] | None

    def prompt(self, messages: list[Message]) -> list[Message]:
        return with_tools_prompt(messages, self.specs)


def read_tools(tools: list[Any] | None, tool_choice: Any) -> Tools | None:
    """The request's ``tools`` and ``tool_choice``, checked (a 400 naming the field)."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):  # both mean "no call" without tools
            raise invalid_value("tool_choice needs tools", "tool_choice")
        return None
    try:
        specs = tuple(openai_specs(tools))
    except InvalidRequestError as e:
        raise invalid_value(str(e), "tools") from None
    try:
        return Tools(specs, reply_schema(specs, openai_choice(tool_choice)))
    except InvalidRequestError as e:
        raise invalid_value(str(e), "tool_choice") from None


@dataclass(frozen=True, slots=True)
class Reply:
    """What the client gets for a reply generated under tools."""

    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str | None


def read_reply(text: str, finish_reason: str | None) -> Reply:
    """A reply under tools in OpenAI's shape: its call (``arguments`` a JSON string, an id
    ``call_...``), or the answer's text (an unreadable reply, cut off, as its raw text)."""
    reply = parse_reply(text)
    if not reply.calls:
        return Reply(reply.text, None, finish_reason)
    calls = [{"id": c.id, "type": "function",
              "function": {"name": c.name, "arguments": json.dumps(c.arguments,
                                                                    ensure_ascii=False)}}
             for c in reply.calls]
    return Reply(None, calls, "tool_calls")


def message_text(i: int, m: ChatMessage, names: dict[str, str]) -> str:
    """What the model reads for message ``i``: its text; an assistant's ``tool_calls`` and a
    ``tool`` result rendered as the adapters render them (``suffixmem.tool_calls``), so a
    resent agent history is not stored as an empty reply and a bare result. ``names``: tool
    call ids seen so far -> function names (a result names its call by id only)."""
    if m.content is None:
        text = ""
    elif isinstance(m.content, str):
        text = m.content
    else:
        parts = []
        for j, p in enumerate(m.content):
            if p.type != "text" or p.text is None:
                raise invalid_value(f"messages[{i}].content[{j}]: only text parts are "
                                    "supported", f"messages[{i}].content")
            parts.append(p.text)
        text = "\n".join(parts)  # as vLLM's server joins text parts
    if m.role == "tool":
        return render_result(text, m.name or names.get(m.tool_call_id or ""))
    if m.role != "assistant" or not m.tool_calls:
        return text
    calls = []
    for j, call in enumerate(m.tool_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        try:
            name, args = fn["name"], json.loads(fn.get("arguments") or "{}")  # type: ignore[index]
            if not isinstance(name, str) or not isinstance(args, dict):
                raise TypeError
        except (TypeError, KeyError, ValueError):
            raise invalid_value(f"messages[{i}].tool_calls[{j}] is not a function call with a "
                                "name and JSON object arguments",
                                f"messages[{i}].tool_calls") from None
        if isinstance(call.get("id"), str):
            names[call["id"]] = name
        calls.append((name, args))
    rendered = render_calls(calls)
    return f"{text}\n{rendered}" if text else rendered
