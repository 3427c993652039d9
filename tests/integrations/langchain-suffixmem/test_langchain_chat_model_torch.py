"""LangChain's standard integration tests for ``SuffixMemChatModel`` on suffixmem's own torch
engine, which has no guided decoding: its flags say so, and only those tests are skipped."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import TORCH_PARAMS
from langchain_suffixmem import SuffixMemChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


class TestSuffixMemChatModelTorchEngine(ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _shared(self, torch_engine: Any) -> None:
        """Every model instance the standard tests build uses the session's torch engine."""

    @property
    def chat_model_class(self) -> type[SuffixMemChatModel]:
        return SuffixMemChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return dict(TORCH_PARAMS)

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return {"max_tokens": 24, "temperature": 0.0}

    # No JSON-schema guided decoding on this engine: no tool calling (bind_tools raises
    # NotImplementedError), no structured output, no JSON mode.
    @property
    def has_tool_calling(self) -> bool:
        return SuffixMemChatModel(**TORCH_PARAMS).supports_json_schema

    @property
    def has_tool_choice(self) -> bool:
        return self.has_tool_calling

    @property
    def has_structured_output(self) -> bool:
        return SuffixMemChatModel(**TORCH_PARAMS).supports_json_schema

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return False
