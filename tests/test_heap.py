"""``suffixmem.heap``: start-up objects frozen out of full collections while a component holds
the heap, and collectable again once one closes."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from suffixmem import heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def unheld() -> Iterator[None]:
    """No holder before and after the test (session fixtures may hold the heap)."""
    taken = heap.holders()
    for _ in range(taken):
        heap.release()
    gc.unfreeze()
    yield
    while heap.holders():
        heap.release()
    for _ in range(taken):
        heap.hold()


def test_hold_freezes_and_release_unfreezes(unheld: None) -> None:
    early = Node()
    heap.settle()  # no holder: nothing frozen
    assert gc.get_freeze_count() == 0
    heap.hold()
    assert heap.holders() == 1 and gc.get_freeze_count() > 1000  # pytest's own objects
    assert not any(o is early for o in gc.get_objects())  # out of every generation
    late = Node()
    assert any(o is late for o in gc.get_objects())
    heap.settle()  # a component built on the held heap: its objects frozen too
    assert not any(o is late for o in gc.get_objects())
    heap.hold()
    heap.release()
    assert heap.holders() == 1 and gc.get_freeze_count() == 0  # any release unfreezes
    heap.release()
    heap.release()  # beyond the holds: ignored
    assert heap.holders() == 0 and gc.get_freeze_count() == 0


def test_a_frozen_cycle_is_collected_after_release(unheld: None) -> None:
    node = Node()
    ref = weakref.ref(node)
    heap.hold()
    del node
    gc.collect()
    assert ref() is not None  # frozen: full collections skip it
    heap.release()
    gc.collect()
    assert ref() is None


def test_start_up_garbage_is_collected_before_freezing(unheld: None) -> None:
    node = Node()
    ref = weakref.ref(node)
    del node  # garbage already, not frozen for good
    heap.hold()
    assert ref() is None
    heap.release()
