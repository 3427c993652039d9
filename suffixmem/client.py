"""The small facade that framework adapters (``integrations/``) are built on.

Two things every adapter needs and none should re-implement:

1. **One engine per process and configuration.** Starting an engine takes seconds and the engine
   holds the KV cache, so every adapter instance in a process must share it:
   ``get_engine("vllm", max_model_len=4096)`` returns the same object for the same name and
   configuration, building it on first use (``suffixmem.engine.create_engine``).
   ``register_engine`` makes an engine built elsewhere the shared one.

2. **Cache-stable completion of a whole message list.** LangChain and LlamaIndex pass the full
   history on every call, with assistant turns as plain text. Re-tokenizing that text may not give
   back the ids the model generated, and then the prompt stops matching the cached KV at the first
   assistant turn. ``stream``/``complete`` remember each reply's generated token ids in a
   per-engine LRU keyed by ``(session_id, text)`` and render a re-sent assistant message from
   them, so turn after turn the prompt repeats the cached tokens bit for bit.

A message list is rendered with the model's chat template; a plain ``str`` prompt is tokenized
as is (raw completion). ``session_id`` is the engine's cache namespace (``Request.session_key``).
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from suffixmem.config import EngineConfig
from suffixmem.engine.protocol import (
    Engine,
    Message,
    Request,
    Result,
    SamplingParams,
    TokenEvent,
)
from suffixmem.errors import ConfigError, InvalidRequestError, UnknownSessionError

if TYPE_CHECKING:  # pragma: no cover
    from suffixmem.conversation.store import Store

__all__ = [
    "TokenMemory",
    "acomplete",
    "astream",
    "close_engines",
    "complete",
    "engine_supports_json_schema",
    "get_engine",
    "get_store",
    "read_history",
    "register_engine",
    "replace_history",
    "sampling_params",
    "schema_instruction",
    "stream",
    "token_memory",
    "unregister_engine",
    "usage",
    "write_history",
]

Prompt = Sequence[Message] | str

# -- the engine registry --------------------------------------------------------------------------

_engines: dict[tuple[str, str], Engine] = {}
_registry_lock = threading.Lock()


def _config(config: EngineConfig | None, options: dict[str, Any]) -> EngineConfig:
    if config is None:
        return EngineConfig(**options)
    if options:
        raise ConfigError("give either config or keyword options, not both")
    return config


def _key(name: str, config: EngineConfig) -> tuple[str, str]:
    # EngineConfig holds a dict (``extra``), so the key is its canonical JSON.
    return name, json.dumps(asdict(config), sort_keys=True, default=repr)


def get_engine(name: str = "vllm", config: EngineConfig | None = None, **options: Any) -> Engine:
    """The process-wide engine called ``name`` with ``config`` (or ``EngineConfig(**options)``).

    The first call builds it (seconds); later calls with an equal configuration return the same
    object. Do not ``close()`` a shared engine while others use it; ``close_engines`` closes all.
    """
    cfg = _config(config, options)
    key = _key(name, cfg)
    # One lock for all keys: building two engines at once would only slow both down.
    with _registry_lock:
        engine = _engines.get(key)
        if engine is None:
            from suffixmem.engine import create_engine

            engine = create_engine(name, cfg)
            _engines[key] = engine
        return engine


def register_engine(
    engine: Engine, name: str | None = None, config: EngineConfig | None = None, **options: Any
) -> None:
    """Make ``engine`` the shared one that ``get_engine(name, config or **options)`` returns.

    ``name`` defaults to ``engine.name``. Raises ``ConfigError`` if another engine is already
    registered under that key.
    """
    key = _key(name or engine.name, _config(config, options))
    with _registry_lock:
        current = _engines.get(key)
        if current is not None and current is not engine:
            raise ConfigError(f"another {key[0]!r} engine is already registered for that config")
        _engines[key] = engine


def unregister_engine(engine: Engine) -> bool:
    """Forget ``engine`` (without closing it): ``get_engine`` builds a new one next time.
    Returns whether it was registered."""
    with _registry_lock:
        keys = [k for k, e in _engines.items() if e is engine]
        for k in keys:
            del _engines[k]
    return bool(keys)


def close_engines() -> None:
    """Close and forget every shared engine (e.g. at the end of a script or test run)."""
    with _registry_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.close()


def engine_supports_json_schema(name_or_engine: str | Engine) -> bool:
    """Whether the engine (an instance, or an engine name) can constrain output to a JSON
    schema. A name is answered from the engine class, without starting an engine."""
    if not isinstance(name_or_engine, str):
        return bool(name_or_engine.supports_json_schema)
    if name_or_engine == "vllm":
        from suffixmem.engine.vllm_engine import VLLMEngine

        return bool(VLLMEngine.supports_json_schema)
    if name_or_engine == "torch":
        from suffixmem.engine.torch.engine import TorchEngine

        return bool(TorchEngine.supports_json_schema)
    raise ConfigError(f"unknown engine {name_or_engine!r}; expected 'vllm' or 'torch'")


# -- generated token ids of assistant turns -------------------------------------------------------


class TokenMemory:
    """LRU map ``(session_id, text) -> token ids`` of assistant replies, as generated.

    Only replies whose ids decode back to exactly their text are kept (a reply cut at a stop
    string has ids beyond its text; rendering those would put unseen text in the prompt).
    Thread-safe; ``capacity`` counts replies.
    """

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 1:
            raise ConfigError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, session_id: str, text: str, token_ids: Sequence[int]) -> None:
        key = (session_id, text)
        with self._lock:
            self._entries[key] = tuple(token_ids)
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def recall(self, session_id: str, text: str) -> tuple[int, ...] | None:
        key = (session_id, text)
        with self._lock:
            ids = self._entries.get(key)
            if ids is not None:
                self._entries.move_to_end(key)
            return ids

    def forget(self, session_id: str) -> int:
        """Drop the session's replies (e.g. when it is deleted); returns how many."""
        with self._lock:
            keys = [k for k in self._entries if k[0] == session_id]
            for k in keys:
                del self._entries[k]
            return len(keys)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


# Per engine: token ids are only meaningful for the engine's own tokenizer.
_memories: weakref.WeakKeyDictionary[Any, TokenMemory] = weakref.WeakKeyDictionary()
_memories_lock = threading.Lock()


def token_memory(engine: Engine) -> TokenMemory:
    """The ``TokenMemory`` of ``engine`` (created on first use)."""
    with _memories_lock:
        memory = _memories.get(engine)
        if memory is None:
            memory = _memories[engine] = TokenMemory()
        return memory


def _with_token_ids(
    memory: TokenMemory, session_id: str, messages: Sequence[Message]
) -> list[Message]:
    out = []
    for m in messages:
        if m.role == "assistant" and m.token_ids is None:
            ids = memory.recall(session_id, m.content)
            if ids is not None:
                m = Message("assistant", m.content, ids)
        out.append(m)
    return out


# -- completion -----------------------------------------------------------------------------------

_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)


def sampling_params(**values: Any) -> SamplingParams:
    """``SamplingParams`` from keyword values; ``None`` values take the default.

    Raises ``InvalidRequestError`` (a ``ValueError``) naming unknown or invalid values.
    """
    unknown = sorted(set(values) - _SAMPLING_FIELDS)
    if unknown:
        raise InvalidRequestError(
            f"unknown sampling parameter(s) {unknown}; expected some of {sorted(_SAMPLING_FIELDS)}"
        )
    given = {k: v for k, v in values.items() if v is not None}
    if "stop" in given:
        given["stop"] = tuple(given["stop"])
    return SamplingParams(**given)


def schema_instruction(json_schema: dict[str, Any]) -> Message:
    """The system message that shows the model the JSON schema its reply is constrained to.

    Guided decoding alone forces the syntax, not sensible content: a small model that does not
    know the schema tends to loop inside the first string until ``max_tokens`` cuts the JSON
    short (SmolLM2-135M, greedy: 3 of 7 LangChain test prompts). Shown the schema right before its
    reply, it closed all 7 within 34 tokens. Placed after the conversation, it leaves the
    cached prefix of the history untouched.
    """
    text = "Reply with a JSON object that matches this JSON schema:\n" + json.dumps(json_schema)
    return Message("system", text)


def _request(
    engine: Engine, session_id: str, prompt: Prompt, sampling: SamplingParams, show_schema: bool
) -> Request:
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt is empty: nothing to complete")
        return Request(session_id, token_ids=engine.tokenize(prompt), sampling=sampling)
    messages = _with_token_ids(token_memory(engine), session_id, prompt)
    if show_schema and sampling.json_schema is not None:
        messages.append(schema_instruction(sampling.json_schema))
    return Request(session_id, messages=messages, sampling=sampling)


def _record(engine: Engine, session_id: str, prompt: Prompt, result: Result) -> None:
    if isinstance(prompt, str) or result.finish_reason == "abort" or not result.token_ids:
        return
    if engine.detokenize(result.token_ids) == result.text:
        token_memory(engine).remember(session_id, result.text, result.token_ids)


def stream(
    engine: Engine,
    session_id: str,
    prompt: Prompt,
    sampling: SamplingParams | None = None,
    *,
    timeout: float | None = None,
    show_schema: bool = False,
) -> Iterator[TokenEvent | Result]:
    """Stream the reply to ``prompt``: ``TokenEvent``s, then one ``Result``.

    Bad input (unknown role, empty message, a prompt over the context window, json_schema on an
    engine without it) raises ``InvalidRequestError``/``ContextWindowError`` (``ValueError``s)
    here, before the first event. ``timeout`` (seconds, checked between tokens) aborts the
    request with ``TimeoutError``. Closing the iterator early aborts the request.
    ``show_schema`` appends ``schema_instruction`` to a message list whose sampling has a
    ``json_schema``.
    """
    if timeout is not None and timeout <= 0:
        raise InvalidRequestError(f"timeout must be > 0 seconds, got {timeout}")
    request = _request(engine, session_id, prompt, sampling or SamplingParams(), show_schema)
    events = engine.stream(request)  # validates now, not at the first next()
    return _events(engine, session_id, prompt, events, timeout)


def _events(
    engine: Engine,
    session_id: str,
    prompt: Prompt,
    events: Iterator[TokenEvent | Result],
    timeout: float | None,
) -> Iterator[TokenEvent | Result]:
    deadline = None if timeout is None else time.perf_counter() + timeout
    try:
        for event in events:
            if isinstance(event, Result):
                _record(engine, session_id, prompt, event)
            elif deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(f"no complete reply within {timeout} s; request aborted")
            yield event
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def complete(
    engine: Engine,
    session_id: str,
    prompt: Prompt,
    sampling: SamplingParams | None = None,
    *,
    timeout: float | None = None,
    show_schema: bool = False,
) -> Result:
    """The ``Result`` of ``stream`` (same contract)."""
    for event in stream(
        engine, session_id, prompt, sampling, timeout=timeout, show_schema=show_schema
    ):
        if isinstance(event, Result):
            return event
    raise RuntimeError("engine stream ended without a Result")


async def astream(
    engine: Engine,
    session_id: str,
    prompt: Prompt,
    sampling: SamplingParams | None = None,
    *,
    timeout: float | None = None,
    show_schema: bool = False,
) -> AsyncIterator[TokenEvent | Result]:
    """``stream`` for asyncio, on the engine's ``astream`` (the event loop is never blocked by
    the model). Errors of bad input are raised at the first iteration."""
    if timeout is not None and timeout <= 0:
        raise InvalidRequestError(f"timeout must be > 0 seconds, got {timeout}")
    request = _request(engine, session_id, prompt, sampling or SamplingParams(), show_schema)
    deadline = None if timeout is None else time.perf_counter() + timeout
    events = engine.astream(request)  # type: ignore[attr-defined]
    try:
        async for event in events:
            if isinstance(event, Result):
                _record(engine, session_id, prompt, event)
            elif deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(f"no complete reply within {timeout} s; request aborted")
            yield event
    finally:
        await events.aclose()


async def acomplete(
    engine: Engine,
    session_id: str,
    prompt: Prompt,
    sampling: SamplingParams | None = None,
    *,
    timeout: float | None = None,
    show_schema: bool = False,
) -> Result:
    """The ``Result`` of ``astream`` (same contract)."""
    result: Result | None = None
    async for event in astream(
        engine, session_id, prompt, sampling, timeout=timeout, show_schema=show_schema
    ):
        if isinstance(event, Result):
            result = event
    if result is None:
        raise RuntimeError("engine stream ended without a Result")
    return result


def usage(result: Result) -> dict[str, Any]:
    """The figures adapters report for one reply: token counts (model tokens), cached prompt
    tokens, time to first token and latency (seconds), finish reason and session."""
    return {
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "output_tokens": result.output_tokens,
        "total_tokens": result.prompt_tokens + result.output_tokens,
        "ttft_s": result.ttft_s,
        "latency_s": result.latency_s,
        "finish_reason": result.finish_reason,
        "session_id": result.session_key,
    }


# -- chat history in the conversation store -------------------------------------------------------

_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def get_store(database_url: str | None = None) -> Store:
    """The process-wide conversation store for ``database_url`` (default:
    ``suffixmem.config.default_database_url()``), opened (and migrated) on first use.

    History adapters are created per call by the frameworks, so they must share one store (one
    connection pool, one migration check) instead of opening their own.
    """
    from suffixmem.config import default_database_url

    url = database_url or default_database_url()
    with _stores_lock:
        store = _stores.get(url)
        if store is None:
            from suffixmem.conversation.store import Store

            store = _stores[url] = Store(url)
        return store


def read_history(store: Store, session_id: str, *, create: bool = True) -> list[Message]:
    """The session's messages in order (assistant turns with their generated token ids when
    stored). An unknown session reads as empty when ``create``; otherwise it raises
    ``UnknownSessionError`` (a ``KeyError``)."""
    try:
        return [m.to_message() for m in store.messages(session_id)]
    except UnknownSessionError:
        if create:
            return []
        raise


def write_history(
    store: Store, session_id: str, messages: Sequence[Message], *, create: bool = True
) -> None:
    """Append ``messages`` to the session in one transaction, creating the session first when
    ``create`` (otherwise an unknown session raises ``UnknownSessionError``)."""
    from suffixmem.conversation.store import NewMessage
    from suffixmem.tokens import TokenCounter

    counter = TokenCounter()  # no engine here: tiktoken's estimate, as the manager would
    rows = [
        NewMessage(
            m.role, m.content, m.token_ids,
            len(m.token_ids) if m.token_ids is not None else counter.count(m.content),
        )
        for m in messages
    ]
    if create:
        store.open_session(session_id)
    store.append_messages(session_id, rows)


def replace_history(
    store: Store, session_id: str, messages: Sequence[Message], *, create: bool = True
) -> None:
    """Make ``messages`` the session's whole history (clear, then append)."""
    if create:
        store.open_session(session_id)
    store.clear_history(session_id)
    if messages:
        write_history(store, session_id, messages, create=False)
