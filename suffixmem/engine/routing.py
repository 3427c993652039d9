"""Session affinity over several replicas: rendezvous hashing, pins and health.

Contract:
- ``rank(session_key, urls)`` orders replicas by rendezvous (highest-random-weight) score of
  ``sha256(url NUL session_key)``: every process computes the same order from the same list, a
  removed replica's sessions go to their second choice, and an added replica takes exactly the
  sessions for which it scores highest (about ``1/n`` of them) while no other session moves.
- ``Router.route(session_key)`` gives the replicas to try, best first, healthy ones only: the
  session's pinned replica first when ``sticky`` and it is healthy (the pin says where its KV
  lives, and every process sharing the pin store agrees on it even while their health views
  differ for a moment), then the rendezvous order.
- ``PinStore`` records a session's replica (``SqlPins`` keeps it in the session row, shared by
  every suffixmem process on that database); ``MemoryPins`` is the single-process default.
- ``policy="round_robin"`` ignores sessions (what a session-blind balancer does): the baseline
  of ``suffixmem bench scale``.
- Health: a failed request marks its replica down at once; a background thread probes every
  replica's ``/health`` each ``interval_s`` and brings recovered ones back. ``is_down(url)`` is
  that view of one replica: a request waiting on a replica that went down gives up on it
  (``remote_stream``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from suffixmem.errors import SuffixmemError

log = logging.getLogger(__name__)


class UpstreamError(SuffixmemError, RuntimeError):
    """No replica could serve a request (all down, or one refused it)."""


def score(url: str, session_key: str) -> int:
    digest = hashlib.sha256(f"{url}\0{session_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rank(session_key: str, urls: Sequence[str]) -> list[str]:
    """``urls`` by descending rendezvous score for ``session_key`` (ties by URL)."""
    return sorted(urls, key=lambda u: (-score(u, session_key), u))


class PinStore(Protocol):
    """Where a session's replica is recorded."""

    def get(self, session_key: str) -> str | None: ...

    def set(self, session_key: str, url: str) -> None: ...


class MemoryPins:
    """Pins in this process only (bounded: the oldest are dropped first)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._pins: dict[str, str] = {}
        self._lock = threading.Lock()
        self.capacity = capacity

    def get(self, session_key: str) -> str | None:
        with self._lock:
            return self._pins.get(session_key)

    def set(self, session_key: str, url: str) -> None:
        with self._lock:
            self._pins.pop(session_key, None)
            self._pins[session_key] = url
            while len(self._pins) > self.capacity:
                self._pins.pop(next(iter(self._pins)))


class Router:
    """Healthy replicas in the order a session should try them (see the module docstring)."""

    def __init__(self, urls: Sequence[str], pins: PinStore | None = None, *,
                 sticky: bool = True, probe: Callable[[str], bool] | None = None,
                 interval_s: float = 2.0, policy: str = "affinity") -> None:
        if not urls:
            raise UpstreamError("the remote engine needs at least one replica URL")
        self.urls = [u.rstrip("/") for u in urls]
        if len(set(self.urls)) != len(self.urls):
            raise UpstreamError(f"replica URLs repeat: {self.urls}")
        if policy not in ("affinity", "round_robin"):
            raise UpstreamError(f"unknown routing policy {policy!r}; expected 'affinity' or "
                                "'round_robin'")
        self.policy = policy
        self._turn = 0  # round-robin position (the baseline a session-blind balancer gives)
        self.pins: PinStore = pins if pins is not None else MemoryPins()
        self.sticky = sticky
        self._down: set[str] = set()
        self._lock = threading.Lock()
        self._probe = probe
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if probe is not None and interval_s > 0:
            self._thread = threading.Thread(target=self._watch, args=(interval_s,),
                                            name="suffixmem-health", daemon=True)
            self._thread.start()

    def healthy(self) -> list[str]:
        with self._lock:
            return [u for u in self.urls if u not in self._down]

    def route(self, session_key: str) -> list[str]:
        """Healthy replicas to try for ``session_key``, best first (may be empty)."""
        up = self.healthy()
        if self.policy == "round_robin":
            with self._lock:
                self._turn += 1
                turn = self._turn
            return up[turn % len(up):] + up[:turn % len(up)] if up else []
        order = rank(session_key, up)
        if self.sticky:
            pin = self.pins.get(session_key)
            if pin in up:
                order.remove(pin)  # type: ignore[arg-type]
                order.insert(0, pin)  # type: ignore[arg-type]
        return order

    def served(self, session_key: str, url: str) -> bool:
        """Record that ``url`` served the session; True when that moved the session."""
        pin = self.pins.get(session_key)
        if pin != url:
            try:
                self.pins.set(session_key, url)
            except Exception:  # the pin is an optimisation; the turn itself succeeded
                log.warning("recording replica %s for session %s failed", url, session_key,
                            exc_info=True)
        return pin is not None and pin != url

    def is_down(self, url: str) -> bool:
        """Whether ``url`` is marked down now (by a failed request or the health probe)."""
        with self._lock:
            return url in self._down

    def mark_down(self, url: str, *, announce: bool = True) -> None:
        """Take ``url`` out of routing until a probe finds it up. ``announce=False``: no log
        line (start-up marks a replica that never answered, which has no sessions to move)."""
        with self._lock:
            if url not in self._down and announce:
                log.warning("replica %s is down; its sessions move to their next replica", url)
            self._down.add(url)

    def mark_up(self, url: str) -> None:
        with self._lock:
            self._down.discard(url)

    def check_now(self) -> None:
        """Probe every replica once (the background thread does this periodically)."""
        if self._probe is None:
            return
        for url in self.urls:
            if self._probe(url):
                self.mark_up(url)
            else:
                self.mark_down(url)

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.check_now()
            except Exception:  # the watcher must outlive any probe failure
                log.debug("health probe failed", exc_info=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
