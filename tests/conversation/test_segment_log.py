"""The manager's segment log counts a sighting as a hit only when the engine served it: inside
the prefix-cache hit or one of ``Result.reused_segments``; tiers come from the shared retention
policy (pinned-LRU by default). Real SQL store (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses

import pytest

from suffixmem.conversation import segment_log
from suffixmem.conversation.layout import Prompt
from suffixmem.conversation.store import Store
from suffixmem.engine.protocol import Result, Segment
from suffixmem.retention import PinnedLRU, SecondHit, Tier, segment_hash

IDS = tuple(range(1000, 1100))
PROMPT = Prompt(IDS, (Segment(0, 30, "system_tail", shared=True), Segment(40, 70, "document"),
                      Segment(70, 90, "document")), (), 0, 0, 2048)


HAS_SPANS = "reused_segments" in {f.name for f in dataclasses.fields(Result)}


def _result(cached: int, reused: int = 0, spans: tuple[tuple[int, int], ...] = ()) -> Result:
    extra = {"reused_segments": spans} if HAS_SPANS else {}
    return Result("x", (1,), "stop", len(IDS), cached, 0.1, 0.2, reused_segment_tokens=reused,
                  **extra)


def test_prefix_hits_and_pinned_lru_tiers(db_url: str) -> None:
    st = Store(db_url)
    st.open_session("s")
    # only the prefix (the system prompt) came from cache
    got = segment_log.record(st, PinnedLRU(), "s", PROMPT, _result(cached=32))
    assert [g.hit for g in got] == [True, False, False]
    sys_h, doc_h = segment_hash(IDS[0:30]), segment_hash(IDS[40:70])
    sys_seg, doc_seg = st.segment(sys_h, "*"), st.segment(doc_h, "s")
    assert sys_seg is not None and sys_seg.tier == Tier.PINNED.value
    assert sys_seg.expires_at is None and sys_seg.hits == 1
    assert doc_seg is not None and doc_seg.tier == Tier.STANDARD.value and doc_seg.hits == 0
    st.close()


@pytest.mark.skipif(not HAS_SPANS, reason="Result.reused_segments is not in the protocol yet")
def test_segment_cache_hits_come_from_result_reused_segments(db_url: str) -> None:
    st = Store(db_url)
    st.open_session("s")
    doc_h = segment_hash(IDS[40:70])
    first = segment_log.record(st, SecondHit(), "s", PROMPT, _result(cached=30))
    assert [g.hit for g in first] == [True, False, False]
    assert st.segment(doc_h, "s").tier == Tier.NONE.value  # type: ignore[union-attr]
    # prefix 30 + the first document served by the segment cache
    got = segment_log.record(st, SecondHit(), "s", PROMPT,
                             _result(cached=60, reused=30, spans=((40, 70),)))
    assert [g.hit for g in got] == [True, True, False]
    seg = st.segment(doc_h, "s")
    assert seg is not None and seg.hits == 1 and seg.tokens_saved == 30
    assert seg.tier == Tier.STANDARD.value  # admitted on its second sighting
    assert [e.features["seen"] for e in st.segment_events() if e.hash == doc_h] == [0, 1]
    st.close()
