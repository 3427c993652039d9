"""The store's per-turn costs: read-only transactions that never wait for a writer (SQLite),
the durability level from the URL, and histories read incrementally yet always equal to what
the database holds, whoever wrote it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from suffixmem.conversation.database import make_engine
from suffixmem.conversation.records import NewMessage, NewSession, TurnEvent
from suffixmem.conversation.store import Store
from suffixmem.errors import StoreError

EV = TurnEvent(prompt_tokens=5, cached_tokens=0, ttft_s=0.1, latency_s=0.2, temperature=0.8)


def _turn(st: Store, user: str, reply: str) -> None:
    st.commit_turn("s", [NewMessage("user", user, None, 1),
                         NewMessage("assistant", reply, (1, 2, 3), 3)],
                   EV, temperature=0.5, window_start=0, create=NewSession(None, "m", "sys"))


def _same_as_database(st: Store) -> list[str]:
    state = st.turn_state("s")
    assert state is not None
    rec, msgs = state
    assert msgs == st.messages("s")  # ``messages`` reads every row: the reference
    assert rec.message_count == len(msgs)
    return [m.content for m in msgs]


def test_reads_never_wait_for_a_writer(sqlite_url: str) -> None:
    st = Store(sqlite_url)
    _turn(st, "q", "r")
    other = make_engine(sqlite_url)  # another connection (or process) in a long write
    with other.connect() as conn:
        conn.exec_driver_sql("UPDATE sessions SET title = 'pending'")  # holds the write lock
        out: list[object] = []

        def read() -> None:
            out.append(st.turn_state("s"))
            out.append(st.get_session("s"))
            out.append(st.messages("s"))
            out.append(st.turn_events("s"))
            out.append(st.list_sessions())

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(10)  # BEGIN IMMEDIATE would queue for the lock (busy_timeout: 30 s)
        finished = not reader.is_alive()
        conn.rollback()
    reader.join(60)
    other.dispose()
    assert finished, "a read waited for the writer's lock"
    assert out[1].title is None  # type: ignore[attr-defined]  # a snapshot: no dirty read
    st.close()


@pytest.mark.parametrize(("given", "level"), [(None, 1), ("full", 2), ("OFF", 0), ("extra", 3)])
def test_durability_level_comes_from_the_url(tmp_path: Path, given: str | None,
                                             level: int) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}" + (f"?synchronous={given}" if given else "")
    st = Store(url)  # the parameter is ours: the driver never sees it
    with st.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == level
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    _turn(st, "q", "r")
    assert _same_as_database(st) == ["q", "r"]
    st.close()


def test_a_bad_durability_level_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as e:
        Store(f"sqlite:///{tmp_path / 'd.db'}?synchronous=sometimes")
    assert "synchronous must be one of off, normal, full, extra, got 'sometimes'" in str(e.value)
    assert "\n" not in str(e.value)


def test_history_reads_only_what_changed_and_equals_the_database(db_url: str) -> None:
    a, b = Store(db_url), Store(db_url)  # b: another process's view, with its own cache
    cache = a.history_cache
    _turn(a, "q1", "r1")
    assert _same_as_database(a) == ["q1", "r1"]
    full = cache.full
    for i in range(2, 8):  # a 7-turn session: after the first read, no message row is read
        _turn(a, f"q{i}", f"r{i}")  # (the commit left its updated_at: the row confirms it)
        assert _same_as_database(a)[-2:] == [f"q{i}", f"r{i}"]
    assert cache.full == full and cache.partial == 0 and cache.hits >= 6
    hits = cache.hits
    a.turn_state("s")  # nothing changed: not a single message row is read
    assert cache.hits == hits + 1
    _turn(b, "q8", "r8")  # another writer appends: only its rows are read
    assert _same_as_database(a)[-2:] == ["q8", "r8"]
    assert cache.full == full and cache.partial == 1
    # another writer rewrites the history to the same length: everything is read again
    msgs = b.messages("s")
    b.commit_turn("s", [NewMessage(m.role, m.content + "!", m.token_ids, m.token_count)
                        for m in msgs], EV, temperature=0.5, window_start=0,
                  replace_history=True)
    assert _same_as_database(a)[-1] == "r8!" and cache.full == full + 1
    b.clear_history("s")
    assert _same_as_database(a) == []
    b.append_messages("s", [NewMessage("user", "again", None, 1)])
    assert _same_as_database(a) == ["again"]
    b.delete_session("s")
    assert a.turn_state("s") is None and len(cache) == 0
    a.close()
    b.close()


def test_a_replacing_commit_leaves_its_history_for_the_next_read(db_url: str) -> None:
    """A RAG engine rewrites the history every turn (this turn's passages in the system
    prompt): the commit knows exactly what it stored, so the next turn reads the session row
    alone, and what it gets is what the database holds."""
    st = Store(db_url)
    cache = st.history_cache
    _turn(st, "q1", "r1")
    _same_as_database(st)
    full = cache.full
    for i in range(2, 5):
        msgs = st.messages("s")
        st.commit_turn("s", [*(NewMessage(m.role, m.content, m.token_ids, m.token_count)
                               for m in msgs),
                             NewMessage("user", f"q{i}", None, 1),
                             NewMessage("assistant", f"r{i}", (4, 5), 2)],
                       EV, temperature=0.5, window_start=0,
                       create=NewSession(None, "m", f"passages {i}"), replace_history=True)
        hits = cache.hits
        assert _same_as_database(st)[-2:] == [f"q{i}", f"r{i}"]
        assert cache.hits == hits + 1  # the session row confirmed the committed history
        rec, _ = st.turn_state("s")  # type: ignore[misc]
        assert rec.system_prompt == f"passages {i}"
    assert cache.full == full and cache.partial == 0
    st.close()


def test_writers_of_one_file_share_one_process_lock(tmp_path: Path) -> None:
    from suffixmem.conversation.database import writer_lock

    a, b = tmp_path / "a.db", tmp_path / "b.db"
    lock = writer_lock(make_engine(f"sqlite:///{a}"))
    # every engine of the process on that file (another Store, the checkpoint database ...)
    assert writer_lock(make_engine(f"sqlite:///{tmp_path}/../{tmp_path.name}/a.db")) is lock
    assert writer_lock(make_engine(f"sqlite:///{b}")) is not lock
    assert writer_lock(make_engine("sqlite://")) is writer_lock(make_engine("sqlite://"))
    with writer_lock(make_engine("sqlite://")):  # a no-op: one in-memory connection
        pass


def test_a_commit_waits_on_the_process_lock_not_on_sqlites_busy_handler(
        sqlite_url: str) -> None:
    # A second writer of this process must not reach BEGIN IMMEDIATE while the first holds
    # the write lock (SQLite would make it poll with sleeps of 1, 2, 5 ... ms): it queues on
    # the writer lock and takes it when the first transaction has ended.
    st = Store(sqlite_url)
    _turn(st, "q0", "r0")
    events: list[tuple[str, str]] = []

    class Recording:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __enter__(self) -> None:
            me = threading.current_thread().name
            events.append(("wait", me))
            self.inner.__enter__()  # type: ignore[attr-defined]
            events.append(("hold", me))

        def __exit__(self, *exc: object) -> None:
            events.append(("free", threading.current_thread().name))
            self.inner.__exit__(*exc)  # type: ignore[attr-defined]

    st._writer = Recording(st._writer)  # type: ignore[assignment]
    holding, release = threading.Event(), threading.Event()

    def long_write() -> None:
        with st._tx() as s:  # an ORM write transaction (segment bookkeeping, forks ...)
            s.connection().exec_driver_sql("UPDATE sessions SET title = 't'")
            holding.set()
            release.wait(10)

    first = threading.Thread(target=long_write, name="first")
    second = threading.Thread(target=lambda: _turn(st, "q1", "r1"), name="second")
    first.start()
    assert holding.wait(10)
    second.start()
    for _ in range(200):  # until the second writer is queued
        if ("wait", "second") in events:
            break
        threading.Event().wait(0.01)
    threading.Event().wait(0.05)
    release.set()
    first.join(30)
    second.join(30)
    assert events == [("wait", "first"), ("hold", "first"), ("wait", "second"),
                      ("free", "first"), ("hold", "second"), ("free", "second")]
    assert _same_as_database(st) == ["q0", "r0", "q1", "r1"]
    st.close()


def _checkouts(st: Store) -> list[int]:
    from sqlalchemy import event

    count = [0]

    @event.listens_for(st.engine, "checkout")
    def _on_checkout(*_: object) -> None:
        count[0] += 1

    return count


def test_a_confirmed_history_is_read_on_the_held_connection(db_url: str) -> None:
    """On a SQLite file the usual turn's read (the session row confirms the cached history) is
    one statement on ``Store.reader``'s held connection: no pool checkout. Busy (another
    thread reading) or broken, the read falls back to a transaction with the same answer; on
    PostgreSQL every read is a transaction."""
    st = Store(db_url)
    sqlite = db_url.startswith("sqlite")
    _turn(st, "q1", "r1")
    _same_as_database(st)  # the first read fills the cache
    st.turn_state("s")  # the reader takes its connection (SQLite)
    checkouts = _checkouts(st)
    hits = st.history_cache.hits
    for _ in range(3):
        assert [m.content for m in st.turn_state("s")[1]] == ["q1", "r1"]  # type: ignore[index]
    assert st.history_cache.hits == hits + 3
    assert checkouts[0] == (0 if sqlite else 3)
    with st.reader._lock:  # another thread is reading: a transaction serves, same answer
        assert [m.content for m in st.turn_state("s")[1]] == ["q1", "r1"]  # type: ignore[index]
    assert checkouts[0] == (1 if sqlite else 4)
    if sqlite:
        st.reader._conn.driver_connection.close()  # the held connection breaks
        assert [m.content for m in st.turn_state("s")[1]] == ["q1", "r1"]  # type: ignore[index]
        assert checkouts[0] == 2 and st.reader._conn is None  # dropped; a transaction served
        st.turn_state("s")
        assert checkouts[0] == 3 and st.reader._conn is not None  # held again
    st.close()
    assert st.reader.rows(st.turn_sql.session, {"sid": "s"}) is None  # closed: never again


def test_in_memory_sqlite_never_holds_its_one_connection() -> None:
    st = Store("sqlite://")
    _turn(st, "q", "r")
    assert _same_as_database(st) == ["q", "r"] and _same_as_database(st) == ["q", "r"]
    assert st.reader.rows(st.turn_sql.session, {"sid": "s"}) is None and st.reader._conn is None
    st.close()
