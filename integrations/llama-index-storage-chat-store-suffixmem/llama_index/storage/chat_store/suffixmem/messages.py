"""Translation between LlamaIndex ``ChatMessage``s and suffixmem ``Message``s (text only).

The same module ships in llama-index-llms-suffixmem: each distribution
depends on suffixmem and llama-index-core only.
"""

from __future__ import annotations

from collections.abc import Sequence

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock

from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError

# ``additional_kwargs`` key of a reply the manager already stored: {"session_id", "index"}
STORED_KEY = "suffixmem_stored"

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
    if message.additional_kwargs.get("tool_calls"):
        raise InvalidRequestError(
            f"{where} carries tool calls; suffixmem models have no tool calling, so such a "
            "history cannot be rendered"
        )
    parts = []
    for block in message.blocks:
        if not isinstance(block, TextBlock):
            raise InvalidRequestError(
                f"{where} has a {type(block).__name__}; suffixmem models read text only"
            )
        parts.append(block.text)
    return Message(role, "".join(parts))


def to_suffixmem(messages: Sequence[ChatMessage]) -> list[Message]:
    return [to_suffixmem_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def to_llama_index(message: Message) -> ChatMessage:
    return ChatMessage(role=MessageRole(message.role), content=message.content)
