"""Work a turn owes but its caller does not wait for: one background thread, gated so that it
runs while the engine works rather than while a caller is on its critical path.

A finished turn leaves bookkeeping behind (the segment log, the topic detector's update with
the reply, releasing a session's segments in the store). Run at once, that Python work would
compete for the GIL with the caller's next turn, whose first steps (read, prompt, engine
admission) are exactly what ``manager_overhead_ms`` measures. So a job waits until some turn's
engine has produced its first token (``kick``: from then on the driver thread mostly runs torch
kernels without the GIL) or until ``delay_s`` passed with no kick (an idle server), and then
the worker runs every job queued so far, in order.

A ``Job`` runs at most once, by whichever thread gets to it first: the worker, or a caller that
needs its value now (``run``: it runs the job inline if nobody has started it, else waits for
it). So a turn never waits behind unrelated queued jobs for the one result it needs. Jobs of
different sessions share the worker, never a lock: each job has its own.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from suffixmem.errors import SuffixmemError

log = logging.getLogger(__name__)


class Job:
    """``fn`` run at most once; ``run()`` returns its value or raises its exception."""

    __slots__ = ("_error", "_finished", "_fn", "_lock", "_value", "name")

    def __init__(self, fn: Callable[[], Any], name: str = "") -> None:
        self._fn: Callable[[], Any] | None = fn
        self._lock = threading.Lock()  # held while fn runs: a second caller waits for it
        self._finished = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self.name = name

    def run(self) -> Any:
        """Run the job now unless it ran or is running (then wait for it); its value."""
        with self._lock:
            fn, self._fn = self._fn, None
            if fn is not None:
                try:
                    self._value = fn()
                except BaseException as e:  # re-raised to every caller of run()
                    self._error = e
                finally:
                    self._finished.set()
        if self._error is not None:
            raise self._error
        return self._value

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the job to finish without running it; False on timeout."""
        return self._finished.wait(timeout)


class Background:
    """The gated worker (module docstring)."""

    def __init__(self, delay_s: float = 0.2, name: str = "suffixmem-background") -> None:
        self.delay_s = delay_s
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._kick = threading.Event()
        self._closed = False
        self._flushing = 0  # callers in flush(): run at once, no gate
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, job: Job) -> Job:
        """Queue ``job`` (run after the next kick, or after ``delay_s``)."""
        if self._closed:
            job.run()  # nothing runs after close: do it here rather than drop it
        else:
            self._queue.put(job)
        return job

    def submit(self, fn: Callable[[], Any], name: str = "") -> Job:
        return self.put(Job(fn, name))

    def kick(self) -> None:
        """An engine is busy: run what is queued now."""
        self._kick.set()

    def flush(self) -> None:
        """Run everything queued so far and wait for it (tests, shutdown)."""
        fence = Job(lambda: None, "flush")
        self._flushing += 1
        try:
            self.put(fence)
            self.kick()
            fence.wait()
        finally:
            self._flushing -= 1

    def close(self) -> None:
        """Run what is queued, then stop the worker. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._queue.put(None)
        self._kick.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            # only a kick after the job arrived counts: one left over from a turn that was
            # already generating would run it now, on some caller's critical path
            if not self._flushing:
                self._kick.clear()
                self._kick.wait(self.delay_s)
            while job is not None:
                self._run(job)
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    return

    @staticmethod
    def _run(job: Job) -> None:
        try:
            job.run()
        except SuffixmemError as e:  # expected (a commit refused): one line, no traceback
            log.warning("background job %s failed: %s", job.name or "?", e)
        except Exception:  # the job's owner sees it through run(); the worker goes on
            log.warning("background job %s failed", job.name or "?", exc_info=True)
