"""Translation between LangChain messages and suffixmem ``Message``s (text, tool calls, tool
results).

An assistant message is sent back to the model as the text it generated (kept in
``response_metadata[RAW_KEY]`` when it differs from ``content``, as a tool call does), so a
resent history renders to the tokens the session stored; tool calls the model did not generate
and tool results are rendered by ``suffixmem.tool_calls`` (canonical, deterministic JSON).
Content blocks that repeat the tool calls (``tool_use``...) and reasoning blocks (``thinking``,
``reasoning``) of an assistant message are left out; text blocks are read whatever their extra
keys (``cache_control``).
"""

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
from suffixmem.tool_calls import render_calls, render_result

# ``response_metadata`` key of a reply the manager already stored: {"session_id", "index"}
STORED_KEY = "suffixmem_stored"
# ``response_metadata`` key of the reply's text as generated (a tool call's JSON)
RAW_KEY = "suffixmem_raw"
# content blocks that repeat an AIMessage's ``tool_calls`` (Anthropic, LangChain v1 style)
_TOOL_BLOCKS = frozenset({"tool_use", "tool_call", "function_call"})
# another model's reasoning in an AIMessage (Anthropic "thinking", LangChain v1 "reasoning"):
# not part of the conversation the model reads, as reasoning APIs drop it from later turns
_REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking", "reasoning"})
_AI_SKIPPED = _TOOL_BLOCKS | _REASONING_BLOCKS

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


def text_of(content: str | list[Any], where: str, skip: frozenset[str] = frozenset()) -> str:
    """The text of a message's ``content``: a string, or a list of strings and ``text`` blocks
    (blocks whose type is in ``skip`` are left out).

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
        elif isinstance(block, dict) and block.get("type") in skip:
            continue
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


def content_of(message: BaseMessage, where: str) -> str:
    """The text the model reads for ``message`` (see the module docstring)."""
    if isinstance(message, AIMessage):
        raw = message.response_metadata.get(RAW_KEY)
        if isinstance(raw, str):
            return raw
        text = text_of(message.content, where, _AI_SKIPPED)
        if not message.tool_calls:
            return text
        calls = render_calls([(c["name"], c["args"]) for c in message.tool_calls])
        return f"{text}\n{calls}" if text else calls
    if isinstance(message, ToolMessage):
        return render_result(text_of(message.content, where), message.name)
    return text_of(message.content, where)


def to_suffixmem(messages: Sequence[BaseMessage]) -> list[Message]:
    """LangChain messages -> suffixmem messages, or ``InvalidRequestError`` naming the offending
    one. Leading system messages (a prompt template may stack several) become the one system
    prompt a suffixmem session has, joined by a blank line; a system message later in the
    conversation is left for the manager to refuse."""
    out: list[Message] = []
    leading = True  # still in the run of system messages that opens the conversation
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        msg = Message(role_of(m, where), content_of(m, where))
        if leading and msg.role == "system" and out:
            out[0] = Message("system", f"{out[0].content}\n\n{msg.content}")
            continue
        leading = leading and msg.role == "system"
        out.append(msg)
    last = messages[-1] if messages else None
    if isinstance(last, AIMessage) and last.tool_calls:
        # OpenAI refuses it too: a call waits for its result, not for another reply
        raise InvalidRequestError(
            f"messages[{len(messages) - 1}] is a tool call without its result: nothing to "
            "answer (send the ToolMessage with the tool's result after it)")
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
