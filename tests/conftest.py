"""Shared fixtures. The real model is provisioned once into the default SUFFIXMEM_HOME (the user
cache, or $SUFFIXMEM_HOME) and shared by every test; engines are session-scoped because
starting one takes seconds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default model's bf16 safetensors folder (converted on first use)."""
    from suffixmem.models import resolve_model

    return resolve_model(progress=False)


@pytest.fixture(scope="session")
def tokenizer(model_path: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path))


@pytest.fixture(scope="session")
def vllm_engine(model_path: Path) -> Iterator[object]:
    """One embedded vLLM engine for the whole run (prefix caching on)."""
    from suffixmem.engine import create_engine

    engine = create_engine("vllm", max_model_len=4096, kv_cache_gib=1.0)
    yield engine
    engine.close()
