"""``suffixmem.client``: the engine registry, the token memory, sampling and history helpers
(no model; the adapters' tests run the rest on the real model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from suffixmem import client
from suffixmem.config import EngineConfig
from suffixmem.engine.protocol import Message
from suffixmem.errors import ConfigError, InvalidRequestError, UnknownSessionError


class FakeEngine:
    """Only what the registry looks at; never generates."""

    name = "vllm"
    model_name = "m"
    max_model_len = 64
    supports_json_schema = True

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_registry_shares_one_engine_per_config() -> None:
    engine = FakeEngine()
    client.register_engine(engine, max_model_len=123, kv_cache_gib=0.25)  # type: ignore[arg-type]
    try:
        # equal configs, however spelled, give the same engine without building one
        assert client.get_engine("vllm", max_model_len=123, kv_cache_gib=0.25) is engine
        assert client.get_engine(
            "vllm", EngineConfig(kv_cache_gib=0.25, max_model_len=123)) is engine
        client.register_engine(engine, "vllm", max_model_len=123, kv_cache_gib=0.25)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="already registered"):
            client.register_engine(FakeEngine(), max_model_len=123, kv_cache_gib=0.25)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="either config or keyword options"):
            client.get_engine("vllm", EngineConfig(), max_model_len=123)
    finally:
        assert client.unregister_engine(engine)  # type: ignore[arg-type]
    assert not client.unregister_engine(engine)  # type: ignore[arg-type]


def test_close_engines_closes_and_forgets() -> None:
    # set aside engines other tests registered (the session's real vLLM engine): this test
    # must close only its own
    saved = dict(client._engines)
    client._engines.clear()
    engine = FakeEngine()
    try:
        client.register_engine(engine, max_model_len=77)  # type: ignore[arg-type]
        client.close_engines()
        assert engine.closed and not client._engines
    finally:
        client._engines.clear()
        client._engines.update(saved)


def test_json_schema_support_by_name_and_instance() -> None:
    assert client.engine_supports_json_schema("vllm") is True
    assert client.engine_supports_json_schema("torch") is False
    assert client.engine_supports_json_schema(FakeEngine()) is True  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown engine"):
        client.engine_supports_json_schema("tensorrt")


def test_token_memory_is_an_lru_per_session() -> None:
    memory = client.TokenMemory(capacity=2)
    memory.remember("a", "hi", [1, 2])
    memory.remember("b", "hi", [3])
    assert memory.recall("a", "hi") == (1, 2) and memory.recall("b", "hi") == (3,)
    assert memory.recall("a", "other") is None
    memory.recall("a", "hi")  # now "b" is the least recently used
    memory.remember("a", "bye", [4])
    assert memory.recall("b", "hi") is None and len(memory) == 2
    assert memory.forget("a") == 2 and len(memory) == 0
    with pytest.raises(ConfigError):
        client.TokenMemory(capacity=0)


def test_token_memory_is_per_engine() -> None:
    one, two = FakeEngine(), FakeEngine()
    client.token_memory(one).remember("s", "t", [1])  # type: ignore[arg-type]
    assert client.token_memory(one) is client.token_memory(one)  # type: ignore[arg-type]
    assert client.token_memory(two).recall("s", "t") is None  # type: ignore[arg-type]


def test_sampling_params() -> None:
    p = client.sampling_params(max_tokens=5, stop=["x"], temperature=None, top_k=None)
    assert p.max_tokens == 5 and p.stop == ("x",) and p.temperature == 0.0 and p.top_k == -1
    with pytest.raises(InvalidRequestError, match="unknown sampling parameter"):
        client.sampling_params(frequency_penalty=1.0)
    with pytest.raises(ValueError, match="max_tokens"):
        client.sampling_params(max_tokens=0)


def test_schema_instruction_shows_the_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    m = client.schema_instruction(schema)
    assert m.role == "system" and m.content.endswith(
        '{"type": "object", "properties": {"a": {"type": "string"}}}')


def test_history_helpers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    store = client.get_store(url)
    assert client.get_store(url) is store
    assert client.read_history(store, "s") == []
    with pytest.raises(UnknownSessionError):
        client.read_history(store, "s", create=False)
    with pytest.raises(UnknownSessionError):
        client.write_history(store, "s", [Message("user", "hi")], create=False)
    client.write_history(store, "s", [Message("user", "hi"), Message("assistant", "yo", (5, 6))])
    assert client.read_history(store, "s") == [
        Message("user", "hi"), Message("assistant", "yo", (5, 6))]
    assert [m.token_count for m in store.messages("s")][1] == 2  # the generated ids
    client.replace_history(store, "s", [Message("user", "new")])
    assert client.read_history(store, "s") == [Message("user", "new")]
    client.replace_history(store, "s", [])
    assert client.read_history(store, "s") == []
