"""LlamaIndex's side of tool calling (``FunctionCallingLLM``): ``BaseTool``s into
``suffixmem.tool_calls`` specs, a reply into ``additional_kwargs["tool_calls"]`` (ids
included) and back into ``ToolSelection``s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.llms.llm import ToolSelection
from llama_index.llms.suffixmem.messages import RAW_KEY

from suffixmem.errors import InvalidRequestError
from suffixmem.tool_calls import ToolSpec, parse_reply


def specs(tools: Sequence[Any]) -> list[ToolSpec]:
    """``BaseTool``s (or ready ``ToolSpec``s) as specs: name, description, parameter schema."""
    out = []
    for t in tools:
        if isinstance(t, ToolSpec):
            out.append(t)
            continue
        meta = t.metadata
        out.append(ToolSpec(meta.get_name(), meta.description or "",
                            meta.get_parameters_dict()))
    return out


def reply_message(text: str, extra: dict[str, Any]) -> ChatMessage:
    """The assistant message of a reply generated under tools: the answer's text, or the calls
    in ``additional_kwargs["tool_calls"]`` (``{"id", "name", "arguments"}``); the generated
    text is kept as ``additional_kwargs[RAW_KEY]`` to be resent verbatim."""
    reply = parse_reply(text)
    kwargs: dict[str, Any] = {**extra, RAW_KEY: text}
    if reply.calls:
        kwargs["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.calls]
    elif reply.error is not None:
        kwargs["suffixmem_tool_error"] = reply.error
    return ChatMessage(role=MessageRole.ASSISTANT, content=reply.text, additional_kwargs=kwargs)


def tool_selections(response: ChatResponse, error_on_no_tool_call: bool) -> list[ToolSelection]:
    calls = response.message.additional_kwargs.get("tool_calls") or []
    if not calls and error_on_no_tool_call:
        if response.additional_kwargs.get("finish_reason") == "length":
            # the usual cause with a small max_tokens: a call cut off before its JSON closed
            raise InvalidRequestError(
                "the response has no complete tool call: it was cut off by max_tokens "
                f"(it answered: {response.message.content!r}); raise max_tokens")
        why = response.message.additional_kwargs.get("suffixmem_tool_error")
        raise InvalidRequestError(
            f"the response has no tool call{f' ({why})' if why else ''} "
            f"(it answered: {response.message.content!r})")
    return [ToolSelection(tool_id=c["id"], tool_name=c["name"], tool_kwargs=c["arguments"])
            for c in calls]
