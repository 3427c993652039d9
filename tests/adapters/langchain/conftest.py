"""Fixtures of the LangChain adapter tests: the session's vLLM engine, shared through
``suffixmem.client`` so every model instance the standard tests build uses it."""

from __future__ import annotations

from typing import Any

import pytest

from suffixmem import client
from suffixmem.config import DEFAULT_MODEL

# the configuration of tests/conftest.py's ``vllm_engine``
ENGINE_OPTIONS: dict[str, Any] = {"max_model_len": 4096, "kv_cache_gib": 1.0}
MODEL_PARAMS: dict[str, Any] = {"model": DEFAULT_MODEL, "engine_options": ENGINE_OPTIONS}


@pytest.fixture(scope="session")
def shared_engine(vllm_engine: Any) -> Any:
    """The session's vLLM engine, registered as the one ``get_engine`` returns for
    ``ENGINE_OPTIONS``."""
    client.register_engine(vllm_engine, "vllm", model=DEFAULT_MODEL, **ENGINE_OPTIONS)
    return vllm_engine
