"""What the LangChain chat model and LLM share: engine and sampling fields, the shared
``ConversationManager`` they call, and the translation of a run's config into a session."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.runnables import RunnableConfig, ensure_config
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_serializer

from suffixmem import runtime
from suffixmem.chat_template import ChatTemplate
from suffixmem.config import DEFAULT_MODEL, mask_url
from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.conversation.validation import check_settings, one_line_settings
from suffixmem.engine import check_engine
from suffixmem.engine.protocol import SamplingParams
from suffixmem.errors import InvalidRequestError, ModelError

# configurable keys naming the conversation, in order of preference
SESSION_KEYS = ("session_id", "thread_id")
# per-call keyword arguments that become sampling parameters
SAMPLING_KWARGS = frozenset(
    {"temperature", "top_p", "top_k", "max_tokens", "seed", "json_schema", "ignore_eos",
     "frequency_penalty", "presence_penalty"}
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


class SuffixMemParams(BaseModel):
    """Engine, database and sampling fields of the suffixmem LangChain models.

    ``engine`` is an engine name (``"vllm"``, ``"torch"``), started on first use and shared
    process-wide (``suffixmem.runtime.get_engine(engine, model=model, **engine_options)``), or
    an engine instance. Every call goes through the process-wide ``ConversationManager`` of that
    engine and ``database_url`` (``suffixmem.runtime.get_manager``). ``session_id`` is the
    session used when the run's config names none; ``None`` (the default) is stateless: nothing
    is stored, the cache namespace is derived from the conversation's start.

    Sampling fields left ``None`` take the manager's defaults; ``temperature=None`` is the
    session's semantic temperature (it drops on a topic jump).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    engine: Any = "vllm"
    model: str = DEFAULT_MODEL
    engine_options: dict[str, Any] = Field(default_factory=dict)
    database_url: str | None = None
    manager_config: ManagerConfig | None = Field(default=None, exclude=True)
    """The manager's settings (``ManagerConfig``: ``rag_reuse``, ``layout``, ...); instances
    with equal configs share one manager and its session locks."""
    session_id: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    timeout: float | None = None
    """Seconds a call may take, checked between tokens; ``TimeoutError`` aborts it (nothing is
    stored)."""
    streaming: bool = False
    stream_usage: bool = True
    """Accepted as ``ChatOpenAI`` takes it (also per call); usage always rides on the last
    streamed chunk."""
    show_schema: bool = True
    """Show the model the JSON schema of structured output (a system message after the
    conversation, not stored) besides constraining decoding to it."""

    max_retries: int | None = None
    """Accepted as ``ChatOpenAI`` takes it, and unused: a local engine makes no network call
    to retry (a remote one fails over between replicas itself)."""
    api_key: SecretStr | None = Field(default=None, exclude=True, repr=False)
    """Accepted as ``ChatOpenAI`` takes it, and unused: a local engine needs no key."""

    _manager: ConversationManager | None = PrivateAttr(default=None)

    def __getstate__(self) -> dict[Any, Any]:
        # the manager is process-wide (runtime.get_manager rebuilds it on first use); its
        # worker threads and queues cannot be pickled
        state = super().__getstate__()
        private = dict(state.get("__pydantic_private__") or {})
        private["_manager"] = None
        return {**state, "__pydantic_private__": private}

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        memo = {} if memo is None else memo
        for shared in (self.engine, self._manager):  # process-wide: a copy shares them
            if shared is not None and not isinstance(shared, str):
                memo[id(shared)] = shared
        return super().__deepcopy__(memo)

    @field_serializer("engine", when_used="json")
    def _engine_json(self, engine: Any) -> str:
        # an engine instance stays itself in ``model_dump()`` (a copy shares it); JSON names it
        return self._engine_name()

    def _engine_name(self) -> str:
        return self.engine if isinstance(self.engine, str) else str(self.engine.name)

    def __init__(self, **data: Any) -> None:
        # LangChain's standard chat-model settings (``langchain_tests``' params, ChatOpenAI's):
        # a local engine needs no key and makes no network call to retry
        check_settings(type(self).__name__, data, type(self), accepted=("base_url",))
        with one_line_settings(type(self).__name__):
            super().__init__(**data)
        # checked here, not in a pydantic validator, which would wrap the library's one-line
        # InvalidRequestError / ConfigError into a multi-line ValidationError
        self._check_engine()

    def _check_engine(self) -> None:
        # a remote engine's database_url option is the manager's database too (its pins)
        self.database_url, self.engine_options = runtime.database_of(self.database_url,
                                                                     self.engine_options)
        if isinstance(self.engine, str):
            # validate the name and options now (cheap) rather than when the engine first starts
            check_engine(self.engine, self.engine_options, model=self.model)
        else:
            self.model = self.engine.model_name
        self.call_timeout({})  # the instance's timeout, checked as a call's
        # the instance's sampling values, checked now (the engine's own checks) rather than
        # at the first call
        SamplingParams(**self._call_args(None, {})[1])

    def get_manager(self) -> ConversationManager:
        """The shared manager (its engine started on first call)."""
        if self._manager is None:
            if isinstance(self.engine, str):
                self._manager = runtime.get_manager(
                    self.engine, database_url=self.database_url, config=self.manager_config,
                    model=self.model, **self.engine_options)
            else:
                self._manager = runtime.get_manager(self.engine, database_url=self.database_url,
                                                    config=self.manager_config)
        return self._manager

    def _call_manager(self, kwargs: dict[str, Any]) -> tuple[ConversationManager, str]:
        """The manager and model name of one call: the instance's, or for a per-call ``model``
        override that model's shared engine (same engine name and options, started on first
        use) and its manager. An instance built on an engine object serves that engine's model
        only."""
        model = kwargs.get("model")
        if model is None or model == self.model:
            return self.get_manager(), self.model
        if not isinstance(model, str) or not model.strip():
            raise InvalidRequestError(f"model must be a non-empty string, got {model!r}")
        if not isinstance(self.engine, str):
            raise InvalidRequestError(
                f"model: this instance's engine serves {self.model!r}; a per-call override to "
                f"{model!r} needs an engine name (engine='vllm' or 'torch')")
        try:
            manager = runtime.get_manager(self.engine, database_url=self.database_url,
                                          config=self.manager_config, model=model,
                                          **self.engine_options)
        except ModelError as e:  # an unknown model is bad input to this call
            raise InvalidRequestError(f"model: {e}") from None
        return manager, model

    @property
    def supports_json_schema(self) -> bool:
        """Whether the engine can constrain output to a JSON schema (``with_structured_output``)."""
        return runtime.supports_json_schema(self.engine)

    def call_timeout(self, kwargs: dict[str, Any]) -> float | None:
        """The call's ``timeout`` keyword argument, else the instance's (seconds, > 0)."""
        timeout = kwargs.get("timeout", self.timeout)
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout <= 0):
            raise InvalidRequestError(f"timeout must be > 0 seconds, got {timeout!r}")
        return timeout

    def _cache_params(self) -> dict[str, Any]:
        """Every instance field that changes a reply: LangChain's response cache keys on
        ``_identifying_params``, and two instances that differ in one of these must not share
        an entry (as two differently set ``ChatOpenAI`` do not)."""
        fields = ("model", "engine_options", "session_id", "temperature", "max_tokens",
                  "top_p", "top_k", "seed", "stop", "frequency_penalty", "presence_penalty",
                  "show_schema")
        # the parameters also go to tracing (LangSmith's invocation params): no password
        database = mask_url(self.database_url) if self.database_url else None
        return {"engine": self._engine_name(), "database_url": database,
                "manager_config": repr(self.manager_config),
                **{f: getattr(self, f) for f in fields}}

    def _template(self) -> ChatTemplate:
        """The model's tokenizer and chat template: the engine's once it runs, else loaded
        from the local model folder (no engine starts; nothing is downloaded)."""
        engine = self._manager.engine if self._manager is not None else self.engine
        template = getattr(engine, "template", None)
        return template if isinstance(template, ChatTemplate) else model_template(self.model)

    def get_token_ids(self, text: str) -> list[int]:
        """Ids of ``text`` under the model's own tokenizer (LangChain's default is GPT-2's,
        fetched from a model hub)."""
        if self.custom_get_token_ids is not None:  # type: ignore[attr-defined]
            return list(self.custom_get_token_ids(text))  # type: ignore[attr-defined]
        return list(self._template().piece_ids(text))

    def _call_args(
        self, stop: list[str] | None, kwargs: dict[str, Any]
    ) -> tuple[str | None, dict[str, Any]]:
        """The session and sampling values of one call, from its keyword arguments and the
        instance (``model`` is ``_call_manager``'s). Unknown keyword arguments raise
        ``InvalidRequestError`` (rather than being silently dropped); the values themselves are
        checked by the manager."""
        kwargs = dict(kwargs)
        # an explicit ``session_id=None`` is stateless for this call, not the instance's session
        session_id = kwargs.pop("session_id") if "session_id" in kwargs else self.session_id
        kwargs.pop("model", None)  # the call's engine: ``_call_manager``
        kwargs.pop("stream", None)  # LangChain's own streaming switch
        kwargs.pop("stream_usage", None)  # ChatOpenAI's; usage is always on the last chunk
        kwargs.pop("timeout", None)  # the call's deadline: ``call_timeout``
        unknown = sorted(set(kwargs) - SAMPLING_KWARGS)
        if unknown:
            raise InvalidRequestError(
                f"unsupported keyword argument(s) {unknown}; accepted: "
                f"{sorted(SAMPLING_KWARGS | {'session_id', 'model', 'timeout'})}"
            )
        if isinstance(stop, str):  # one stop sequence, as OpenAI's API takes it
            stop = [stop]
        values = {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "max_tokens": self.max_tokens, "seed": self.seed,
            "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
            "stop": tuple(stop) if stop is not None else
            (tuple(self.stop) if self.stop is not None else None),
            **kwargs,
        }
        # None means "the default": leave it out so the manager decides
        return session_id, {k: v for k, v in values.items() if v is not None}


@functools.cache
def model_template(model: str) -> ChatTemplate:
    """``model``'s chat template, from its local folder (``suffixmem.models.resolve_model``)."""
    from transformers import AutoTokenizer

    from suffixmem.models import resolve_model

    return ChatTemplate(AutoTokenizer.from_pretrained(str(resolve_model(model))))


def with_deadline(events: Iterator[Any], timeout: float | None) -> Iterator[Any]:
    """``events`` aborted (closed, so the turn stores nothing) with ``TimeoutError`` once
    ``timeout`` seconds have passed, checked between tokens."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    try:
        for event in events:
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(f"no complete reply within {timeout} s; request aborted")
            yield event
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


async def awith_deadline(events: AsyncIterator[Any], timeout: float | None) -> AsyncIterator[Any]:
    """The asyncio twin of ``with_deadline``."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    try:
        async for event in events:
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(f"no complete reply within {timeout} s; request aborted")
            yield event
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


class SessionConfigMixin:
    """Passes the session named by the run's config (``configurable.session_id`` or
    ``thread_id``) down to ``_generate``/``_stream`` as the ``session_id`` keyword.

    LangChain hands a model's ``_generate``/``_stream`` only the callbacks and metadata of the
    config, not ``configurable``, so the public entry points read it here.
    """

    @staticmethod
    def _with_session(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        if "session_id" not in kwargs:  # a call's own session_id (None: stateless) wins
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
