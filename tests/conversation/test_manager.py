"""ConversationManager on the real embedded vLLM engine: atomic turns under injected failures and
cancellation, exact re-rendering of assistant turns, concurrency, bad input, topic jumps."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from suffixmem.conversation.manager import (
    ConversationManager,
    ManagerConfig,
    SessionInfo,
    TurnResult,
)
from suffixmem.conversation.topic import Featurizer, TopicConfig, TopicDetector
from suffixmem.engine.protocol import Message, Request, Result, TokenEvent
from suffixmem.errors import (
    ConfigError,
    ContextWindowError,
    InvalidRequestError,
    StoreError,
    UnknownSessionError,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

GREEDY = {"temperature": 0.0, "max_tokens": 12}


class Injected(RuntimeError):
    pass


class FlakyEngine:
    """The real engine, wrapped: ``fail_after`` tokens into the next stream it raises (once);
    ``release_session`` calls are recorded."""

    def __init__(self, engine: Any) -> None:
        self.inner = engine
        self.fail_after: int | None = None
        self.released: list[str] = []
        self.requests: list[Request] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def release_session(self, session_key: str) -> None:
        self.released.append(session_key)

    def stream(self, request: Request) -> Iterator[TokenEvent | Result]:
        self.requests.append(request)
        events = self.inner.stream(request)
        fail_after, self.fail_after = self.fail_after, None
        return self._wrap(events, fail_after)

    def _wrap(self, events: Iterator[TokenEvent | Result],
              fail_after: int | None) -> Iterator[TokenEvent | Result]:
        n = 0
        try:
            for e in events:
                if fail_after is not None and isinstance(e, TokenEvent):
                    if n == fail_after:
                        raise Injected(f"engine failed after {n} tokens")
                    n += 1
                yield e
        finally:
            events.close()  # type: ignore[attr-defined]


def _detector() -> TopicDetector:
    # the threshold rule with corpus IDF: enough for an unmistakable jump, and fast to build
    from suffixmem.conversation.topic_corpus import load_topics

    background = [t for convs in load_topics("english").values() for c in convs for p in c
                  for t in p]
    return TopicDetector(TopicConfig(threshold=0.1), Featurizer().fit(background))


@pytest.fixture(scope="module")
def engine(vllm_engine: Any) -> FlakyEngine:
    return FlakyEngine(vllm_engine)


@pytest.fixture(scope="module")
def manager(engine: FlakyEngine, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[ConversationManager]:
    url = f"sqlite:///{tmp_path_factory.mktemp('mgr') / 'm.db'}"
    mgr = ConversationManager(engine, url, ManagerConfig(
        system_prompt="You are a helpful assistant.", topic_detector=_detector()))
    yield mgr
    mgr.close()


def _snapshot(mgr: ConversationManager, sid: str) -> tuple[Any, ...]:
    info = mgr.get_session(sid)
    return (mgr.history(sid), info.temperature, info.message_count, mgr.stats(sid)["turns"])


def test_turn_is_committed_with_generated_ids(manager: ConversationManager,
                                              engine: FlakyEngine) -> None:
    info = manager.open_session("basic", title="t")
    # a new session opens a topic: cold, which is greedy for SmolLM2 (its recommended 0.2 is hot)
    assert isinstance(info, SessionInfo)
    assert info.temperature == manager.temperature.initial() == 0.0
    assert manager.open_session("basic", title="other").title == "t"
    t1 = manager.chat("basic", "What is the capital of France?", **GREEDY)
    assert isinstance(t1, TurnResult) and t1.text and not t1.topic_jump
    hist = manager.history("basic")
    assert [m.role for m in hist] == ["user", "assistant"]
    assert hist[0].content == "What is the capital of France?"
    assert hist[1].content == t1.text
    assert hist[1].token_ids == t1.result.token_ids
    p1 = engine.requests[-1].token_ids
    t2 = manager.chat("basic", "And of Italy?", **GREEDY)
    p2 = engine.requests[-1].token_ids
    assert p1 is not None and p2 is not None
    # the second prompt repeats the first and the generated ids verbatim: append-only
    assert tuple(p2[:len(p1) + len(t1.result.token_ids)]) == tuple(p1) + t1.result.token_ids
    assert t2.cached_tokens > 0 and t2.cached_tokens <= t2.prompt_tokens
    stats = manager.stats("basic")
    assert stats["turns"] == 2 and stats["prompt_tokens"] == t1.prompt_tokens + t2.prompt_tokens
    # context shift (the default) may approximate, document segments may not: the request
    # goes with exact=False and, of the layout's segments (test_layout checks those), only the
    # shared system head that the isolation scope reads
    assert not engine.requests[-1].exact
    assert all(s.start == 0 and s.kind == "system_tail" for s in engine.requests[-1].segments)


def test_semantic_temperature_is_used_when_not_given(manager: ConversationManager) -> None:
    manager.open_session("temp")
    t = manager.chat("temp", "Tell me about the python programming language.", max_tokens=6,
                     seed=1)
    assert t.temperature == 0.0 and t.result.finish_reason in ("stop", "length")
    t2 = manager.chat("temp", "Is the python programming language easy to learn?",
                      max_tokens=6, seed=1)
    # on topic: one step warmer, towards the model's recommended 0.2 (four steps of 0.05)
    assert not t2.topic_jump and t2.temperature == 0.05


def test_without_topic_detection_a_session_still_warms(engine: FlakyEngine,
                                                        tmp_path: Path) -> None:
    """``detect_topics=False``: no jumps, so a session warms from its cold first turn as an
    on-topic one does (it stayed greedy for good); its temperature errors name the fields."""
    config = ManagerConfig(detect_topics=False)
    with ConversationManager(engine, f"sqlite:///{tmp_path / 'off.db'}", config) as mgr:
        temps = [mgr.chat("off", text, create=True, max_tokens=2, seed=1).temperature
                 for text in ("Hi.", "Tell me a joke.", "Another one?", "Why?", "More.", "Ok.")]
    assert temps == [0.0, 0.05, 0.1, 0.15, 0.2, 0.2]  # the model's hot 0.2 in four steps
    with pytest.raises(ConfigError, match=r"jump_temperature \(0.5\) must be <= start_"):
        ConversationManager(engine, f"sqlite:///{tmp_path / 'bad.db'}",
                            ManagerConfig(jump_temperature=0.5))
    with pytest.raises(ConfigError, match="temperature_recovery must be > 0"):
        ManagerConfig(temperature_recovery=0)


def test_a_new_sessions_row_records_the_replica_of_its_first_turn(engine: FlakyEngine,
                                                                    tmp_path: Path) -> None:
    """An engine that pins sessions to replicas (the remote engine's ``replica_of``): the row
    the first turn creates records the replica, so another process routes turn 2 there (it
    stayed in this process's memory, and another process sent turn 2 to a cold replica)."""
    from sqlalchemy import text

    class Pinning(FlakyEngine):
        def replica_of(self, session_key: str) -> str:
            return f"http://replica-of-{session_key}:8000"

    url = f"sqlite:///{tmp_path / 'pins.db'}"
    with ConversationManager(Pinning(engine.inner), url, ManagerConfig(
            detect_topics=False, durability="async")) as mgr:
        mgr.chat("p1", "Hi.", create=True, max_tokens=2)
        mgr.flush()
        with mgr.store.engine.connect() as conn:
            replica = conn.execute(text("SELECT replica FROM sessions WHERE id = 'p1'")).scalar()
    assert replica == "http://replica-of-p1:8000"


def test_session_temperature_range_and_per_call_override(manager: ConversationManager) -> None:
    manager.open_session("range")
    with pytest.raises(InvalidRequestError, match="temperature_cold"):
        manager.set_temperature_range("range", hot=0.3, cold=0.5)
    with pytest.raises(InvalidRequestError, match="temperature_hot"):
        manager.set_temperature_range("range", hot=-1.0)
    # above the sampling range (OpenAI's and vLLM's [0, 2]) every turn would fail
    with pytest.raises(InvalidRequestError, match=r"temperature_hot must be a number in \[0, 2\]"):
        manager.set_temperature_range("range", hot=3.0)
    assert manager.get_session("range").temperature_hot is None  # a refused range lost nothing
    info = manager.set_temperature_range("range", hot=0.6, cold=0.2)
    # stored with the session; its current temperature (greedy) moved up into the range
    assert (info.temperature_hot, info.temperature_cold, info.temperature) == (0.6, 0.2, 0.2)
    t1 = manager.chat("range", "Tell me about the python programming language.", max_tokens=6,
                      seed=1)
    assert t1.temperature == 0.2  # a first turn opens a topic: the session's cold
    t2 = manager.chat("range", "Is the python programming language easy to learn?",
                      max_tokens=6, seed=1, temperature=0.9)
    # the call's explicit temperature is what it sampled at ...
    assert not t2.topic_jump and t2.temperature == 0.9
    # ... while the session warmed by its own step: (0.6 - 0.2) over the manager's 4 turns
    assert manager.get_session("range").temperature == 0.3
    assert manager.list_sessions()[0].temperature_hot == 0.6  # read back from SQL
    forked = manager.fork_session("range", "range-fork")
    assert (forked.temperature_hot, forked.temperature_cold) == (0.6, 0.2)


@pytest.mark.parametrize("fail_after", [0, 3])
def test_engine_failure_leaves_history_unchanged(manager: ConversationManager,
                                                 engine: FlakyEngine, fail_after: int) -> None:
    sid = f"fail{fail_after}"
    manager.open_session(sid)
    manager.chat(sid, "Name a colour.", **GREEDY)
    before = _snapshot(manager, sid)
    engine.fail_after = fail_after
    with pytest.raises(Injected):
        manager.chat(sid, "Name another colour.", temperature=0.0, max_tokens=12,
                     ignore_eos=True)
    assert _snapshot(manager, sid) == before
    # streaming: the tokens before the failure were seen, yet nothing is stored
    engine.fail_after = fail_after
    seen = []
    with pytest.raises(Injected):
        for ev in manager.stream_chat(sid, "And another?", temperature=0.0, max_tokens=12,
                                      ignore_eos=True):
            seen.append(ev)
    assert len(seen) == fail_after and all(isinstance(e, TokenEvent) for e in seen)
    assert _snapshot(manager, sid) == before
    manager.chat(sid, "One more colour?", **GREEDY)  # the session still works
    assert len(manager.history(sid)) == 4


def test_cancelled_stream_leaves_history_unchanged(manager: ConversationManager) -> None:
    manager.open_session("cancel")
    before = _snapshot(manager, "cancel")
    stream = manager.stream_chat("cancel", "Count from one to twenty.", temperature=0.0,
                                 max_tokens=40, ignore_eos=True)
    for i, ev in enumerate(stream):
        assert isinstance(ev, TokenEvent)
        if i == 2:
            break
    stream.close()  # type: ignore[attr-defined]
    assert _snapshot(manager, "cancel") == before
    events = list(manager.stream_chat("cancel", "Count to three.", **GREEDY))
    assert isinstance(events[-1], TurnResult)
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    assert len(manager.history("cancel")) == 2


def test_bad_input_is_rejected_and_changes_nothing(manager: ConversationManager) -> None:
    manager.open_session("bad")
    manager.chat("bad", "Hello!", **GREEDY)
    before = _snapshot(manager, "bad")
    with pytest.raises(UnknownSessionError):
        manager.chat("no-such-session", "hi")
    with pytest.raises(UnknownSessionError):
        manager.history("no-such-session")
    for empty in ("", "   \n"):
        with pytest.raises(InvalidRequestError):
            manager.chat("bad", empty)
    with pytest.raises(ContextWindowError):
        manager.chat("bad", "word " * 5000, max_tokens=8)
    # a reply reserve that fills the window names max_tokens, not a "prompt of 0 tokens"
    window = int(manager.engine.max_model_len)
    with pytest.raises(InvalidRequestError, match=rf"^max_tokens=\d+ alone fills the context "
                                                  rf"window of {window} tokens") as err:
        manager.chat("bad", "hi", max_tokens=10**9)
    assert not isinstance(err.value, ContextWindowError)
    # one that leaves too little says the window, not what the reserve left of it
    with pytest.raises(ContextWindowError, match=rf"window of {window} tokens: with max_tokens="
                                                 rf"{window - 2} at most 2 prompt tokens fit"):
        manager.chat("bad", "What is the capital of France?", max_tokens=window - 2)
    with pytest.raises(InvalidRequestError):
        manager.chat("bad", "hi", colour="red")
    with pytest.raises(InvalidRequestError):
        manager.chat("bad", "hi", max_tokens=0)
    with pytest.raises(InvalidRequestError):
        manager.append_messages("bad", ["not a message"])  # type: ignore[list-item]
    assert _snapshot(manager, "bad") == before


def test_unreachable_database(engine: FlakyEngine, tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        ConversationManager(engine, f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")
    with pytest.raises(StoreError):
        ConversationManager(engine, "postgresql+psycopg://x@127.0.0.1:1/none")


def test_concurrent_turns_lose_nothing(manager: ConversationManager) -> None:
    for s in ("c0", "c1", "c2"):
        manager.open_session(s)
    errors: list[BaseException] = []

    def talk(sid: str, tag: str) -> None:
        try:
            for i in range(2):
                manager.chat(sid, f"Say the word {tag}{i}.", temperature=0.0, max_tokens=4)
        except BaseException as e:
            errors.append(e)

    jobs = [("c0", "a"), ("c1", "b"), ("c2", "c"), ("c2", "d")]  # c2 has two writers
    threads = [threading.Thread(target=talk, args=j) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(manager.history("c0")) == 4 and len(manager.history("c1")) == 4
    hist = manager.history("c2")
    assert len(hist) == 8
    users = sorted(m.content for m in hist if m.role == "user")
    assert users == sorted(f"Say the word {t}{i}." for t in "cd" for i in range(2))
    assert [m.role for m in hist] == ["user", "assistant"] * 4


def test_fork_append_clear_delete(manager: ConversationManager, engine: FlakyEngine) -> None:
    manager.open_session("orig", system_prompt="Be brief.")
    manager.append_messages("orig", [Message("user", "Hi"), Message("assistant", "Hello!")])
    fork = manager.fork_session("orig", "forked")
    assert fork.message_count == 2 and fork.system_prompt == "Be brief."
    # a replacement whose insert fails keeps the old history (delete and insert commit together)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(manager.store, "_append", lambda *a, **k: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            manager.append_messages("forked", [Message("user", "new")], replace=True)
    assert [m.content for m in manager.history("forked")] == ["Hi", "Hello!"]
    manager.chat("forked", "How are you?", **GREEDY)
    assert len(manager.history("orig")) == 2 and len(manager.history("forked")) == 4
    ids = [s.id for s in manager.list_sessions()]
    assert ids.index("forked") < ids.index("orig")  # most recently active first
    manager.clear_history("forked")
    assert manager.history("forked") == [] and "forked" in engine.released
    manager.delete_session("forked")
    with pytest.raises(UnknownSessionError):
        manager.get_session("forked")


def test_topic_jump_lowers_temperature_and_releases(manager: ConversationManager,
                                                    engine: FlakyEngine) -> None:
    manager.open_session("topic")
    manager.flush()  # earlier tests' background releases (fixed-temperature jumps) land first
    engine.released.clear()
    a = manager.chat("topic", "How do I sort a list of numbers in Python?", **GREEDY)
    b = manager.chat("topic", "How do I sort a list of strings in Python by length?", **GREEDY)
    assert not a.topic_jump and not b.topic_jump and b.similarity is not None
    c = manager.chat("topic", "Wie backe ich einen Schokoladenkuchen mit Kirschen?",
                     max_tokens=6, seed=0)
    # SmolLM2's range: hot 0.2 (its recommended temperature), cold greedy, +0.05 per turn
    assert c.topic_jump and c.temperature == 0.0
    assert engine.released == ["topic"]
    assert manager.get_session("topic").temperature == 0.0
    d = manager.chat("topic", "Wie lange backe ich den Schokoladenkuchen mit Kirschen?",
                     max_tokens=6, seed=0)
    assert not d.topic_jump and d.temperature == pytest.approx(0.05)
    assert manager.stats("topic")["topic_jumps"] == 1


def test_topic_jumps_with_the_served_models_context_gain(engine: FlakyEngine, model_path: Path,
                                                         tmp_path: Path) -> None:
    """The opt-in second opinion through the manager: the gain reads the stored reply."""
    from suffixmem.context_gain import ContextGain
    from suffixmem.conversation.topic import default_detector

    asked: list[tuple[tuple[str, str], str]] = []
    gain = ContextGain(model_path)

    def recorded(last_turn: tuple[str, str], message: str) -> float:
        asked.append((last_turn, message))
        return gain(last_turn, message)

    mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'g.db'}", ManagerConfig(
        system_prompt="You are a helpful assistant.",
        topic_detector=default_detector(gain=recorded)))
    try:
        mgr.open_session("g")
        a = mgr.chat("g", "How do I keep basil alive indoors?", max_tokens=24, seed=0)
        b = mgr.chat("g", "And if the leaves droop after watering?", max_tokens=24, seed=0)
        c = mgr.chat("g", "What's the fastest way to get rid of hiccups?", max_tokens=8, seed=0)
        assert [a.topic_jump, b.topic_jump, c.topic_jump] == [False, False, True]
        assert asked[0] == (("How do I keep basil alive indoors?", a.text),
                            "And if the leaves droop after watering?")
        assert asked[-1][0] == ("And if the leaves droop after watering?", b.text)
        assert c.temperature == 0.0  # a jump is cold
    finally:
        mgr.close()


def test_context_blocks_are_marked_and_not_stored(manager: ConversationManager,
                                                  engine: FlakyEngine, tmp_path: Path) -> None:
    doc = "The Zorblax festival is held every March in the town of Quimby."
    # without context shift the request carries the layout's segments, the block among them
    exact = ConversationManager(engine, f"sqlite:///{tmp_path / 'x.db'}",
                                ManagerConfig(context_shift=False, detect_topics=False))
    try:
        exact.open_session("ctx")
        t = exact.chat("ctx", "When is the Zorblax festival?", context=[doc], **GREEDY)
        req = engine.requests[-1]
        segs = [s for s in req.segments if s.kind == "document"]
        assert len(segs) == 1 and req.exact
        assert list(req.token_ids[segs[0].start:segs[0].end]) == engine.tokenize(doc)  # type: ignore[index]
        assert exact.history("ctx")[0].content == "When is the Zorblax festival?"
        assert t.text
    finally:
        exact.close()
    # by default (context shift may approximate) no document segment goes with the request
    manager.open_session("ctx")
    assert manager.chat("ctx", "When is the Zorblax festival?", context=[doc], **GREEDY).text
    assert not engine.requests[-1].exact
    assert all(s.kind == "system_tail" for s in engine.requests[-1].segments)
    assert manager.history("ctx")[0].content == "When is the Zorblax festival?"


def _sequence(xs: Sequence[Any]) -> list[Any]:
    return list(xs)


def test_a_whitespace_stop_sequence_is_a_stop_sequence(manager: ConversationManager) -> None:
    """``stop=["\\n"]`` (LangChain's idiom) stops at the first line break; it was refused as
    "stop[0] is empty". Only "" is."""
    manager.open_session("stops")
    turn = manager.chat("stops", "List three fruits, one per line.", stop=["\n"],
                        temperature=0.0, max_tokens=24)
    assert turn.text.strip() and "\n" not in turn.text
    with pytest.raises(InvalidRequestError, match="non-empty"):
        manager.chat("stops", "hi", stop=[""])
    with pytest.raises(InvalidRequestError, match="NUL"):
        manager.chat("stops", "hi", stop=["\x00"])


def test_a_system_prompt_that_fills_the_window_is_refused_at_open(
        manager: ConversationManager) -> None:
    """Every turn of such a session failed, each naming the turn; now ``open_session`` says so
    and creates nothing."""
    window = manager.engine.max_model_len
    with pytest.raises(InvalidRequestError, match=rf"system_prompt is \d+ tokens; the context "
                                                  rf"window is {window}"):
        manager.open_session("too-long", system_prompt="rule " * window)
    with pytest.raises(UnknownSessionError):
        manager.get_session("too-long")


def test_per_session_state_stays_bounded(manager: ConversationManager,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-running manager keeps no finished topic update per session ever served (one
    each, for good, before), and a deleted session's change stamp no longer pins an entry."""
    from suffixmem.conversation import turn_path

    monkeypatch.setattr(turn_path, "TOPIC_UPDATES_PRUNE_AT", 2)
    for i in range(4):
        manager.chat(f"bounded-{i}", "Hello there.", create=True, max_tokens=2)
        manager.flush()
    assert len(manager._topic_updates) <= 3
    manager._versions.capacity = 2
    for i in range(4):
        manager.delete_session(f"bounded-{i}")
    assert len(manager._versions) == 2
