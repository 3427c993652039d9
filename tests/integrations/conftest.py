"""Fixtures of the adapter tests: the session's engines registered in ``suffixmem.runtime`` (so
every adapter instance the tests, and LangChain's standard suites, build shares them), a
database per test, and a recorder of the usage each LlamaIndex LLM call reports."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from adapter_setup import ENGINE_OPTIONS, MODEL_PARAMS, TORCH_OPTIONS, TORCH_PARAMS

from suffixmem import runtime
from suffixmem.config import DEFAULT_MODEL


@pytest.fixture(scope="session", autouse=True)
def _default_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Adapters built without a ``database_url`` (the standard suites build them so) write to a
    throwaway database, never the user's."""
    url = f"sqlite:///{tmp_path_factory.mktemp('adapters') / 'default.db'}"
    before = os.environ.get("SUFFIXMEM_DATABASE_URL")
    os.environ["SUFFIXMEM_DATABASE_URL"] = url
    yield
    if before is None:
        os.environ.pop("SUFFIXMEM_DATABASE_URL", None)
    else:
        os.environ["SUFFIXMEM_DATABASE_URL"] = before


@pytest.fixture(scope="session", autouse=True)
def _close_started_engines() -> Iterator[None]:
    """Engines the tests started through the registry and left there (a per-call model override
    starts one of its own) are closed at the end of the run, after the fixtures' own."""
    yield
    runtime.close_all()


@pytest.fixture(scope="session")
def shared_engine(vllm_engine: Any) -> Iterator[Any]:
    """The session's vLLM engine, registered as the one ``get_engine`` returns for
    ``adapter_setup.MODEL_PARAMS``."""
    runtime.register_engine(vllm_engine, "vllm", model=DEFAULT_MODEL, **ENGINE_OPTIONS)
    yield vllm_engine
    runtime.unregister_engine(vllm_engine)  # closes its managers; the engine is conftest's


@pytest.fixture(scope="session")
def torch_engine() -> Iterator[Any]:
    """suffixmem's own torch engine, started through the registry (``TORCH_PARAMS``)."""
    engine = runtime.get_engine("torch", model=DEFAULT_MODEL, **TORCH_OPTIONS)
    yield engine
    runtime.unregister_engine(engine)
    engine.close()


@pytest.fixture(params=[pytest.param("vllm", marks=pytest.mark.vllm), "torch"])
def engine_params(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The adapters' parameters for each engine (``MODEL_PARAMS``, then ``TORCH_PARAMS``), its
    shared engine started: a test using this runs on both engines."""
    if request.param == "vllm":
        request.getfixturevalue("shared_engine")
        return dict(MODEL_PARAMS)
    request.getfixturevalue("torch_engine")
    return dict(TORCH_PARAMS)


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'adapters.db'}"


@pytest.fixture
def manager(shared_engine: Any, database_url: str) -> Any:
    """The shared manager the adapters of this test reach (same engine, same database)."""
    return runtime.get_manager(shared_engine, database_url=database_url)


@pytest.fixture
def usage_recorder() -> Iterator[Any]:
    """Collects ``raw["usage"]`` of every chat response LlamaIndex reports (as a user would,
    through LlamaIndex's instrumentation, since chat engines return only the text)."""
    from llama_index.core.bridge.pydantic import Field
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events import BaseEvent
    from llama_index.core.instrumentation.events.llm import LLMChatEndEvent

    class UsageRecorder(BaseEventHandler):
        usages: list[dict[str, Any]] = Field(default_factory=list)

        @classmethod
        def class_name(cls) -> str:
            return "UsageRecorder"

        def handle(self, event: BaseEvent, **kwargs: Any) -> None:
            if isinstance(event, LLMChatEndEvent) and event.response is not None:
                raw = event.response.raw or {}
                if "usage" in raw:
                    self.usages.append(raw["usage"])

    recorder = UsageRecorder()
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(recorder)
    try:
        yield recorder
    finally:
        dispatcher.event_handlers.remove(recorder)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database on SQLite, then on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'any.db'}"
    return str(request.getfixturevalue("fresh_pg_database"))
