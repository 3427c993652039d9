"""Fixtures of the LangChain adapter tests: the session's vLLM engine, shared through
``suffixmem.client`` so every model instance the standard tests build uses it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lc_setup import ENGINE_OPTIONS, TORCH_OPTIONS

from suffixmem import client
from suffixmem.config import DEFAULT_MODEL


@pytest.fixture(scope="session")
def shared_engine(vllm_engine: Any) -> Any:
    """The session's vLLM engine, registered as the one ``get_engine`` returns for
    ``lc_setup.MODEL_PARAMS``."""
    client.register_engine(vllm_engine, "vllm", model=DEFAULT_MODEL, **ENGINE_OPTIONS)
    return vllm_engine


@pytest.fixture(scope="session")
def torch_engine() -> Iterator[Any]:
    """suffixmem's own torch engine, started through the registry (``lc_setup.TORCH_PARAMS``)
    and closed at the end."""
    engine = client.get_engine("torch", model=DEFAULT_MODEL, **TORCH_OPTIONS)
    yield engine
    client.unregister_engine(engine)
    engine.close()
