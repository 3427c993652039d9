"""OpenAI tool calling over HTTP (``tools``, ``tool_choice``), by the guided decoding the
adapters use (``suffixmem.tool_calls``): the tools are described at the end of the system
prompt and the reply is constrained to one tool call or, under "auto", a plain answer. A call
comes back as the message's ``tool_calls`` (``finish_reason`` "tool_calls"); a streamed reply
under tools arrives as one delta once complete, since a call can only be read whole. One call
per reply (``parallel_tool_calls`` is accepted; the model makes at most one)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError
from suffixmem.server.errors import invalid_value
from suffixmem.tool_calls import (
    ToolSpec,
    openai_choice,
    openai_specs,
    parse_reply,
    reply_schema,
    with_tools_prompt,
)


@dataclass(frozen=True, slots=True)
class Tools:
    """A request's tools, read: ``specs`` for the prompt and ``schema`` for the reply (None:
    ``tool_choice`` "none", free text)."""

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
