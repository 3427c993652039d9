"""The engine's driver thread: one thread owns the backend, callers talk to it by queue.

Callers queue ``add``/``abort``/``call`` items in one inbox and read their request's results
from its own outbox (``_Flight``); the driver thread drains the inbox between steps and runs
one ``_step()`` while there is work. Why one thread: the backends (vLLM's in-process engine
core, the torch engine's scheduler and KV pool) are not thread-safe, and a single owner makes
every cache mutation ordered without locks around model code.

Contract for subclasses (``BaseEngine`` and through it every engine): implement ``_add(rid,
payload)`` (admit; an exception fails that request alone), ``_abort(rid)``, ``_has_work()``,
``_step()`` and ``_step_failed(error)`` (fail the requests that step touched); call
``_start_driver(name, setup)`` once ready and ``_stop_driver()`` to stop. The driver survives
every exception of a step or an admission (blast radius of one request), and stopping it fails
every pending caller with ``EngineClosedError``: nobody is left blocked.
"""

from __future__ import annotations

import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

from suffixmem import heap
from suffixmem.errors import EngineClosedError, InvalidRequestError, SuffixmemError

log = logging.getLogger(__name__)

T = TypeVar("T")


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


class Driver(ABC):
    """The inbox, the outboxes and the thread that serves them (module docstring)."""

    name: str = "base"

    def __init__(self) -> None:
        self._stop = False
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._outboxes: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._driver: threading.Thread | None = None
        self._heap_held = False

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

    # what a backend raises for a request it refuses (vLLM adds its client errors: a JSON
    # schema it cannot compile is a VLLMValidationError, not a ValueError)
    _bad_request: tuple[type[Exception], ...] = (
        TypeError, ValueError, OverflowError, UnicodeError)

    def _as_request_error(self, error: Exception) -> Exception:
        if isinstance(error, SuffixmemError):
            return error
        if isinstance(error, self._bad_request):
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

    def _stop_driver(self) -> None:
        """Stop the driver thread (waiting up to 30 s for its step) and fail every pending
        caller; the heap hold of ``_start_driver`` is kept until ``_release_heap``."""
        with self._lock:
            self._stop = True
        self._wake.set()
        if self._driver is not None and self._driver is not threading.current_thread():
            self._driver.join(timeout=30)
        # a driver stuck in a long step still must not leave callers blocked
        self._fail_everything(EngineClosedError(f"engine {self.name!r} was closed"))

    def _release_heap(self) -> None:
        if self._heap_held:
            self._heap_held = False
            heap.release()

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
