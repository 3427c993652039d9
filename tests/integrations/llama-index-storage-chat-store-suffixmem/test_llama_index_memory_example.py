"""Smoke test of examples/llama_index_memory.py on the real model: a chat engine on ``Memory``
over suffixmem, each turn stored once, later turns reading earlier ones from cache."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from adapter_setup import MODEL_PARAMS
from llama_index.llms.suffixmem import SuffixMemLLM

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _example() -> ModuleType:
    path = Path(__file__).parents[3] / "examples" / "llama_index_memory.py"
    spec = importlib.util.spec_from_file_location("llama_index_memory_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_chat_engine_on_memory(shared_engine: Any, database_url: str) -> None:
    ex = _example()
    llm = SuffixMemLLM(**MODEL_PARAMS, session_id="mem-1", max_tokens=24, temperature=0.0,
                       database_url=database_url)
    engine = ex.build_chat_engine(llm, "mem-1")
    for q in ex.QUESTIONS[:2]:
        assert engine.chat(q).response.strip()
    manager = llm.get_manager()
    history = manager.history("mem-1")
    # each turn stored once: user, assistant, user, assistant (after the system prompt)
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant"]
    assert [m.content for m in history[::2]] == list(ex.QUESTIONS[:2])
    first, second = manager.store.turn_events("mem-1")
    assert second.cached_tokens >= (first.prompt_tokens + first.output_tokens) // 32 * 32 > 0
    # Memory reads the same messages back
    assert [str(m.content) for m in engine.chat_history] == [m.content for m in history]
