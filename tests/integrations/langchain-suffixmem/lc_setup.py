"""Constants of the LangChain adapter tests (a plain module: tests import it by name)."""

from __future__ import annotations

from typing import Any

from suffixmem.config import DEFAULT_MODEL

# the configuration of tests/conftest.py's ``vllm_engine``
ENGINE_OPTIONS: dict[str, Any] = {"max_model_len": 4096, "kv_cache_gib": 1.0}
MODEL_PARAMS: dict[str, Any] = {"model": DEFAULT_MODEL, "engine_options": ENGINE_OPTIONS}

# The torch engine (no guided decoding): its own small configuration.
TORCH_OPTIONS: dict[str, Any] = {"max_model_len": 2048, "kv_cache_gib": 0.25}
TORCH_PARAMS: dict[str, Any] = {
    "engine": "torch", "model": DEFAULT_MODEL, "engine_options": TORCH_OPTIONS,
}
