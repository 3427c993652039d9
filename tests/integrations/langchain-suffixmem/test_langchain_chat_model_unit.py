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
    # structured output and JSON mode by guided decoding (vLLM, or xgrammar on the torch
    # engine); usage with cached prompt tokens; a per-call model override (another engine).
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
    def supports_anthropic_inputs(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        return "another-model"  # never loaded here: unit tests only trace the name
