"""Constants of the adapter tests (a plain module: tests import it by name)."""

from __future__ import annotations

from typing import Any

from suffixmem.config import DEFAULT_MODEL
from suffixmem.errors import ConfigError, InvalidRequestError
from suffixmem.models import models_dir

# the configuration of tests/conftest.py's ``vllm_engine``
ENGINE_OPTIONS: dict[str, Any] = {"max_model_len": 4096, "kv_cache_gib": 1.0}
MODEL_PARAMS: dict[str, Any] = {"model": DEFAULT_MODEL, "engine_options": ENGINE_OPTIONS}

# The torch engine (guided decoding by xgrammar): its own small configuration.
TORCH_OPTIONS: dict[str, Any] = {"max_model_len": 2048, "kv_cache_gib": 0.25}
TORCH_PARAMS: dict[str, Any] = {
    "engine": "torch", "model": DEFAULT_MODEL, "engine_options": TORCH_OPTIONS,
}

# LangChain's standard integration suites, on both engines: greedy, as the suite's defaults
# ask, and few tokens to keep them fast on a CPU; 64 fit its jokes and its unicode tool call
# (a Chinese name takes this byte-level tokenizer two to three tokens a character).
STANDARD_PARAMS: dict[str, Any] = {"max_tokens": 64, "temperature": 0.0}

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


def override_model() -> str:
    """Another ``model`` for the standard suites' per-call override tests: the default model's
    provisioned folder, by path (a model spec of its own, so another shared engine serves it)."""
    return str(models_dir() / DEFAULT_MODEL)

# Bad constructor arguments, the library error each must raise (one line, not pydantic's
# multi-line ValidationError) and what its message says; every adapter is checked with these.
BAD_CONSTRUCTION: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"max_tokens": -1}, InvalidRequestError, "max_tokens"),
    ({"timeout": 0}, InvalidRequestError, "timeout must be > 0"),
    ({"engine": "tensorrt"}, ConfigError, "unknown engine"),
    ({"engine_options": {"max_model_lenn": 64}}, ConfigError,
     r"unknown engine options \['max_model_lenn'\]"),
    ({"engine": "remote"}, ConfigError, "needs urls"),
    ({"engine_options": {"model": "x"}}, ConfigError, "the model is named twice"),
    # pydantic drops unknown keywords silently: a typo was a setting that did nothing
    ({"max_token": 5}, InvalidRequestError, r"unknown setting\(s\) \['max_token'\]"),
    # a scope the engine cannot serve: when the adapter is built, not at its first call
    ({"engine_options": {"isolation": "public-prefix"}}, ConfigError,
     "isolation 'public-prefix' is not supported by the vllm engine"),
    # the remote engine's database_url option is the manager's database (its pins live in
    # the session rows): named twice it must agree (a TypeError traceback before)
    ({"engine": "remote", "database_url": "sqlite:///a.db",
      "engine_options": {"urls": ["http://127.0.0.1:9"], "database_url": "sqlite:///b.db"}},
     ConfigError, "database_url is named twice"),
    # refused as a call refuses them, not coerced ("0.5" -> 0.5) by pydantic
    ({"temperature": "0.5"}, InvalidRequestError, "temperature must be a number, got str"),
    ({"top_k": 2.5}, InvalidRequestError, "top_k must be an integer, got float"),
    # pydantic's own checks, in one line naming the field
    ({"engine_options": [1]}, InvalidRequestError, "engine_options: Input should be"),
    ({"frequency_penalty": [0.5]}, InvalidRequestError, "frequency_penalty: Input should be"),
]
