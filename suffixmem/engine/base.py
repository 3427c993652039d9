"""What every engine shares: the driver thread, the tokenizer trio and the request checks.

Contract for subclasses (``VLLMEngine``, ``TorchEngine``):

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

import logging
import queue
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

from suffixmem import heap
from suffixmem.chat_template import ChatTemplate
from suffixmem.engine.protocol import (
    EngineStats,
    Message,
    Request,
    Result,
    TokenEvent,
    aiter_events,
    final_result,
)
from suffixmem.errors import (
    ContextWindowError,
    EngineClosedError,
    InvalidRequestError,
    SuffixmemError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Event = TokenEvent | Result


class _Flight:
    """The caller's end of one request: its outbox; ``done`` once the request finished."""

    __slots__ = ("_release", "box", "done")

    def __init__(self, release: Callable[[], None]) -> None:
        self.box: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.done = False
        self._release = release

    def finish(self) -> None:
        """The request is over (its last item arrived): drop the outbox now, not when the
        caller's generator is finally closed or collected."""
        self.done = True
        self._release()

    def get(self) -> Any:
        item = self.box.get()
        if isinstance(item, BaseException):
            self.finish()  # the driver already dropped it: nothing to abort
            raise item
        return item


def one_line(error: BaseException) -> str:
    """``error`` as one line (library errors can span lines)."""
    text = " ".join(str(error).split())
    return text or type(error).__name__


class BaseEngine(ABC):
    """Shared behaviour; see the module docstring for what a subclass provides."""

    name: str = "base"
    model_name: str = ""
    max_model_len: int = 0
    supports_json_schema: bool = False
    tokenizer: Any
    template: ChatTemplate

    def __init__(self) -> None:
        self._stats = EngineStats()
        self._stats_lock = threading.Lock()
        self._closed = False
        self._stop = False
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._outboxes: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._driver: threading.Thread | None = None
        self._heap_held = False
        uuid.uuid4()  # a process's first os.urandom cost ~0.5 ms: not inside its first request

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

    @abstractmethod
    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix block not in use (runs in the driver thread)."""

    # -- caller side of the driver --------------------------------------------------------------
    @contextmanager
    def _exchange(self, rid: str, payload: Any) -> Iterator[_Flight]:
        """Register ``rid``'s outbox, queue it, and on exit abort it (if unfinished) and drop
        the outbox, so an abandoned or failed stream leaves nothing behind."""
        def release() -> None:
            with self._lock:
                self._outboxes.pop(rid, None)

        flight = _Flight(release)
        with self._lock:
            if self._stop:
                raise EngineClosedError(f"engine {self.name!r} is closed")
            if rid in self._outboxes:
                raise InvalidRequestError(f"request_id {rid!r} is already in flight")
            self._outboxes[rid] = flight
        try:
            self._submit("add", (rid, payload))
            yield flight
        finally:
            if not flight.done:
                self._submit("abort", rid)
            release()

    def _submit(self, op: str, arg: Any) -> None:
        self._inbox.put((op, arg))
        self._wake.set()

    def _deliver(self, rid: str, item: Any) -> None:
        with self._lock:
            flight = self._outboxes.get(rid)
        if flight is not None:
            flight.box.put(item)

    def run_in_driver(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(engine)`` in the driver thread between steps and return its result (or
        raise its exception): the safe way for other threads to touch engine state."""
        if threading.current_thread() is self._driver:
            return fn(self)
        fut: Future[T] = Future()
        with self._lock:
            if self._stop:
                raise EngineClosedError(f"engine {self.name!r} is closed")
            self._submit("call", (fn, fut))
        return fut.result()

    # -- the driver thread ----------------------------------------------------------------------
    def _start_driver(self, thread_name: str, setup: Callable[[], None] | None = None) -> None:
        """Start the driver thread. ``setup`` runs in it first (and this call waits for it):
        its exception is raised here, and no driver is left running."""
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            if setup is not None:
                try:
                    setup()
                except BaseException as e:  # re-raised in the constructing thread
                    failed.append(e)
                    ready.set()
                    return
            ready.set()
            self._drive()

        self._driver = threading.Thread(target=run, name=thread_name, daemon=True)
        self._driver.start()
        ready.wait()
        if failed:
            self._driver.join()
            self._driver = None
            raise failed[0]
        heap.hold()  # the loaded model and libraries out of full collections (suffixmem.heap)
        self._heap_held = True

    def _driver_context(self) -> Any:
        """A context the driver loop runs in (the torch engine: ``inference_mode``)."""
        from contextlib import nullcontext

        return nullcontext()

    def _drive(self) -> None:
        try:
            with self._driver_context():
                while not self._stop:
                    self._drain_inbox()
                    if self._stop:
                        break
                    if not self._has_work():
                        self._wake.wait()
                        self._wake.clear()
                        continue
                    try:
                        self._step()
                    except Exception as e:  # fails the step's requests; the driver goes on
                        log.exception("%s engine step failed", self.name)
                        self._step_failed(e)
        finally:
            self._fail_everything(EngineClosedError(f"engine {self.name!r} was closed"))

    def _take_inbox(self) -> Iterator[tuple[str, Any]]:
        """What callers queued so far, without waiting."""
        while True:
            try:
                yield self._inbox.get_nowait()
            except queue.Empty:
                return

    def _drain_inbox(self) -> None:
        for op, arg in self._take_inbox():
            if op == "add":
                rid, payload = arg
                try:
                    self._add(rid, payload)
                except Exception as e:  # this request alone fails
                    log.warning("request %s rejected at admission: %s", rid, one_line(e))
                    self._deliver(rid, self._as_request_error(e))
            elif op == "abort":
                try:
                    self._abort(arg)
                except Exception:  # already finished: nothing to abort
                    log.debug("abort of %s ignored", arg, exc_info=True)
            elif op == "call":
                fn, fut = arg
                try:
                    fut.set_result(fn(self))
                except Exception as e:
                    fut.set_exception(e)

    @staticmethod
    def _as_request_error(error: Exception) -> Exception:
        if isinstance(error, SuffixmemError):
            return error
        if isinstance(error, TypeError | ValueError | OverflowError | UnicodeError):
            return InvalidRequestError(f"request rejected: {one_line(error)}")
        return error

    def _fail_everything(self, error: EngineClosedError) -> None:
        """Fail whatever is queued or in flight (at close, or if the driver itself died)."""
        with self._lock:
            self._stop = True
            flights = list(self._outboxes.values())
        for op, arg in self._take_inbox():
            if op == "call":
                arg[1].set_exception(error)
        for flight in flights:
            flight.box.put(error)

    @abstractmethod
    def _add(self, rid: str, payload: Any) -> None: ...

    @abstractmethod
    def _abort(self, rid: str) -> None: ...

    @abstractmethod
    def _has_work(self) -> bool: ...

    @abstractmethod
    def _step(self) -> None: ...

    @abstractmethod
    def _step_failed(self, error: Exception) -> None: ...

    # -- closing --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the driver; every pending caller gets ``EngineClosedError``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._stop = True
        self._wake.set()
        if self._driver is not None and self._driver is not threading.current_thread():
            self._driver.join(timeout=30)
        # a driver stuck in a long step still must not leave callers blocked
        self._fail_everything(EngineClosedError(f"engine {self.name!r} was closed"))
        try:
            self._shutdown()
        finally:
            if self._heap_held:
                self._heap_held = False
                heap.release()

    def _shutdown(self) -> None:
        """Release the backend after the driver stopped (default: nothing)."""
        return None

    def __enter__(self) -> BaseEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
