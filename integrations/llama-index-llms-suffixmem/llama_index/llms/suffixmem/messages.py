"""Translation between LlamaIndex ``ChatMessage``s and suffixmem ``Message``s (text, tool calls
and tool results: an assistant message is resent as the text the model generated,
``additional_kwargs[RAW_KEY]``; other tool calls and results are rendered by
``suffixmem.tool_calls``).

The same module ships in llama-index-storage-chat-store-suffixmem: each distribution
depends on suffixmem and llama-index-core only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock

from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError
from suffixmem.tool_calls import render_calls, render_result

# ``additional_kwargs`` key of a reply the manager already stored: {"session_id", "index"}
STORED_KEY = "suffixmem_stored"
# ``additional_kwargs`` key of the reply's text as generated (a tool call's JSON)
RAW_KEY = "suffixmem_raw"

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}


def to_suffixmem_message(message: ChatMessage, where: str = "message") -> Message:
    """One LlamaIndex message -> a suffixmem message; ``InvalidRequestError`` for what the model
    cannot read (non-text blocks, tool calls, unknown roles)."""
    if not isinstance(message, ChatMessage):
        raise InvalidRequestError(
            f"{where} is a {type(message).__name__}, not a LlamaIndex ChatMessage")
    role = _ROLES.get(MessageRole(message.role))
    if role is None:  # pragma: no cover - every MessageRole is mapped
        raise InvalidRequestError(
            f"{where} has role {message.role!r}, which suffixmem cannot render")
    raw = message.additional_kwargs.get(RAW_KEY)
    if role == "assistant" and isinstance(raw, str):
        return Message(role, raw)
    parts = []
    for block in message.blocks:
        if not isinstance(block, TextBlock):
            raise InvalidRequestError(
                f"{where} has a {type(block).__name__}; suffixmem models read text only"
            )
        parts.append(block.text)
    text = "".join(parts)
    calls = message.additional_kwargs.get("tool_calls")
    if role == "assistant" and calls:
        try:
            rendered = render_calls([(_get(c, "name"), _get(c, "arguments")) for c in calls])
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidRequestError(f"{where} has unreadable tool calls ({e})") from None
        text = f"{text}\n{rendered}" if text else rendered
    if role == "tool":
        text = render_result(text, message.additional_kwargs.get("name")
                             or message.additional_kwargs.get("tool_name"))
    return Message(role, text)


def _get(call: Any, key: str) -> Any:
    """A field of a tool call: ours (a dict) or OpenAI's (``function.name``/``arguments``)."""
    if isinstance(call, dict):
        value = call[key] if key in call else call["function"][key]
    else:
        fn = getattr(call, "function", call)
        value = getattr(fn, key)
    if key == "arguments" and isinstance(value, str):
        import json

        value = json.loads(value)
    return value


def to_suffixmem(messages: Sequence[ChatMessage]) -> list[Message]:
    """LlamaIndex messages -> suffixmem messages; a list that ends with a tool call is refused,
    as OpenAI refuses it (a call waits for its result, not for another reply)."""
    out = [to_suffixmem_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    last = messages[-1] if messages else None
    if (last is not None and MessageRole(last.role) == MessageRole.ASSISTANT
            and last.additional_kwargs.get("tool_calls")):
        raise InvalidRequestError(
            f"messages[{len(messages) - 1}] is a tool call without its result: nothing to "
            "answer (send the tool message with the tool's result after it)")
    return out


def to_llama_index(message: Message) -> ChatMessage:
    return ChatMessage(role=MessageRole(message.role), content=message.content)
