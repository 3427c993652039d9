"""The start-up heap, kept out of the garbage collector's full collections.

A process that imported torch and transformers and loaded a model tracks about half a million
container objects. CPython's full (generation-2) collection walks every one of them, and one
runs every so often in whichever thread happens to allocate: with the torch engine it took
250-280 ms on the AMD EPYC host, inside some turn's first token (a rag probe's 100 ms turn took
411 ms); with the vLLM engine, whose core freezes its own start-up heap, the manager's objects
still made it 7 ms. ``gc.freeze()`` moves every object tracked so far into a permanent
generation that collections skip, as vLLM's ``EngineCore`` does after its start-up. Frozen
objects are still freed by reference counting; only garbage cycles among them wait until the
heap is unfrozen.

Contract:
- ``hold()``: a component that owns a model (an engine) finished starting: one full
  collection, so that start-up garbage is not frozen for good (cheap when an earlier holder
  froze most of the heap), then ``gc.freeze()``.
- ``release()``: that component closed: the heap is unfrozen, whoever else holds it, since a
  closed engine's cycles (its KV pool among them) must be collectable again; the remaining
  holders' objects are frozen again at the next ``hold`` or ``settle``. Calls beyond the holds
  are ignored.
- ``settle()``: a component built on a held heap (a conversation manager over an engine)
  finished starting: its objects are frozen too (a collection of the unfrozen objects alone,
  then ``gc.freeze()``) while some holder keeps the heap frozen; nothing otherwise. It takes no
  hold, so an unclosed manager never keeps a closed engine's cycles alive.
- ``holders()``: how many components hold the heap frozen.

Process-wide, as the collector is; thread-safe. vLLM's own shutdown unfreezes the heap too,
which costs the other holders only their shorter pauses, not correctness.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_holders = 0


def hold() -> None:
    """Freeze what a component's start-up left tracked (module contract)."""
    global _holders
    with _lock:
        _holders += 1
        gc.collect()
        gc.freeze()


def release() -> None:
    """One holder is done: unfreeze the heap (module contract)."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        gc.unfreeze()


def settle() -> None:
    """Freeze what a component built on a held heap left tracked (module contract)."""
    with _lock:
        if _holders:
            gc.collect()
            gc.freeze()


def holders() -> int:
    with _lock:
        return _holders
