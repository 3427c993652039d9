"""Session affinity without servers: rendezvous order, pins, health, and the shared pin store."""

from __future__ import annotations

import os
import re

import pytest

from suffixmem.engine.routing import MemoryPins, Router, UpstreamError, rank, score

URLS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
KEYS = [f"session-{i}" for i in range(4000)]


def test_rank_is_highest_score_first_and_process_independent() -> None:
    for key in KEYS[:50]:
        order = rank(key, URLS)
        assert sorted(order) == sorted(URLS)
        scores = [score(u, key) for u in order]
        assert scores == sorted(scores, reverse=True)
        assert rank(key, list(reversed(URLS))) == order  # list order does not matter


def test_adding_a_replica_moves_only_its_share() -> None:
    before = {k: rank(k, URLS)[0] for k in KEYS}
    new = "http://10.0.0.9:8000"
    after = {k: rank(k, [*URLS, new])[0] for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == new for k in moved)  # nobody moves between old replicas
    assert 0.15 < len(moved) / len(KEYS) < 0.25  # about 1/5 of the sessions


def test_removing_a_replica_sends_its_sessions_to_their_second_choice() -> None:
    gone = URLS[1]
    for k in KEYS[:500]:
        order = rank(k, URLS)
        survivor = rank(k, [u for u in URLS if u != gone])[0]
        assert survivor == (order[1] if order[0] == gone else order[0])


def test_router_prefers_a_healthy_pin_and_skips_down_replicas() -> None:
    router = Router(URLS, MemoryPins(), probe=None)
    key = "abc"
    first, second = rank(key, URLS)[:2]
    assert router.route(key)[0] == first
    router.served(key, second)  # e.g. a failover earlier, seen by another process
    assert router.route(key)[0] == second
    router.mark_down(second)
    assert router.route(key)[0] == first and second not in router.route(key)
    assert router.served(key, first) is True  # moved
    assert router.served(key, first) is False
    router.mark_up(second)
    assert router.route(key)[0] == first  # the pin now says first
    assert Router(URLS, MemoryPins(), sticky=False, probe=None).route(key)[0] == first


def test_router_health_probe_brings_replicas_back() -> None:
    state = {u: True for u in URLS}
    router = Router(URLS, probe=lambda u: state[u], interval_s=0)
    state[URLS[0]] = False
    router.check_now()
    assert URLS[0] not in router.healthy()
    state[URLS[0]] = True
    router.check_now()
    assert router.healthy() == URLS


def test_router_rejects_bad_replica_lists() -> None:
    with pytest.raises(UpstreamError, match="at least one"):
        Router([])
    with pytest.raises(UpstreamError, match="repeat"):
        Router(["http://a:1", "http://a:1/"])


def test_memory_pins_are_bounded() -> None:
    pins = MemoryPins(capacity=3)
    for i in range(5):
        pins.set(f"k{i}", "u")
    assert pins.get("k0") is None and pins.get("k4") == "u"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_sql_pins_live_in_the_session_row(tmp_path, backend: str, remote_pg_url) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    from suffixmem.conversation.cluster import SqlPins
    from suffixmem.conversation.store import Store

    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'pins.db'}"
    else:
        url = remote_pg_url
        if not url:
            pytest.skip("SUFFIXMEM_TEST_PG_URL is not set")
    store = Store(url)
    sid = f"pin-test-{os.getpid()}-{backend}"
    store.open_session(sid)
    try:
        a, b = SqlPins(url), SqlPins(url)  # two processes' views of one database
        a.set(sid, "http://r1")
        assert b.get(sid) == "http://r1"
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT replica FROM sessions WHERE id = :i"),
                                {"i": sid}).scalar() == "http://r1"
        a.set("anon-no-row", "http://r2")  # no row: this process remembers it
        assert a.get("anon-no-row") == "http://r2" and b.get("anon-no-row") is None
        late = f"{sid}-late"
        a.set(late, "http://r3")  # a first turn, served before its commit creates the row
        store.open_session(late)
        assert b.get(late) is None  # the row exists, no pin in it yet
        assert a.get(late) == "http://r3" and b.get(late) == "http://r3"  # moved into the row
        store.delete_session(late)
        a.close()
        b.close()
    finally:
        store.delete_session(sid)
        store.close()


def test_round_robin_policy_ignores_the_session() -> None:
    router = Router(URLS[:2], probe=None, policy="round_robin")
    firsts = [router.route("same-session")[0] for _ in range(4)]
    assert firsts == [URLS[1], URLS[0], URLS[1], URLS[0]]
    with pytest.raises(UpstreamError, match="policy"):
        Router(URLS, policy="random")


def test_create_engine_remote_needs_urls_and_a_live_replica() -> None:
    from suffixmem.engine import create_engine
    from suffixmem.errors import ConfigError

    with pytest.raises(ConfigError, match="urls"):
        create_engine("remote")
    with pytest.raises(UpstreamError, match=re.escape("no replica answered: http://127.0.0.1:9")):
        create_engine("remote", urls=["http://127.0.0.1:9"], connect_timeout_s=1.0,
                      health_interval_s=0)


def test_cli_remote_engine_needs_upstream(capsys: pytest.CaptureFixture[str]) -> None:
    from suffixmem.cli import main

    for argv, message in (
        (["ask", "hi", "--engine", "remote"], "--engine remote needs --upstream URL"),
        (["ask", "hi", "--upstream", "http://127.0.0.1:9"],
         "--upstream is only used with --engine remote"),
        (["serve", "--engine", "remote"], "--engine remote needs --upstream URL"),
        (["serve", "--upstream", "http://127.0.0.1:9"],
         "--upstream is only used with --engine remote"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_shared_turn_lock_serialises_one_session_across_managers(remote_pg_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import threading

    from suffixmem.conversation.cluster import SharedTurnLock
    from suffixmem.conversation.locks import SessionBusyError
    from suffixmem.conversation.store import Store

    lite = Store(f"sqlite:///{tmp_path / 'lock.db'}")
    assert SharedTurnLock(lite).shared is False  # SQLite: in-process locks only
    lite.close()
    if not remote_pg_url:
        pytest.skip("SUFFIXMEM_TEST_PG_URL is not set")
    a_store, b_store = Store(remote_pg_url), Store(remote_pg_url)  # two processes' stores
    a, b = SharedTurnLock(a_store), SharedTurnLock(b_store)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with a.hold("s1", timeout_s=5):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    with pytest.raises(SessionBusyError, match="another suffixmem process"), \
            b.hold("s1", timeout_s=0.3):
        pass
    with b.hold("s2", timeout_s=1):  # another session never waits
        pass
    release.set()
    t.join()
    with b.hold("s1", timeout_s=2):  # free again once the holder is done
        pass
    a_store.close()
    b_store.close()
