"""LangChain's standard integration tests for ``SuffixMemChatModel`` on the real model
(SmolLM2-135M-Instruct in the embedded vLLM engine, shared by every test); flags in
``langchain_standard.py``."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import MODEL_PARAMS
from langchain_core.messages import AIMessage
from langchain_standard import StandardFlags, cache_read_probe
from langchain_tests.integration_tests import ChatModelIntegrationTests

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.anyio]


class TestSuffixMemChatModelIntegration(StandardFlags, ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _shared(self, shared_engine: Any) -> None:
        """Every model instance the standard tests build uses the session's engine."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return dict(MODEL_PARAMS)

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        return cache_read_probe(MODEL_PARAMS, "cache-read-probe", stream)
