"""Constants of the adapter tests (a plain module: tests import it by name)."""

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

# A system prompt longer than one KV block (32 tokens on CPU), and a conversation with a topic
# jump (bread -> bread -> planets -> planets), for the adapter-against-manager comparisons.
SYSTEM = (
    "You are a concise assistant for a small bakery in Lyon. You answer every question in one "
    "short sentence, kindly, and you never invent prices or opening hours."
)
QUESTIONS = (
    "What flour do you use for your sourdough bread?",
    "How long does the sourdough bread dough rise?",
    "Which planet in the solar system has the most moons?",
    "How far is that planet from the sun?",
)
