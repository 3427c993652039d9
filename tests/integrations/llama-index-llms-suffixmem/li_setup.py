"""Constants of the LlamaIndex adapter tests (a plain module: tests import it by name)."""

from __future__ import annotations

from typing import Any

from suffixmem.config import DEFAULT_MODEL

# the configuration of tests/conftest.py's ``vllm_engine``
ENGINE_OPTIONS: dict[str, Any] = {"max_model_len": 4096, "kv_cache_gib": 1.0}
LLM_PARAMS: dict[str, Any] = {"model": DEFAULT_MODEL, "engine_options": ENGINE_OPTIONS}
