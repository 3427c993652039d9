"""Fixtures of the LlamaIndex adapter tests: the session's vLLM engine, shared through
``suffixmem.client``, and a recorder of the usage each LLM call reports."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from li_setup import ENGINE_OPTIONS
from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent

from suffixmem import client
from suffixmem.config import DEFAULT_MODEL


@pytest.fixture(scope="session")
def shared_engine(vllm_engine: Any) -> Any:
    """The session's vLLM engine, registered as the one ``get_engine`` returns for
    ``li_setup.LLM_PARAMS``."""
    client.register_engine(vllm_engine, "vllm", model=DEFAULT_MODEL, **ENGINE_OPTIONS)
    return vllm_engine


class UsageRecorder(BaseEventHandler):
    """Collects ``raw["usage"]`` of every chat response LlamaIndex reports (as a user would,
    through LlamaIndex's instrumentation, since chat engines return only the text)."""

    usages: list[dict[str, Any]] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "UsageRecorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, LLMChatEndEvent) and event.response is not None:
            raw = event.response.raw or {}
            if "usage" in raw:
                self.usages.append(raw["usage"])


@pytest.fixture
def usage_recorder() -> Iterator[UsageRecorder]:
    recorder = UsageRecorder()
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(recorder)
    try:
        yield recorder
    finally:
        dispatcher.event_handlers.remove(recorder)
