"""What a turn costs its caller (issue 19), on the real model with the torch engine:
``manager_overhead_ms`` counts the manager's own time and not the engine's; with a fixed
temperature the topic verdict runs after the request reached the engine, with the semantic
temperature before it, and both give a full replay's verdicts; a jump's release and the topic
update with the reply run in the background, not on the caller's path."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.conversation.topic import Featurizer, TopicConfig, TopicDetector, TopicVerdict
from suffixmem.conversation.turns import turn_pairs
from suffixmem.engine.protocol import Request, Result, TokenEvent

pytestmark = [pytest.mark.slow]

CONVO = [
    "How do I sort a list of numbers in Python?",
    "How do I sort a list of strings in Python by length?",
    "Wie backe ich einen Schokoladenkuchen mit Kirschen?",
    "Wie lange backe ich den Schokoladenkuchen mit Kirschen?",
]


class Timed:
    """The real engine; records when each stream was requested and which sessions were
    released; ``delay`` seconds are spent inside the stream before its first event and before
    its ``Result`` (engine time, as the manager sees it)."""

    def __init__(self, engine: Any) -> None:
        self.inner = engine
        self.calls: list[float] = []
        self.released: list[str] = []
        self.delay = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def release_session(self, session_key: str) -> int:
        self.released.append(session_key)
        return 0

    def stream(self, request: Request) -> Iterator[TokenEvent | Result]:
        self.calls.append(time.perf_counter())
        events = self.inner.stream(request)
        delay = self.delay

        def wrap() -> Iterator[TokenEvent | Result]:
            try:
                first = True
                for e in events:
                    if delay and (first or isinstance(e, Result)):
                        time.sleep(delay)
                    first = False
                    yield e
            finally:
                events.close()  # type: ignore[attr-defined]

        return wrap()


class Recording(TopicDetector):
    """Records when and in which thread each verdict was computed."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: list[tuple[float, str]] = []

    def observe_user(self, state: Any, message: str) -> TopicVerdict:
        self.seen.append((time.perf_counter(), threading.current_thread().name))
        return super().observe_user(state, message)


def _detector() -> Recording:
    from suffixmem.conversation.topic_corpus import load_topics

    background = [t for convs in load_topics("english").values() for c in convs for p in c
                  for t in p]
    return Recording(TopicConfig(threshold=0.1), Featurizer().fit(background))


@pytest.fixture(scope="module")
def engine() -> Iterator[Timed]:
    from suffixmem.engine import create_engine

    eng = create_engine("torch", max_model_len=2048, kv_cache_gib=0.25)
    yield Timed(eng)
    eng.close()


@pytest.fixture
def manager(engine: Timed, tmp_path: Path) -> Iterator[ConversationManager]:
    mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'c.db'}", ManagerConfig(
        system_prompt="You are a helpful assistant.", topic_detector=_detector()))
    mgr._background.delay_s = 60  # background work runs only on a kick or when needed
    yield mgr
    mgr.close()


def test_overhead_counts_the_manager_and_not_the_engine(
        manager: ConversationManager, engine: Timed, monkeypatch: pytest.MonkeyPatch) -> None:
    manager.open_session("o")
    manager.chat("o", "Hello there.", temperature=0.0, max_tokens=2)
    engine.delay = 0.3
    try:
        t = manager.chat("o", "What is the capital of France?", temperature=0.0, max_tokens=2)
    finally:
        engine.delay = 0.0
    # 0.6 s were spent inside the engine's stream: none of it is the manager's
    assert 0.0 < t.manager_overhead_ms < 300.0
    read = manager.store.turn_state

    def slow_read(session_id: str) -> Any:
        time.sleep(0.2)
        return read(session_id)

    monkeypatch.setattr(manager.store, "turn_state", slow_read)
    t = manager.chat("o", "And of Italy?", temperature=0.0, max_tokens=2)
    assert t.manager_overhead_ms >= 200.0  # the read before the engine is the manager's


def test_the_verdict_waits_for_the_engine_only_when_sampling_needs_it(
        manager: ConversationManager, engine: Timed) -> None:
    det = manager.detector()
    assert isinstance(det, Recording)
    for sid, fixed in (("semantic", False), ("fixed", True)):
        manager.open_session(sid)
        engine.released.clear()
        session_temperature = manager.temperature.initial()
        for i, text in enumerate(CONVO):
            det.seen.clear()
            n = len(engine.calls)
            kw: dict[str, Any] = {"temperature": 0.0} if fixed else {"seed": 0}
            t = manager.chat(sid, text, max_tokens=4, **kw)
            assert len(det.seen) == 1  # one observation per turn, no replay
            when, thread = det.seen[0]
            if fixed:  # nothing in the request depends on it: after the engine got it
                assert when > engine.calls[n]
                assert t.temperature == 0.0
            else:  # it decides the sampling temperature: before
                assert when < engine.calls[n] and thread == threading.current_thread().name
            # the same verdict as a replay of the stored conversation (the reference)
            history = manager.history(sid)
            ref = det.detect(turn_pairs(history[:2 * i]), text)
            assert (t.topic_jump, t.similarity) == (ref.jump, ref.similarity)
            if ref.similarity is not None:
                session_temperature = manager.temperature.next(session_temperature, ref.jump)
            assert manager.get_session(sid).temperature == pytest.approx(session_temperature)
            if fixed:  # the topic update with this reply waits in the background
                assert not manager._topic_updates[sid].done
            if t.topic_jump:
                # released before the turn returns, under its lock (fixed: after generation;
                # queued, it could land after the next turn and forget that turn's sequence)
                assert engine.released == [sid]
        assert [e.topic_jump for e in manager.store.turn_events(sid)] == [
            False, False, True, False]
