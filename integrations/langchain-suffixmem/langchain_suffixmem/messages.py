"""Translation between LangChain messages and suffixmem ``Message``s (text only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError

# ``response_metadata`` key of a reply the manager already stored: {"session_id", "index"}
STORED_KEY = "suffixmem_stored"

# ChatMessage roles as LangChain spells them -> suffixmem roles
_CHAT_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "tool": "tool",
}


def text_of(content: str | list[Any], where: str) -> str:
    """The text of a message's ``content``: a string, or a list of strings and ``text`` blocks.

    Any other block (image, audio, file, tool use...) raises ``InvalidRequestError``: the model
    reads text only.
    """
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise InvalidRequestError(
                f"{where} has a {kind!r} content block; suffixmem models read text only "
                "(strings and {'type': 'text'} blocks)"
            )
    return "".join(parts)


def role_of(message: BaseMessage, where: str) -> str:
    """The suffixmem role of a LangChain message, or ``InvalidRequestError`` if unrenderable."""
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        if message.tool_calls or message.invalid_tool_calls:
            raise InvalidRequestError(
                f"{where} is an AIMessage with tool calls; suffixmem models have no tool "
                "calling, so such a history cannot be rendered"
            )
        return "assistant"
    if isinstance(message, ToolMessage):
        return "tool"
    if isinstance(message, ChatMessage):
        role = _CHAT_ROLES.get(message.role)
        if role is None:
            raise InvalidRequestError(
                f"{where} is a ChatMessage with role {message.role!r}; expected one of "
                f"{sorted(_CHAT_ROLES)}"
            )
        return role
    raise InvalidRequestError(
        f"{where} is a {type(message).__name__} (type {message.type!r}), which suffixmem cannot "
        "render; use SystemMessage, HumanMessage, AIMessage, ToolMessage or ChatMessage"
    )


def to_suffixmem(messages: Sequence[BaseMessage]) -> list[Message]:
    """LangChain messages -> suffixmem messages, or ``InvalidRequestError`` naming the offending
    one. Leading system messages (a prompt template may stack several) become the one system
    prompt a suffixmem session has, joined by a blank line; a system message later in the
    conversation is left for the manager to refuse."""
    out: list[Message] = []
    leading = True  # still in the run of system messages that opens the conversation
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        msg = Message(role_of(m, where), text_of(m.content, where))
        if leading and msg.role == "system" and out:
            out[0] = Message("system", f"{out[0].content}\n\n{msg.content}")
            continue
        leading = leading and msg.role == "system"
        out.append(msg)
    return out


def to_langchain(message: Message) -> BaseMessage:
    """A stored suffixmem message -> the LangChain message of its role."""
    if message.role == "system":
        return SystemMessage(message.content)
    if message.role == "user":
        return HumanMessage(message.content)
    if message.role == "assistant":
        return AIMessage(message.content)
    return ChatMessage(role=message.role, content=message.content)
