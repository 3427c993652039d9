"""Fixtures of the LangChain adapter tests: the session's vLLM engine, shared through
``suffixmem.client`` so every model instance the standard tests build uses it."""

from __future__ import annotations

from typing import Any

import pytest
from lc_setup import ENGINE_OPTIONS

from suffixmem import client
from suffixmem.config import DEFAULT_MODEL


@pytest.fixture(scope="session")
def shared_engine(vllm_engine: Any) -> Any:
    """The session's vLLM engine, registered as the one ``get_engine`` returns for
    ``lc_setup.MODEL_PARAMS``."""
    client.register_engine(vllm_engine, "vllm", model=DEFAULT_MODEL, **ENGINE_OPTIONS)
    return vllm_engine
