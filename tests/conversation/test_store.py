"""The SQL store: migrations both ways, atomic writes, concurrent writers, bad input."""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from suffixmem.conversation.database import current_revision, downgrade, head_revision, upgrade
from suffixmem.conversation.records import NewMessage, NewSession, SegmentSighting, TurnEvent
from suffixmem.conversation.schema import Base
from suffixmem.conversation.store import Store
from suffixmem.errors import InvalidRequestError, StoreError, UnknownSessionError

TABLES = {"sessions", "messages", "segments", "segment_events", "turn_events",
          "checkpoints", "checkpoint_blobs", "checkpoint_writes"}  # 0002: LangGraph checkpoints


def _tables(url: str) -> set[str]:
    eng = create_engine(url)
    try:
        return set(inspect(eng).get_table_names()) - {"alembic_version"}
    finally:
        eng.dispose()


def test_migrations_up_and_down(db_url: str) -> None:
    assert _tables(db_url) == set()
    upgrade(db_url)
    assert _tables(db_url) == TABLES
    assert current_revision(db_url) == "0005"
    # the migrated schema is exactly what the ORM models describe
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    eng = create_engine(db_url)
    with eng.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    eng.dispose()
    assert diff == []
    downgrade(db_url, "base")
    assert _tables(db_url) == set()
    assert current_revision(db_url) is None
    upgrade(db_url)  # and up again from empty
    assert _tables(db_url) == TABLES


OPEN_AT = """
import sys, time
from suffixmem.conversation.store import Store
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
Store(sys.argv[1]).close()
"""


def test_processes_opening_a_fresh_database_at_once_all_succeed(db_url: str) -> None:
    """Workers starting together on a new database: on PostgreSQL all but one failed the
    migration ("duplicate key ... pg_type_typname_nsp_index", found by an outside audit); it
    is serialised by an advisory lock now."""
    start = time.time() + 6  # after every process imported the store
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT, db_url, str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    errors = [p.communicate(timeout=180)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e.strip()[-300:] for e in errors]
    assert current_revision(db_url) == head_revision()


def test_opening_a_database_at_head_does_not_wait_for_a_writer(sqlite_url: str) -> None:
    """At the newest revision an open only reads: it used to take the write lock to upgrade,
    so ``sessions list`` waited behind any writer and failed after the busy timeout."""
    Store(sqlite_url).close()
    writer = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    writer.execute("BEGIN IMMEDIATE")
    try:
        t0 = time.monotonic()
        st = Store(sqlite_url)
        assert st.list_sessions() == [] and time.monotonic() - t0 < 5  # busy timeout: 30 s
        st.close()
    finally:
        writer.rollback()
        writer.close()


def test_session_lookups_are_indexed(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    eng = create_engine(sqlite_url)
    insp = inspect(eng)
    indexed = {tuple(ix["column_names"]) for ix in insp.get_indexes("messages")}
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("messages")}
    eng.dispose()
    assert ("session_id",) in indexed
    assert ("session_id", "position") in uniques


def test_migrations_do_not_depend_on_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    Store(url).close()
    assert current_revision(url) == "0005"


def test_sessions_lifecycle(db_url: str) -> None:
    st = Store(db_url)
    a, created = st.open_session("a", title="first", system_prompt="be brief", model="m")
    assert created and a.id == "a" and a.temperature == 0.8 and a.message_count == 0
    again, created = st.open_session("a", title="ignored")
    assert not created and again.title == "first"
    b, _ = st.open_session(None)
    assert len(b.id) == 32
    st.append_messages("a", [NewMessage("user", "hi"), NewMessage("assistant", "hey", (1, 2))])
    assert [s.id for s in st.list_sessions()] == ["a", b.id]  # a was updated last
    f = st.fork_session("a", "f")
    assert f.message_count == 2 and f.forked_from == "a" and f.system_prompt == "be brief"
    st.append_messages("f", [NewMessage("user", "only in the fork")])
    assert len(st.messages("a")) == 2 and len(st.messages("f")) == 3
    assert st.messages("f")[1].token_ids == (1, 2)
    with pytest.raises(InvalidRequestError):
        st.fork_session("a", "f")
    st.delete_session("a")
    assert st.get_session("a") is None
    assert [m.content for m in st.messages("f")] == ["hi", "hey", "only in the fork"]
    with pytest.raises(UnknownSessionError):
        st.messages("a")
    with pytest.raises(UnknownSessionError):
        st.delete_session("a")
    st.close()


def test_commit_turn_is_one_transaction(db_url: str) -> None:
    st = Store(db_url)
    st.open_session("s")
    turn = TurnEvent(prompt_tokens=10, cached_tokens=4, ttft_s=0.1, latency_s=0.5,
                     temperature=0.3, topic_jump=True, similarity=0.1)
    st.commit_turn("s", [NewMessage("user", "q"), NewMessage("assistant", "a", (7,))], turn,
                   temperature=0.3, window_start=0)
    rec = st.require_session("s")
    assert rec.temperature == 0.3 and rec.message_count == 2
    assert st.turn_events("s") == [dataclasses.replace(turn, reply_position=1)]  # the reply's
    # a message that cannot be stored (bad role) leaves nothing behind
    with pytest.raises(InvalidRequestError):
        st.commit_turn("s", [NewMessage("user", "q2"), NewMessage("robot", "x")], turn,
                       temperature=0.5, window_start=0)
    assert [m.content for m in st.messages("s")] == ["q", "a"]
    assert st.require_session("s").temperature == 0.3
    assert len(st.turn_events("s")) == 1
    with pytest.raises(UnknownSessionError):
        st.commit_turn("nope", [NewMessage("user", "q")], turn, temperature=0.8,
                       window_start=0)
    st.clear_history("s")
    assert st.messages("s") == [] and st.require_session("s").temperature == 0.8
    st.close()


def test_a_schema_revision_from_a_newer_suffixmem_is_a_store_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'future.db'}"
    Store(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0099_from_the_future'")
    engine.dispose()
    with pytest.raises(StoreError, match=r"0099_from_the_future.*newer suffixmem"):
        Store(url)


def test_replacing_history_is_one_transaction(db_url: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat store's ``set_messages``: the old history goes only with the new one in."""
    st = Store(db_url)
    st.open_session("s")
    st.append_messages("s", [NewMessage("user", "q"), NewMessage("assistant", "a")])
    st.append_messages("s", [NewMessage("user", "q2")], replace_at=0.4)
    assert [m.content for m in st.messages("s")] == ["q2"]
    assert st.require_session("s").temperature == 0.4

    def fail(*args: object, **kwargs: object) -> None:
        raise StoreError("disk full")

    monkeypatch.setattr(st, "_append", fail)  # the insert fails after the delete ran
    with pytest.raises(StoreError):
        st.append_messages("s", [NewMessage("user", "q3")], replace_at=0.8)
    assert [m.content for m in st.messages("s")] == ["q2"]
    assert st.require_session("s").temperature == 0.4
    st.close()


@pytest.mark.parametrize("same_session", [True, False])
def test_concurrent_writers_lose_nothing(db_url: str, same_session: bool) -> None:
    st = Store(db_url)
    n_threads, n_turns = 4, 12
    for t in range(n_threads):
        st.open_session(f"s{t}")
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def writer(t: int) -> None:
        sid = "s0" if same_session else f"s{t}"
        try:
            barrier.wait()
            for i in range(n_turns):
                st.commit_turn(
                    sid, [NewMessage("user", f"{t}:{i}"), NewMessage("assistant", f"r{t}:{i}")],
                    TurnEvent(1, 0, 0.0, 0.0, 0.8), temperature=0.8, window_start=0,
                )
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    sids = ["s0"] if same_session else [f"s{t}" for t in range(n_threads)]
    contents: list[str] = []
    for sid in sids:
        msgs = st.messages(sid)
        assert [m.position for m in msgs] == list(range(len(msgs)))
        # each turn's two messages are adjacent: turns never interleave
        for u, a in zip(msgs[::2], msgs[1::2], strict=True):
            assert a.content == "r" + u.content
        contents += [m.content for m in msgs if m.role == "user"]
    assert sorted(contents) == sorted(f"{t}:{i}" for t in range(n_threads)
                                      for i in range(n_turns))
    assert len(st.turn_events()) == n_threads * n_turns
    st.close()


def test_segments_bookkeeping(db_url: str) -> None:
    st = Store(db_url)
    st.open_session("a")
    st.open_session("b")
    doc = SegmentSighting("h1", "*", "document", 100, {"tokens": 100.0})
    st.record_segments("a", [doc])
    st.record_segments("a", [SegmentSighting("h1", "*", "document", 100, {}, hit=True)])
    st.record_segments("b", [SegmentSighting("h1", "*", "document", 100, {}, hit=True)])
    rec = st.segment("h1", "*")
    assert rec is not None
    assert (rec.hits, rec.tokens_saved, rec.sessions_seen) == (2, 200, 2)
    assert [e.hit for e in st.segment_events()] == [False, True, True]
    assert st.segment_events()[0].features == {"tokens": 100.0}
    assert st.segment_states([("h1", "*"), ("nope", "*")]) == {("h1", "*"): (rec, 3)}
    # sightings and tiers in one transaction (the segment log's one write per turn)
    st.record_segments("a", [SegmentSighting("h2", "a", "document", 10, {})],
                       tiers=[("h2", "a", "standard", 0.5, None), ("h1", "*", "pinned", None,
                                                                    None)])
    h2, h1 = st.segment("h2", "a"), st.segment("h1", "*")
    assert h2 is not None and (h2.tier, h2.score, h2.hits) == ("standard", 0.5, 0)
    assert h1 is not None and (h1.tier, h1.hits, h1.sessions_seen) == ("pinned", 2, 2)
    assert st.release_segments("a") == 1
    st.delete_session("a")
    assert st.segment("h2", "a") is None and st.segment("h1", "*") is not None
    # a deleted session's sightings go with it (they named it and outlived it), and a shared
    # segment goes once no remaining session's sighting names it
    st.record_segments("b", [SegmentSighting("h3", "*", "system_tail", 20, {})])
    assert {e.session_id for e in st.segment_events()} == {"b"}
    st.open_session("c")
    st.record_segments("c", [SegmentSighting("h3", "*", "system_tail", 20, {})])
    st.delete_session("b")
    assert st.segment("h1", "*") is None and st.segment("h3", "*") is not None
    st.delete_session("c")
    assert st.segment_events() == [] and st.segment("h3", "*") is None
    st.close()


def test_bad_input(sqlite_url: str) -> None:
    st = Store(sqlite_url)
    for bad in ("", "  ", "x" * 129, 3, "a\x00b", "a\ud800b"):
        with pytest.raises(InvalidRequestError, match="session_id") as e:
            st.open_session(bad)  # type: ignore[arg-type]
        assert "\n" not in str(e.value)
    assert st.list_sessions() == []
    st.open_session("ok")
    for bad, why in ((NewMessage("user", ""), "empty"), (NewMessage("tool", "a\x00"), "NUL")):
        with pytest.raises(InvalidRequestError, match=why):
            st.append_messages("ok", [NewMessage("user", "fine"), bad])
    st.append_messages("ok", [NewMessage("assistant", "")])  # an empty reply is legitimate
    assert [m.content for m in st.messages("ok")] == [""]
    st.close()


def test_unreachable_database(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot connect"):
        Store(f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
    with pytest.raises(StoreError, match=r"\*\*\*"):  # the password is hidden
        Store("postgresql+psycopg://u:secret@127.0.0.1:1/db")
    with pytest.raises(StoreError, match="invalid database URL"):
        Store("not a url")
    # the spelling hosting platforms hand out: a hint, the password hidden
    with pytest.raises(StoreError, match=r"u:\*\*\*@h/db: .* postgresql\+psycopg://$"):
        Store("postgres://u:secret@h/db")
    # an unparseable URL is never echoed: it may carry a password
    with pytest.raises(StoreError) as e:
        Store("postgresql+psycopg://u:hunter2@[::1/db")
    assert "hunter2" not in str(e.value)


def test_turn_state_and_commit_turn_create_and_replace(db_url: str) -> None:
    st = Store(db_url)
    assert st.turn_state("n") is None
    ev = TurnEvent(prompt_tokens=5, cached_tokens=0, ttft_s=0.1, latency_s=0.2, temperature=0.8)
    st.commit_turn("n", [NewMessage("user", "hi", None, 1), NewMessage("assistant", "yo", (7,), 1)],
                   ev, temperature=0.7, window_start=0, create=NewSession("t", "m", "sys"))
    rec, msgs = st.turn_state("n")  # type: ignore[misc]
    assert (rec.system_prompt, rec.temperature, rec.message_count) == ("sys", 0.7, 2)
    assert [(m.role, m.content, m.token_ids) for m in msgs] == [
        ("user", "hi", None), ("assistant", "yo", (7,))]
    st.commit_turn("n", [NewMessage("user", "new", None, 1), NewMessage("assistant", "r", None, 1)],
                   ev, temperature=0.5, window_start=0, create=NewSession("t", "m", "other"),
                   replace_history=True)
    rec, msgs = st.turn_state("n")  # type: ignore[misc]
    assert rec.system_prompt == "other" and [m.content for m in msgs] == ["new", "r"]
    assert [m.position for m in msgs] == [0, 1]
    with pytest.raises(UnknownSessionError):  # no create: a missing session stays missing
        st.commit_turn("gone", [NewMessage("user", "x", None, 1)], ev, temperature=0.8,
                       window_start=0)
    assert st.turn_state("gone") is None
    st.close()


def test_session_temperature_range_is_stored(db_url: str) -> None:
    st = Store(db_url)
    st.open_session("r", temperature=0.0)
    rec = st.set_temperature_range("r", 0.6, None, lambda t: min(0.6, max(0.2, t)))
    assert (rec.temperature_hot, rec.temperature_cold, rec.temperature) == (0.6, None, 0.2)
    assert st.require_session("r").temperature_hot == 0.6
    assert st.list_sessions()[0].temperature_hot == 0.6
    assert st.fork_session("r", "r2").temperature_hot == 0.6
    rec = st.set_temperature_range("r", None, None, lambda t: t)  # back to the manager's
    assert (rec.temperature_hot, rec.temperature_cold, rec.temperature) == (None, None, 0.2)
    with pytest.raises(UnknownSessionError):
        st.set_temperature_range("nope", 0.5, 0.1, lambda t: t)
    st.close()
