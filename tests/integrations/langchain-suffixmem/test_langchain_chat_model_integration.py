"""LangChain's standard integration tests for ``SuffixMemChatModel`` on the real model
(SmolLM2-135M-Instruct in the embedded vLLM engine, shared by every test)."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import MODEL_PARAMS
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_suffixmem import SuffixMemChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.anyio]

# A prompt longer than one KV block (32 tokens on CPU), so a repeat hits the prefix cache.
LONG_SYSTEM = (
    "You are a concise assistant for a bakery. You answer questions about bread, opening hours "
    "and prices in one short sentence. The bakery opens at seven and closes at six."
)


class TestSuffixMemChatModelIntegration(ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _shared(self, shared_engine: Any) -> None:
        """Every model instance the standard tests build uses the session's engine."""

    @property
    def chat_model_class(self) -> type[SuffixMemChatModel]:
        return SuffixMemChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return dict(MODEL_PARAMS)

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        # few tokens keep the suite fast on a CPU; 48 fit the jokes of the structured tests.
        # Greedy, as the suite's own defaults ask (temperature 0): sampled at the semantic
        # temperature this 135M model's JSON often runs past 48 tokens.
        return {"max_tokens": 48, "temperature": 0.0}

    # Capability flags, truthfully (see the unit test class).
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

    @property
    def supported_usage_metadata_details(self) -> dict[Any, list[Any]]:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """The second of two identical calls in one session: its prompt is read from cache."""
        model = SuffixMemChatModel(**MODEL_PARAMS, max_tokens=8, session_id="cache-read-probe")
        messages = [SystemMessage(LONG_SYSTEM), HumanMessage("When do you open?")]
        model.invoke(messages)
        if not stream:
            message = model.invoke(messages)
        else:
            full = None
            for chunk in model.stream(messages):
                full = chunk if full is None else full + chunk
            assert full is not None
            message = AIMessage(
                content=full.content, usage_metadata=full.usage_metadata,
                response_metadata=full.response_metadata,
            )
        usage = message.usage_metadata
        assert usage is not None and usage["input_token_details"]["cache_read"] > 0, usage
        return message

    @pytest.mark.xfail(reason="the Chinese tool name and a free description take this "
                       "byte-level tokenizer more than the suite's 48 tokens, and a call cut "
                       "off by max_tokens is (rightly) no tool call; "
                       "test_unicode_tool_call_with_room runs it with room")
    def test_unicode_tool_call_integration(  # type: ignore[override]
        self, model: SuffixMemChatModel, **kwargs: Any
    ) -> None:
        super().test_unicode_tool_call_integration(model, **kwargs)

    def test_unicode_tool_call_with_room(self, **kwargs: Any) -> None:
        """The suite's unicode tool-call test with room for the call (192 tokens)."""
        roomy = SuffixMemChatModel(**MODEL_PARAMS, max_tokens=192, temperature=0.0)
        super().test_unicode_tool_call_integration(roomy, **kwargs)
