"""``durability``: a turn stored just after its call returns (``write_behind``), or before.

Unit tests of ``PendingCommits`` (order, failures reported once), the store settling a pending
commit before every read of its session, and end to end on the real model (embedded vLLM):
the history a caller reads right after ``chat`` holds the turn, another connection sees it
after the worker ran (``async``) or at once (``sync``), a commit refused in the background
fails the session's next call once and no other session's."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from suffixmem.conversation.background import Job
from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.conversation.records import NewMessage, TurnEvent
from suffixmem.conversation.store import WARM_CONNECTIONS, Store
from suffixmem.conversation.write_behind import PendingCommits
from suffixmem.errors import ConfigError, StoreError

TINY = {"temperature": 0.0, "max_tokens": 3}
TURN = TurnEvent(prompt_tokens=3, cached_tokens=0, ttft_s=0.01, latency_s=0.02,
                 temperature=0.0, output_tokens=1)


def test_commits_of_a_session_run_in_order_even_if_only_the_newest_is_settled() -> None:
    pending, ran = PendingCommits(), []
    pending.add("s", lambda: ran.append(1))
    pending.add("s", lambda: ran.append(2))
    assert len(pending) == 1  # the newest, which runs the earlier first
    pending.settle("s")
    assert ran == [1, 2] and len(pending) == 0
    pending.settle("s")  # nothing pending: a no-op
    assert ran == [1, 2]
    pending.add("t", lambda: None).run()  # run by the worker: nothing is kept for it
    assert pending._jobs == {}


def test_a_failed_commit_is_reported_once_to_its_own_session() -> None:
    pending = PendingCommits()

    def refuse() -> None:
        raise RuntimeError("disk full")

    job = pending.add("bad", refuse)
    pending.add("good", lambda: None)
    with pytest.raises(RuntimeError):
        job.run()  # the worker ran it and saw it fail
    pending.settle_all()  # listing sessions does not raise for one session's turn
    pending.settle("good")
    with pytest.raises(StoreError, match=r"session 'bad': its last turn was not stored "
                                         r"\(disk full\)"):
        pending.settle("bad")
    pending.settle("bad")  # reported once


def test_commits_queued_behind_a_failed_one_are_lost_with_it() -> None:
    """A turn planned on a commit's projection read that turn: stored on top of a history
    without it, it answered a turn that does not exist (found by an outside audit). It is lost
    with it, and the report counts both."""
    pending, ran = PendingCommits(), []

    def refuse() -> None:
        raise RuntimeError("database is locked")

    jobs = [pending.add("s", refuse), pending.add("s", lambda: ran.append(1)),
            pending.add("s", lambda: ran.append(2))]
    for job in jobs:  # the worker runs them in order
        with pytest.raises((RuntimeError, StoreError)):
            job.run()
    assert ran == []
    with pytest.raises(StoreError, match=r"session 's': its last 3 turns were not stored "
                                         r"\(database is locked\)"):
        pending.settle("s")
    pending.add("s", lambda: ran.append(3)).run()  # planned after the report: stored
    assert ran == [3]
    pending.add("t", refuse)
    pending.settle_all()
    assert pending.failures() == ["session 't': its last turn was not stored "
                                  "(database is locked)"] and pending.failures() == []


def test_a_caller_waits_for_a_commit_the_worker_is_running() -> None:
    pending, started, release = PendingCommits(), threading.Event(), threading.Event()
    done: list[str] = []

    def slow() -> None:
        started.set()
        release.wait(5)
        done.append("commit")

    job = pending.add("s", slow)
    worker = threading.Thread(target=job.run)
    worker.start()
    started.wait(5)
    threading.Timer(0.05, release.set).start()
    pending.settle("s")  # returns only once the worker's run finished
    assert done == ["commit"]
    worker.join()


def test_the_store_settles_a_pending_commit_before_reading_its_session(tmp_path: Path) -> None:
    st = Store(f"sqlite:///{tmp_path / 's.db'}")
    st.open_session("s")
    job = st.commit_later("s", [NewMessage("user", "q"), NewMessage("assistant", "a", (7,))],
                          TURN, temperature=0.5, window_start=0, create=None,
                          replace_history=False)
    assert isinstance(job, Job) and not job.done
    other = Store(st._raw_url)  # another process's view: nothing yet
    assert other.messages("s") == []
    assert [m.content for m in st.messages("s")] == ["q", "a"]  # ran inline by the read
    assert job.done and [m.content for m in other.messages("s")] == ["q", "a"]
    assert st.require_session("s").temperature == 0.5
    other.close()
    st.close()


def test_the_next_turn_plans_from_a_pending_commits_projection(tmp_path: Path) -> None:
    st = Store(f"sqlite:///{tmp_path / 's.db'}")
    st.open_session("s")
    cache = st.history_cache
    assert st.turn_state("s")[1] == []  # opened by this store: the session row alone is read
    job = st.commit_later("s", [NewMessage("user", "q"), NewMessage("assistant", "a", (7,))],
                          TURN, temperature=0.5, window_start=0, create=None,
                          replace_history=False)
    rec, msgs = st.turn_state("s")  # served from the projection: the commit still waits
    assert not job.done and st.pending.projection("s") is not None
    assert (rec.temperature, rec.message_count) == (0.5, 2)
    assert [(m.position, m.content, m.token_ids) for m in msgs] == [(0, "q", None), (1, "a", (7,))]
    other = Store(st._raw_url)
    assert other.messages("s") == []  # nothing stored yet
    job.run()
    # the commit stored exactly the projected rows: same stamp, so no message row is re-read
    assert st.turn_state("s") == (rec, msgs) and (cache.full, cache.partial) == (0, 0)
    fresh = other.turn_state("s")  # read from the database alone
    assert fresh is not None and fresh[1] == msgs
    assert (fresh[0].temperature, fresh[0].updated_at) == (0.5, rec.updated_at)
    other.close()
    st.close()


def test_the_projection_survives_a_concurrent_read_of_the_session(tmp_path: Path) -> None:
    # another thread's read of the session, begun before the commit was queued, puts what the
    # database held then into the history cache: the next turn must still see the queued turn
    st = Store(f"sqlite:///{tmp_path / 's.db'}")
    st.open_session("s")
    before = st.history_cache.get("s")
    st.commit_later("s", [NewMessage("user", "q"), NewMessage("assistant", "a")], TURN,
                    temperature=0.5, window_start=0, create=None, replace_history=False)
    st.history_cache.put("s", before)  # the concurrent read lands after the projection
    rec, msgs = st.turn_state("s")
    assert [m.content for m in msgs] == ["q", "a"] and rec.message_count == 2
    # the next turn's commit is projected on top of the queued one, not of the stale entry
    st.commit_later("s", [NewMessage("user", "q2"), NewMessage("assistant", "a2")], TURN,
                    temperature=0.4, window_start=0, create=None, replace_history=False)
    rec, msgs = st.turn_state("s")
    assert [(m.position, m.content) for m in msgs] == [(0, "q"), (1, "a"), (2, "q2"), (3, "a2")]
    st.pending.settle("s")
    other = Store(st._raw_url)  # the database alone
    stored = other.turn_state("s")
    assert stored is not None and stored[1] == msgs and stored[0].temperature == 0.4
    assert st.turn_state("s") == stored
    other.close()
    st.close()


def test_a_turn_that_creates_its_session_is_not_projected(tmp_path: Path) -> None:
    from suffixmem.conversation.records import NewSession
    st = Store(f"sqlite:///{tmp_path / 's.db'}")
    job = st.commit_later("n", [NewMessage("user", "q")], TURN, temperature=0.5,
                          window_start=0, create=NewSession(system_prompt="sys"),
                          replace_history=False)
    assert st.history_cache.get("n") is None
    state = st.turn_state("n")  # settles the commit first
    assert job.done and state is not None and [m.content for m in state[1]] == ["q"]
    st.close()


def test_the_pool_opens_its_connections_at_start(tmp_path: Path) -> None:
    st = Store(f"sqlite:///{tmp_path / 's.db'}")
    assert st.engine.pool.checkedin() == WARM_CONNECTIONS  # not inside the first turns
    st.close()


def test_a_program_that_never_closes_its_store_still_stores_the_turn(tmp_path: Path) -> None:
    # the commit is registered but no worker ever runs it: only the exit hook can
    url = f"sqlite:///{tmp_path / 's.db'}"
    script = f"""
from suffixmem.conversation.records import NewMessage, TurnEvent
from suffixmem.conversation.store import WARM_CONNECTIONS, Store
st = Store({url!r})
st.open_session("s")
st.commit_later("s", [NewMessage("user", "q"), NewMessage("assistant", "a")],
                TurnEvent(prompt_tokens=3, cached_tokens=0, ttft_s=0.01, latency_s=0.02,
                          temperature=0.0, output_tokens=1),
                temperature=0.5, window_start=0, create=None, replace_history=False)
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert _stored(url, "s") == ["q", "a"]


def test_bad_messages_fail_commit_later_itself(tmp_path: Path) -> None:
    st = Store(f"sqlite:///{tmp_path / 's.db'}")
    with pytest.raises(Exception, match="unknown role"):
        st.commit_later("s", [NewMessage("robot", "x")], TURN, temperature=0.5,
                        window_start=0, create=None, replace_history=False)
    assert len(st.pending) == 0
    st.close()


def test_durability_is_checked() -> None:
    with pytest.raises(ConfigError, match="durability must be one of"):
        ManagerConfig(durability="eventually")


# -- end to end, real model -------------------------------------------------------------------
@pytest.fixture
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    engine = request.getfixturevalue("vllm_engine")
    durability = getattr(request, "param", "async")
    mgr = ConversationManager(engine, database_url=f"sqlite:///{tmp_path / 'c.db'}",
                              config=ManagerConfig(durability=durability, detect_topics=False))
    yield mgr
    mgr.close()


def _stored(url: str, sid: str) -> list[str]:
    other = Store(url)
    try:
        return [m.content for m in other.messages(sid)]
    finally:
        other.close()


@pytest.mark.slow
@pytest.mark.vllm
def test_async_turns_are_read_back_at_once_and_stored_behind(manager: Any) -> None:
    manager._background.delay_s = 60.0  # the worker waits for a kick: the commit stays queued
    manager.open_session("a")
    manager.chat("a", "Hello!", **TINY)
    url = manager.store._raw_url
    assert len(manager.store.pending) == 1
    assert _stored(url, "a") == []  # another connection: not yet
    settled: list[str] = []
    settle = manager.store.pending.settle
    manager.store.pending.settle = lambda sid: (settled.append(sid), settle(sid))
    manager.chat("a", "And again?", **TINY)  # planned from the first's projection
    assert settled == []  # it never waited for the first commit (the worker may have run it)
    del manager.store.pending.settle
    history = [m.content for m in manager.history("a")]  # settles both, in order
    assert history[0::2] == ["Hello!", "And again?"] and len(history) == 4
    assert _stored(url, "a") == history
    manager.chat("a", "Third.", **TINY)
    manager.flush()  # the worker's own run
    assert len(manager.store.pending) == 0 and len(_stored(url, "a")) == 6
    # a session created by its first turn exists for this process when the call returns
    manager.chat("b", "Hi.", create=True, **TINY)
    assert manager.get_session("b").message_count == 2


@pytest.mark.slow
@pytest.mark.vllm
def test_opening_a_session_tokenizes_its_system_prompt(manager: Any) -> None:
    template = manager.engine.template
    before = template.cached_bytes
    manager.open_session("w", system_prompt="You answer in one short sentence. " * 12)
    assert template.cached_bytes > before  # not left to the session's first turn


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("manager", ["sync"], indirect=True)
def test_sync_turns_are_stored_when_the_call_returns(manager: Any) -> None:
    manager._background.delay_s = 60.0
    manager.chat("a", "Hello!", create=True, **TINY)
    assert len(manager.store.pending) == 0
    assert _stored(manager.store._raw_url, "a")[0] == "Hello!"


@pytest.mark.slow
@pytest.mark.vllm
def test_a_commit_refused_behind_the_caller_fails_that_sessions_next_call_once(
        manager: Any) -> None:
    manager._background.delay_s = 60.0  # no other turn runs to kick the worker
    manager.open_session("gone")
    manager.open_session("kept")
    manager.chat("gone", "Hello!", **TINY)
    # another process deletes the session before the commit ran: the commit is refused
    other = Store(manager.store._raw_url)
    other.delete_session("gone")
    other.close()
    assert [s.id for s in manager.list_sessions()] == ["kept"]  # settles all; raises for none
    with pytest.raises(StoreError, match="session 'gone': its last turn was not stored"):
        manager.history("gone")
    assert manager.chat("kept", "Hello!", **TINY).text is not None
    assert manager.chat("gone", "Start over.", create=True, **TINY).text is not None
    assert manager.history("gone")[0].content == "Start over."
    assert manager.history("kept")[0].content == "Hello!"


@pytest.mark.slow
@pytest.mark.vllm
def test_a_turn_planned_on_a_lost_turn_is_not_stored_on_top(
        manager: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first commit fails in the background (the database locked past its busy timeout);
    the next turn, planned meanwhile from that commit's projection, is not stored on top of
    what is really there: both are reported lost, and the session goes on from what is stored."""
    manager._background.delay_s = 60.0  # the worker waits: both turns queue
    manager.open_session("lost")
    commit, calls = manager.store._commit, []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("database is locked")
        return commit(*args, **kwargs)

    monkeypatch.setattr(manager.store, "_commit", flaky)
    first = manager.chat("lost", "Name a colour.", **TINY)
    second = manager.chat("lost", "What colour did you name?", **TINY)
    assert second.prompt_tokens > first.prompt_tokens  # it read the first turn
    with pytest.raises(StoreError, match="session 'lost': its last 2 turns were not stored"):
        manager.history("lost")
    assert manager.history("lost") == [] and len(calls) == 1
    assert manager.chat("lost", "Start again.", **TINY).history == "appended"
    assert manager.history("lost")[0].content == "Start again."


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.postgres
def test_postgres_always_commits_before_returning(vllm_engine: Any, pg_url: str) -> None:
    # other processes may write the session: its cross-process turn lock must cover the commit
    mgr = ConversationManager(vllm_engine, pg_url, ManagerConfig(detect_topics=False))
    try:
        mgr._background.delay_s = 60.0
        mgr.chat("a", "Hello!", create=True, **TINY)
        assert len(mgr.store.pending) == 0
        assert _stored(pg_url, "a")[0] == "Hello!"
    finally:
        mgr.close()
