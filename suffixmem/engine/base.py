"""What every engine shares: the tokenizer trio, the request checks and the caller's API, on
top of the driver thread (``suffixmem.engine.driver``).

Contract for subclasses (``VLLMEngine``, ``TorchEngine``, ``RemoteEngine``):

- Call ``_load_tokenizer(path)`` (sets ``tokenizer`` and ``template``) and, once the model is
  ready, ``_start_driver(name)`` (or pass the loading as ``setup``: it then runs in the driver
  thread, see ``TorchEngine``).
- ``_prepare(request, prompt_ids) -> payload`` runs in the caller's thread before anything is
  queued; whatever it raises reaches the caller as ``InvalidRequestError`` (one line), and no
  outbox, cache entry or queue item is left behind.
- In the driver thread: ``_add(rid, payload)`` admits a request, ``_abort(rid)`` drops it,
  ``_has_work()`` says whether to step, ``_step()`` runs one step and
  ``_step_failed(error)`` fails the requests that step touched. A failure in ``_add`` fails that
  request alone; the driver survives every exception (blast radius of one).
- Results travel through per-request outboxes: ``_deliver(rid, item)``; an exception delivered
  ends that caller's stream with it. ``_exchange(rid, payload)`` is the caller's side.
- ``close()`` stops the driver and fails every pending caller (streaming, queued or waiting in
  ``run_in_driver``) with ``EngineClosedError``; nobody is left blocked.
"""

from __future__ import annotations

import atexit
import threading
import uuid
import weakref
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from suffixmem.chat_template import ChatTemplate
from suffixmem.engine.async_stream import aiter_events
from suffixmem.engine.driver import Driver, one_line
from suffixmem.engine.protocol import (
    EngineStats,
    Message,
    Request,
    Result,
    TokenEvent,
    final_result,
)
from suffixmem.errors import (
    ContextWindowError,
    EngineClosedError,
    InvalidRequestError,
    SuffixmemError,
)

__all__ = ["BaseEngine", "Event", "one_line"]

Event = TokenEvent | Result

# engines of a class with ``close_at_exit`` that their owner never closed (a script that ends
# without ``engine.close()``)
_OPEN: weakref.WeakSet[BaseEngine] = weakref.WeakSet()


@atexit.register
def _close_open_engines() -> None:
    """Close them before the interpreter tears down: their driver thread and the kernels'
    nanobind objects would outlive it (a screen of "nanobind: leaked ..." lines on stderr, and
    now and then "terminate called without an active exception")."""
    for engine in list(_OPEN):
        engine.close()


class BaseEngine(Driver):
    """Shared behaviour; see the module docstring for what a subclass provides."""

    name: str = "base"
    model_name: str = ""
    max_model_len: int = 0
    supports_json_schema: bool = False
    # closed at interpreter exit if still open (``_close_open_engines``); engines whose backend
    # has its own exit handlers (vLLM) leave it off
    close_at_exit: bool = False
    tokenizer: Any
    template: ChatTemplate

    def __init__(self) -> None:
        super().__init__()
        self._stats = EngineStats()
        self._stats_lock = threading.Lock()
        self._closed = False
        uuid.uuid4()  # a process's first os.urandom cost ~0.5 ms: not inside its first request

    def _start_driver(self, thread_name: str, setup: Callable[[], None] | None = None) -> None:
        super()._start_driver(thread_name, setup)
        # only an engine that finished starting is closed at exit: a half-built one (its model
        # failed to load) has nothing to close, and closing it would raise in the exit hook
        if self.close_at_exit:
            _OPEN.add(self)

    # -- tokenizer trio -------------------------------------------------------------------------
    def _load_tokenizer(self, path: Any) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.template = ChatTemplate(self.tokenizer)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` under the chat template (content never parsed)."""
        return self.template.render(messages, add_generation_prompt)

    def tokenize(self, text: str) -> list[int]:
        """Ids of ``text`` as plain text: special-token strings in it are split, not parsed.
        Cached (``ChatTemplate.piece_ids``): layouts tokenize the same passages every turn."""
        return self.template.piece_ids(text)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    # -- request checks -------------------------------------------------------------------------
    def prompt_ids(self, request: Request) -> list[int]:
        """The request's prompt ids, checked against the window (prompt + ``max_tokens``)."""
        if not isinstance(request, Request):
            raise InvalidRequestError(f"request must be a suffixmem Request, got "
                                      f"{type(request).__name__}")
        request.check()  # again: a Request is mutable and its fields may have changed
        if request.sampling.json_schema is not None and not self.supports_json_schema:
            raise InvalidRequestError(f"engine {self.name!r} does not support json_schema output")
        max_tokens = request.sampling.max_tokens
        if max_tokens >= self.max_model_len:
            raise InvalidRequestError(
                f"max_tokens={max_tokens} alone fills the context window of "
                f"{self.max_model_len} tokens; lower max_tokens")
        budget = self.max_model_len - max_tokens
        if request.token_ids is not None:
            ids = list(request.token_ids)
            vocab = len(self.tokenizer)
            # ``check`` made them non-negative ints: only the top can be out of range
            top = max(ids, default=0)
            if top >= vocab:
                raise InvalidRequestError(f"token_ids holds {top}, outside the vocabulary "
                                          f"0..{vocab - 1}")
        else:
            # rendering stops (and caches nothing) as soon as the budget is exceeded
            try:
                ids = self.template.render(request.messages or (), True, max_tokens=budget)
            except ContextWindowError as e:
                raise ContextWindowError(
                    e.prompt_tokens, self.max_model_len,
                    f"at least that many; with max_tokens={max_tokens} at most "
                    f"{budget} prompt tokens fit; shorten the conversation or lower max_tokens",
                ) from None
        if len(ids) > budget:
            raise ContextWindowError(
                len(ids), self.max_model_len,
                f"with max_tokens={max_tokens} the reply would not fit; shorten the "
                "conversation, lower max_tokens or raise max_model_len")
        return ids

    # -- generation -----------------------------------------------------------------------------
    def stream(self, request: Request) -> Iterator[Event]:
        """Check and prepare now (errors raise here), then stream events and the ``Result``."""
        if self._closed:
            raise EngineClosedError(f"engine {self.name!r} is closed")
        ids = self.prompt_ids(request)
        try:
            payload = self._prepare(request, ids)
        except SuffixmemError:
            raise
        except Exception as e:  # whatever this request alone cannot pass (a bad seed...)
            raise InvalidRequestError(f"request rejected: {one_line(e)}") from None
        return self._record(self._stream(request, ids, payload))

    def _record(self, events: Iterator[Event]) -> Iterator[Event]:
        for event in events:
            if isinstance(event, Result):
                with self._stats_lock:
                    self._stats.record(event)
            yield event

    @abstractmethod
    def _prepare(self, request: Request, prompt_ids: list[int]) -> Any:
        """Caller thread: build what ``_add`` needs; raise on anything it would reject."""

    @abstractmethod
    def _stream(self, request: Request, prompt_ids: list[int], payload: Any) -> Iterator[Event]:
        ...

    def generate(self, request: Request) -> Result:
        return final_result(self.stream(request))

    async def astream(self, request: Request) -> AsyncIterator[Event]:
        """``stream`` for asyncio: the blocking generator runs in a worker thread."""
        async for event in aiter_events(self.stream(request)):
            yield event

    async def agenerate(self, request: Request) -> Result:
        result: Result | None = None
        async for event in self.astream(request):
            if isinstance(event, Result):
                result = event
        if result is None:  # pragma: no cover - stream always ends in a Result or raises
            raise RuntimeError("engine stream ended without a Result")
        return result

    def stats(self) -> EngineStats:
        with self._stats_lock:
            s = self._stats
            return EngineStats(
                s.requests, s.prompt_tokens, s.cached_tokens, s.output_tokens,
                s.reused_segment_tokens, s.kv_capacity_bytes, s.kv_used_bytes, dict(s.extra),
            )

    def release_session(self, session_key: str) -> int:
        """Drop the session's cached segments; returns how many (0: no segment cache)."""
        return 0

    def reuse_passes_gate(self, workload: str) -> bool:
        """Whether this engine's approximate reuse passed the quality gate for ``workload``
        (``"rag"``) in the method and dtype it serves; False: it has no approximate reuse."""
        return False

    def delete_session_kv(self, session_key: str) -> int:
        """Forget a deleted session's KV tier files; returns how many (0: no tier)."""
        return 0

    def unavailable(self) -> str | None:
        """Why a request would fail now, in one line (None: the engine can serve)."""
        if self._closed:
            return f"engine {self.name!r} is closed"
        if self._driver is not None and not self._driver.is_alive():
            return f"engine {self.name!r} has stopped"
        return None

    @abstractmethod
    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix block not in use (runs in the driver thread)."""

    # -- closing --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the driver; every pending caller gets ``EngineClosedError``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_driver()
        try:
            self._shutdown()
        finally:
            self._release_heap()

    def _shutdown(self) -> None:
        """Release the backend after the driver stopped (default: nothing)."""
        return None

    def __enter__(self) -> BaseEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
