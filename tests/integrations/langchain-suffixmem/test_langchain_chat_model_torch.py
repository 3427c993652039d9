"""LangChain's standard integration tests for ``SuffixMemChatModel`` on suffixmem's own torch
engine (guided decoding by xgrammar): the same flags as on vLLM (``langchain_standard.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import TORCH_PARAMS
from langchain_core.messages import AIMessage
from langchain_standard import StandardFlags, cache_read_probe
from langchain_tests.integration_tests import ChatModelIntegrationTests

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


class TestSuffixMemChatModelTorchEngine(StandardFlags, ChatModelIntegrationTests):
    @pytest.fixture(autouse=True)
    def _shared(self, torch_engine: Any) -> None:
        """Every model instance the standard tests build uses the session's torch engine."""

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return dict(TORCH_PARAMS)

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        return cache_read_probe(TORCH_PARAMS, "torch-cache-read-probe", stream)
