"""What the LangChain chat model and LLM share: engine fields, sampling fields, and the
translation of a run's config into a suffixmem session."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.runnables import RunnableConfig, ensure_config
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from suffixmem import client
from suffixmem.config import DEFAULT_MODEL, EngineConfig
from suffixmem.engine.protocol import Engine, SamplingParams

# configurable keys naming the conversation, in order of preference
SESSION_KEYS = ("session_id", "thread_id")
# per-call keyword arguments that become sampling parameters
SAMPLING_KWARGS = frozenset(
    {"temperature", "top_p", "top_k", "max_tokens", "seed", "json_schema", "ignore_eos"}
)


def session_from_config(config: RunnableConfig | None) -> str | None:
    """``config["configurable"]["session_id"]`` or ``["thread_id"]`` (explicit config first,
    then the config of the enclosing runnable, as ``ensure_config`` merges them)."""
    configurable = ensure_config(config).get("configurable") or {}
    for key in SESSION_KEYS:
        value = configurable.get(key)
        if value is not None and value != "":
            return str(value)
    return None


def _new_session_id() -> str:
    return f"lc-{uuid.uuid4().hex[:16]}"


class SuffixMemParams(BaseModel):
    """Engine and sampling fields of the suffixmem LangChain models.

    ``engine`` is an engine name (``"vllm"``, ``"torch"``), started on first use and shared
    process-wide through ``suffixmem.client.get_engine(engine, model=model, **engine_options)``,
    or an engine instance. ``session_id`` is the cache namespace used when the run's config
    names none.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    engine: Any = Field(default="vllm", exclude=True)
    model: str = DEFAULT_MODEL
    engine_options: dict[str, Any] = Field(default_factory=dict)
    session_id: str = Field(default_factory=_new_session_id)
    temperature: float = 0.0
    max_tokens: int = 256
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    timeout: float | None = None
    """Seconds a call may take, checked between tokens; ``TimeoutError`` aborts it."""
    streaming: bool = False
    show_schema: bool = True
    """Show the model the JSON schema of structured output (a system message after the
    conversation) besides constraining decoding to it (``suffixmem.client.schema_instruction``)."""

    _engine: Engine | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_engine(self) -> SuffixMemParams:
        if isinstance(self.engine, str):
            # validate the options now (cheap) rather than when the engine first starts
            EngineConfig(model=self.model, **self.engine_options)
            client.engine_supports_json_schema(self.engine)  # unknown names raise here
        else:
            self._engine = self.engine
            self.model = self.engine.model_name
        client.sampling_params(**self._sampling_values({}))
        return self

    def get_engine(self) -> Engine:
        """The engine (started on first call, shared with every instance of equal config)."""
        if self._engine is None:
            self._engine = client.get_engine(self.engine, model=self.model, **self.engine_options)
        return self._engine

    @property
    def supports_json_schema(self) -> bool:
        """Whether the engine can constrain output to a JSON schema (``with_structured_output``)."""
        return client.engine_supports_json_schema(self._engine or self.engine)

    def _sampling_values(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            **{k: kwargs[k] for k in SAMPLING_KWARGS if k in kwargs},
        }

    def _call_args(
        self, stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[str, SamplingParams]:
        """The session and sampling of one call, from its keyword arguments and the instance.

        Unknown keyword arguments raise ``ValueError`` (rather than being silently dropped).
        """
        kwargs = dict(kwargs)
        session_id = kwargs.pop("session_id", None) or self.session_id
        model = kwargs.pop("model", None)
        if model is not None and model != self.model:
            raise ValueError(
                f"this instance serves {self.model!r}; per-call model override to {model!r} is "
                "not supported (create another instance)"
            )
        kwargs.pop("stream", None)  # LangChain's own streaming switch
        unknown = sorted(set(kwargs) - SAMPLING_KWARGS)
        if unknown:
            raise ValueError(
                f"unsupported keyword argument(s) {unknown}; accepted: "
                f"{sorted(SAMPLING_KWARGS | {'session_id', 'model'})}"
            )
        values = self._sampling_values(kwargs)
        values["stop"] = stop if stop is not None else self.stop
        return str(session_id), client.sampling_params(**values)


class SessionConfigMixin:
    """Passes the session named by the run's config (``configurable.session_id`` or
    ``thread_id``) down to ``_generate``/``_stream`` as the ``session_id`` keyword.

    LangChain hands a model's ``_generate``/``_stream`` only the callbacks and metadata of the
    config, not ``configurable``, so the public entry points read it here.
    """

    @staticmethod
    def _with_session(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        if kwargs.get("session_id") is None:
            session_id = session_from_config(config)
            if session_id is not None:
                kwargs = {**kwargs, "session_id": session_id}
        return kwargs

    def invoke(
        self, input: Any, config: RunnableConfig | None = None, *,
        stop: list[str] | None = None, **kwargs: Any,
    ) -> Any:
        return super().invoke(  # type: ignore[misc]
            input, config, stop=stop, **self._with_session(config, kwargs))

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, *,
        stop: list[str] | None = None, **kwargs: Any,
    ) -> Any:
        return await super().ainvoke(  # type: ignore[misc]
            input, config, stop=stop, **self._with_session(config, kwargs))

    def stream(
        self, input: Any, config: RunnableConfig | None = None, *,
        stop: list[str] | None = None, **kwargs: Any,
    ) -> Iterator[Any]:
        return super().stream(  # type: ignore[misc,no-any-return]
            input, config, stop=stop, **self._with_session(config, kwargs))

    def astream(
        self, input: Any, config: RunnableConfig | None = None, *,
        stop: list[str] | None = None, **kwargs: Any,
    ) -> AsyncIterator[Any]:
        return super().astream(  # type: ignore[misc,no-any-return]
            input, config, stop=stop, **self._with_session(config, kwargs))
