"""LangChain's standard unit tests for ``SuffixMemChatModel`` (no model is loaded)."""

from __future__ import annotations

from typing import Any

from langchain_suffixmem import SuffixMemChatModel
from langchain_tests.unit_tests import ChatModelUnitTests

# the engine is started lazily, so construction needs no model
PARAMS: dict[str, Any] = {"model": "smollm2-135m-instruct"}


class TestSuffixMemChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[SuffixMemChatModel]:
        return SuffixMemChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return dict(PARAMS)

    # Capability flags, truthfully: text in and out only; tool calling (with tool_choice),
    # structured output and JSON mode by the vLLM engine's guided decoding; usage
    # with cached prompt tokens; one model per engine, so no per-call model override.
    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return False
