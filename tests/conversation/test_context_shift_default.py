"""The manager's default context shift (``ManagerConfig.context_shift``), on the real model with
the torch engine: turns that drop nothing give exactly what an exact manager gives; the turn
whose layout drops old turns reuses the kept turns' KV; ``context_shift=False`` keeps every
turn exact; a rewritten history and document segments never go approximate by default."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.engine.protocol import Message, Request

from .recording import Recorder

pytestmark = [pytest.mark.slow]

SYSTEM = "You are a patient tutor. Answer in one or two short sentences."
QUESTIONS = [
    "What is a lighthouse for?", "Who looked after lighthouses?", "Was it a lonely job?",
    "Are there lighthouse keepers today?", "How far can the light be seen?",
    "Why do lighthouses have stripes?", "What fuel did old lamps burn?",
    "What is a Fresnel lens?", "Which lighthouse is the oldest?", "Can you visit one?",
    "Do ships still need them with GPS?", "What sound does a fog signal make?",
    "How tall is the tallest lighthouse?", "Who built the first one?",
]
SETTINGS = {"system_prompt": SYSTEM, "context_window": 448, "max_tokens": 24,
            "detect_topics": False}


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[Recorder]:
    from suffixmem.engine import create_engine

    eng = create_engine("torch", max_model_len=2048, kv_cache_gib=0.25)
    yield Recorder(eng)
    eng.close()


def _no_documents(request: Request) -> bool:
    """Only the shared system head, which the isolation scope reads, and no document."""
    return all(s.start == 0 and s.shared and s.kind == "system_tail" for s in request.segments)


def _turns(mgr: ConversationManager, engine: Recorder, sid: str) -> list[tuple[Any, Request]]:
    mgr.open_session(sid)
    out = []
    for q in QUESTIONS:
        out.append((mgr.chat(sid, q, temperature=0.0), engine.requests[-1]))
    return out


def test_only_the_turns_after_an_eviction_are_approximate(engine: Recorder,
                                                          tmp_path: Path) -> None:
    shifting = ConversationManager(engine, f"sqlite:///{tmp_path / 's.db'}",
                                   ManagerConfig(**SETTINGS))
    exact = ConversationManager(engine, f"sqlite:///{tmp_path / 'e.db'}",
                                ManagerConfig(**SETTINGS, context_shift=False))
    try:
        a = _turns(shifting, engine, "shift")
        b = _turns(exact, engine, "exact")
    finally:
        shifting.close()
        exact.close()
    # the default sends exact=False without document segments (only the shared system head,
    # which the isolation scope reads); context_shift=False is exact
    assert all(not r.exact and _no_documents(r) for _, r in a)
    assert all(r.exact for _, r in b)
    first = next(i for i, (t, _) in enumerate(a) if t.evicted_turns)
    assert first >= 2 and b[first][0].evicted_turns == a[first][0].evicted_turns
    # nothing dropped yet: the same tokens as the exact manager, and nothing shifted
    for (ta, ra), (tb, rb) in zip(a[:first], b[:first], strict=True):
        assert ra.token_ids == rb.token_ids and ta.token_ids == tb.token_ids
        assert ta.result.reused_segment_tokens == 0
    # the eviction turn: the kept turns come from the previous sequence at new positions
    ta, tb = a[first][0], b[first][0]
    assert ta.result.reused_segment_tokens > 32 and tb.result.reused_segment_tokens == 0
    assert ta.cached_tokens >= tb.cached_tokens + ta.result.reused_segment_tokens
    assert ta.prompt_tokens == tb.prompt_tokens


def test_rewritten_history_stays_exact(engine: Recorder, tmp_path: Path) -> None:
    mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'r.db'}", ManagerConfig(**SETTINGS))
    try:
        sent = [Message("system", SYSTEM), Message("user", QUESTIONS[0])]
        first = mgr.complete("rw", sent, temperature=0.0, max_tokens=8)
        assert not engine.requests[-1].exact  # appended or new: context shift may act
        # another system prompt (passages retrieved for this turn): the history is rewritten
        sent = [Message("system", SYSTEM + " Context: lighthouses guide ships."),
                Message("user", QUESTIONS[0]), Message("assistant", first.text),
                Message("user", QUESTIONS[1])]
        second = mgr.complete("rw", sent, temperature=0.0, max_tokens=8)
        assert second.history == "rewritten" and engine.requests[-1].exact
    finally:
        mgr.close()


def test_an_applications_own_sliding_window_shifts_too(engine: Recorder,
                                                       tmp_path: Path) -> None:
    mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'w.db'}", ManagerConfig(**SETTINGS))
    try:
        msgs = [Message("system", SYSTEM)]
        for q in QUESTIONS[:4]:
            r = mgr.complete("win", [*msgs, Message("user", q)], temperature=0.0)
            msgs += [Message("user", q), Message("assistant", r.text)]
        assert r.evicted_turns == 0 and r.result.reused_segment_tokens == 0
        # the application's window drops the oldest exchange, as LangChain's trim_messages does
        kept = [msgs[0], *msgs[3:]]
        r = mgr.complete("win", [*kept, Message("user", QUESTIONS[4])], temperature=0.0)
        request = engine.requests[-1]
        assert r.history == "windowed" and not request.exact and _no_documents(request)
        assert r.result.reused_segment_tokens > 32
        # the prompt is the window, as sent; the stored history stays whole (a memory over
        # the session keeps the conversation), the new exchange appended
        prompt = engine.inner.tokenizer.decode(request.token_ids)
        assert QUESTIONS[0] not in prompt and QUESTIONS[1] in prompt
        stored = [m.content for m in mgr.history("win")]
        assert stored[:-2] == [m.content for m in msgs[1:]]
        assert stored[-2:] == [QUESTIONS[4], r.text]
        # the session's next turn through chat reads from the window on, too
        r = mgr.chat("win", QUESTIONS[5], temperature=0.0)
        prompt = engine.inner.tokenizer.decode(engine.requests[-1].token_ids)
        assert QUESTIONS[0] not in prompt and QUESTIONS[4] in prompt
        assert r.history == "appended" and len(mgr.history("win")) == 12
    finally:
        mgr.close()


def test_a_stateless_window_keeps_its_key_and_shifts(engine: Recorder, tmp_path: Path) -> None:
    """The same window without a session id: the engine key stays the conversation's
    (``anon_keys``), so the window turn finds the previous sequence and shifts it, and nothing
    is stored."""
    mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'a.db'}", ManagerConfig(**SETTINGS))
    try:
        msgs = [Message("system", SYSTEM)]
        keys = []
        for q in QUESTIONS[:4]:
            r = mgr.complete(None, [*msgs, Message("user", q)], temperature=0.0)
            keys.append(engine.requests[-1].session_key)
            msgs += [Message("user", q), Message("assistant", r.text)]
        kept = [msgs[0], *msgs[3:]]  # the oldest exchange dropped
        r = mgr.complete(None, [*kept, Message("user", QUESTIONS[4])], temperature=0.0)
        request = engine.requests[-1]
        assert r.history == "stateless" and mgr.list_sessions() == []
        assert len(set(keys)) == 1 and request.session_key == keys[0]
        assert not request.exact and _no_documents(request)
        assert r.result.reused_segment_tokens > 32
    finally:
        mgr.close()


def test_a_window_after_a_topic_jump_still_shifts(engine: Recorder, tmp_path: Path) -> None:
    """A jump releases the session's cached state. With the temperature fixed, the verdict
    comes after generation, and the release was queued: it could land after the next turn and
    forget that turn's sequence, so the window after it found nothing to shift (0 cached
    tokens). It now runs before the turn returns."""
    settings = {**SETTINGS, "context_window": 2048, "detect_topics": True}
    mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'j.db'}", ManagerConfig(**settings))
    try:
        msgs = [Message("system", SYSTEM)]
        questions = [*QUESTIONS[:2], "By the way, unrelated question: how do I bake sourdough "
                     "bread at home?", "How long should the sourdough dough rise?",
                     "What temperature should the oven be for sourdough bread?"]
        for q in questions[:4]:
            r = mgr.complete("jw", [*msgs, Message("user", q)], temperature=0.0)
            msgs += [Message("user", q), Message("assistant", r.text)]
            if q.startswith("By the way"):
                assert r.topic_jump
        kept = [msgs[0], *msgs[5:]]  # the window: from the jump on
        r = mgr.complete("jw", [*kept, Message("user", questions[4])], temperature=0.0)
        assert r.history == "windowed"
        assert r.result.reused_segment_tokens > 0 and r.cached_tokens > 0
    finally:
        mgr.close()
