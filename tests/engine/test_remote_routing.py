"""Session affinity without servers: rendezvous order, pins, health, and the shared pin store;
then the remote engine against fake replicas (loopback HTTP servers that load no model, only the
local tokenizer): start-up checks, failover, guided replies, isolation."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


# -- the remote engine against fake replicas (loopback HTTP, no model) -------------------------
SERVED = "smollm2-135m-instruct"
REPLY_TEXT = '{"colour": "blue", "size": 3}'
SCHEMA = {"type": "object", "properties": {"colour": {"type": "string"}}}


class FakeReplica:
    """A ``vllm serve`` stand-in on loopback: ``/health``, ``/v1/models``, ``/tokenize`` (the
    local tokenizer's ids, shifted by ``tokenize_shift``; ``tokenize_status`` 404: none) and a
    streaming ``/v1/completions`` that sends the last ``max_tokens`` ids of ``reply``, one per
    event (so a continuation elsewhere ends the same reply). ``mode``: ``ok``; ``500``;
    ``hang`` (accepts, never answers until closed); ``die:N`` (drops the connection after N
    events); ``stall:N`` (goes silent after N events until closed); ``garbage:N`` (an event
    that is not JSON after N); ``slow`` (0.2 s between events). Records every completion body
    in ``bodies`` and sets ``disconnected`` when the client hangs up mid-stream."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.reply: list[int] = tokenizer.encode(REPLY_TEXT, add_special_tokens=False)
        self.mode, self.healthy, self.model_id = "ok", True, SERVED
        self.tokenize_status, self.tokenize_shift = 200, 0
        self.bodies: list[dict[str, Any]] = []
        self.disconnected, self.release = threading.Event(), threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        ids = self.reply[len(self.reply) - int(body["max_tokens"]):]
        for i, tid in enumerate(ids):
            yield {"choices": [{"index": 0, "text": self.tokenizer.decode([tid]),
                                "token_ids": [tid],
                                "finish_reason": "length" if i == len(ids) - 1 else None}]}
        yield {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                        "completion_tokens": len(ids),
                                        "prompt_tokens_details": {"cached_tokens": 0}}}

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _handler(fake: FakeReplica) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def answer(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer(200 if fake.healthy else 503, {})
            elif self.path == "/v1/models":
                self.answer(200 if fake.healthy else 503,
                            {"data": [{"id": fake.model_id, "max_model_len": 2048}]})
            else:
                self.answer(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize":
                ids = fake.tokenizer.encode(body["prompt"], add_special_tokens=bool(
                    body.get("add_special_tokens", True)))
                self.answer(fake.tokenize_status,
                            {"tokens": [t + fake.tokenize_shift for t in ids]})
                return
            if self.path != "/v1/completions":
                self.answer(404, {"detail": "Not Found"})
                return
            fake.bodies.append(body)
            mode, _, n = fake.mode.partition(":")
            if mode == "500":
                self.answer(500, {"error": {"message": "boom"}})
                return
            if mode == "hang":
                fake.release.wait()
                return
            self.close_connection = True  # the body ends with the connection
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for i, event in enumerate(fake.events(body)):
                    if n and i == int(n):
                        if mode == "die":
                            return
                        if mode == "stall":
                            fake.release.wait()
                            return
                        if mode == "garbage":
                            self.wfile.write(b"data: {not json\n\n")
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                    if mode == "slow":
                        time.sleep(0.2)
                self.wfile.write(b"data: [DONE]\n\n")
            except OSError:  # the client hung up
                fake.disconnected.set()

    return Handler


@pytest.fixture
def fakes(tokenizer: Any) -> Iterator[list[FakeReplica]]:
    made = [FakeReplica(tokenizer) for _ in range(2)]
    yield made
    for fake in made:
        fake.close()


def _engine(fakes: list[FakeReplica], **options: Any) -> Any:
    from suffixmem.engine import create_engine

    return create_engine("remote", urls=[f.url for f in fakes],
                         **{"health_interval_s": 0, **options})


def _on(fake: FakeReplica, fakes: list[FakeReplica]) -> str:
    """A session key whose rendezvous choice is ``fake``."""
    urls = [f.url for f in fakes]
    return next(k for k in (f"s{i}" for i in range(1000)) if rank(k, urls)[0] == fake.url)


def _request(key: str, fake: FakeReplica, **sampling: Any) -> Any:
    from suffixmem.engine.protocol import Request, SamplingParams

    return Request(key, token_ids=[1, 2, 3], sampling=SamplingParams(
        max_tokens=len(fake.reply), temperature=0.0, **sampling))


def test_a_normal_stream_keeps_its_order_and_closing_it_hangs_up(fakes) -> None:  # type: ignore[no-untyped-def]
    from suffixmem.engine.protocol import Result, TokenEvent

    a, b = fakes
    engine = _engine(fakes)
    try:
        key = _on(a, fakes)
        events = list(engine.stream(_request(key, a)))
        result = events[-1]
        assert isinstance(result, Result) and result.finish_reason == "length"
        assert [e.token_id for e in events[:-1] if isinstance(e, TokenEvent)] == a.reply
        assert list(result.token_ids) == a.reply and result.text == REPLY_TEXT
        assert len(a.bodies) == 1 and not b.bodies
        a.mode = "slow"
        stream = engine.stream(_request(key, a))
        assert isinstance(next(stream), TokenEvent)
        stream.close()  # the caller gives up early: the replica sees the disconnect
        assert a.disconnected.wait(5)
    finally:
        engine.close()


def test_a_guided_reply_is_not_continued_on_another_replica(fakes) -> None:  # type: ignore[no-untyped-def]
    from suffixmem.engine.protocol import TokenEvent

    a, b = fakes
    engine = _engine(fakes)
    try:
        key = _on(a, fakes)
        a.mode = "die:3"
        streamed = []
        with pytest.raises(UpstreamError) as failed:
            streamed.extend(engine.stream(_request(key, a, json_schema=SCHEMA)))
        message = str(failed.value)
        assert a.url in message and "cannot be continued on another replica" in message
        assert len(message.splitlines()) == 1
        assert len([e for e in streamed if isinstance(e, TokenEvent)]) == 3
        assert not b.bodies  # nothing was sent on: the grammar would restart there
        a.mode, b.mode = "ok", "ok"
        engine.router.mark_up(a.url)
        a.mode = "die:0"  # fails before its first token: a guided request fails over as any
        result = engine.generate(_request(key, a, json_schema=SCHEMA))
        assert json.loads(result.text) == json.loads(REPLY_TEXT)
        assert len(b.bodies) == 1 and b.bodies[0]["prompt"] == [1, 2, 3]
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["hang", "stall:3"])
def test_a_request_on_a_replica_marked_down_fails_over_at_once(fakes, mode: str) -> None:  # type: ignore[no-untyped-def]
    a, b = fakes
    engine = _engine(fakes, health_interval_s=0.2)  # read_timeout_s stays 600 s
    try:
        key = _on(a, fakes)
        a.mode = mode
        done: list[Any] = []
        worker = threading.Thread(target=lambda: done.append(engine.generate(_request(key, a))),
                                  daemon=True)
        worker.start()
        deadline = time.monotonic() + 10
        while not a.bodies and time.monotonic() < deadline:
            time.sleep(0.05)
        a.healthy = False  # the health probe marks it down while the request waits on it
        worker.join(10)
        assert done, "the request still waits on a replica marked down"
        assert list(done[0].token_ids) == a.reply  # b continued (or restarted) the same reply
        assert engine.replica_of(key) == b.url
        assert engine.stats().extra["failovers"] == 1
    finally:
        a.release.set()
        engine.close()


def test_read_timeout_bounds_a_silent_replica(fakes) -> None:  # type: ignore[no-untyped-def]
    a, b = fakes
    engine = _engine(fakes, read_timeout_s=1.0)
    try:
        key = _on(a, fakes)
        a.mode = "hang"  # healthy by its /health, silent on completions
        t0 = time.monotonic()
        result = engine.generate(_request(key, a))
        assert list(result.token_ids) == a.reply and engine.replica_of(key) == b.url
        assert time.monotonic() - t0 < 5
    finally:
        a.release.set()
        engine.close()


def test_start_checks_the_replicas_tokenizer(fakes, caplog) -> None:  # type: ignore[no-untyped-def]
    from suffixmem.errors import ConfigError

    b = fakes[1]
    b.tokenize_shift = 1  # another model's vocabulary
    with pytest.raises(ConfigError) as wrong:
        _engine(fakes)
    message = str(wrong.value)
    assert b.url in message and SERVED in message and len(message.splitlines()) == 1
    assert "tokenizer differs" in message
    b.tokenize_shift, b.tokenize_status = 0, 404  # a server without /tokenize: used unchecked
    with caplog.at_level(logging.WARNING, logger="suffixmem.engine.remote"):
        engine = _engine(fakes)
    engine.close()
    warned = [r.getMessage() for r in caplog.records if "/tokenize" in r.getMessage()]
    assert len(warned) == 1 and b.url in warned[0]


@pytest.mark.parametrize("wrong", ["tokenizer", "model"])
def test_a_replica_down_at_start_is_checked_when_it_comes_up(fakes, caplog, wrong: str) -> None:  # type: ignore[no-untyped-def]
    """A replica down at start missed the start-up checks: the health probe that finds it up
    runs them first, and one serving another model stays out of routing (it took requests
    unchecked, and its token ids were another vocabulary's)."""
    a, b = fakes
    b.healthy = False
    engine = _engine(fakes)
    try:
        assert engine.router.healthy() == [a.url]
        b.healthy = True
        if wrong == "tokenizer":
            b.tokenize_shift = 1
        else:
            b.model_id = "another-model"
        with caplog.at_level(logging.ERROR, logger="suffixmem.engine.remote"):
            engine.router.check_now()
            engine.router.check_now()
        assert engine.router.healthy() == [a.url]
        refused = [r.getMessage() for r in caplog.records if "stays out" in r.getMessage()]
        assert len(refused) == 1 and b.url in refused[0]  # logged once, not every probe
        assert ("tokenizer differs" if wrong == "tokenizer" else "'another-model'") in refused[0]
        b.tokenize_shift, b.model_id = 0, SERVED  # restarted with the right model
        engine.router.check_now()
        assert engine.router.healthy() == [a.url, b.url]
        result = engine.generate(_request(_on(b, fakes), b))
        assert list(result.token_ids) == b.reply and b.bodies
    finally:
        engine.close()


def test_start_names_each_replicas_cause(fakes, caplog) -> None:  # type: ignore[no-untyped-def]
    from suffixmem.engine import create_engine

    a = fakes[0]
    port = a.url.rsplit(":", 1)[1]
    urls = ["http://127.0.0.1:9", f"https://127.0.0.1:{port}", f"{a.url}/v1"]
    with caplog.at_level(logging.WARNING), pytest.raises(UpstreamError) as none:
        create_engine("remote", urls=urls, health_interval_s=0, connect_timeout_s=2.0)
    message = str(none.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("no replica answered: http://127.0.0.1:9 (connection refused), "
                              f"https://127.0.0.1:{port} (TLS handshake failed: ")
    assert message.endswith(f"{a.url}/v1 (HTTP 404 on /v1/models: a base URL ending in /v1? "
                            "give the server's root)")
    lines = [r.getMessage() for r in caplog.records]
    assert sum("not answering" in m for m in lines) == 3
    assert not any("sessions move" in m for m in lines)  # none was ever up


@pytest.mark.parametrize("url", ["localhost:8171", "http://127.0.0.1:8171,http://127.0.0.1:8172",
                                 "ftp://127.0.0.1:8171", "http://127.0.0.1:99999"])
def test_a_url_that_is_no_replica_url_is_refused_before_any_request(url: str) -> None:
    from suffixmem.engine import create_engine
    from suffixmem.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(repr(url))) as bad:
        create_engine("remote", urls=[url], health_interval_s=0)
    assert len(str(bad.value).splitlines()) == 1


def test_when_every_replica_fails_the_error_names_each_cause(fakes) -> None:  # type: ignore[no-untyped-def]
    a, b = fakes
    engine = _engine(fakes)
    try:
        a.mode, b.mode = "500", "die:2"
        with pytest.raises(UpstreamError) as failed:
            engine.generate(_request(_on(a, fakes), a))
        message = str(failed.value)
        assert f"{a.url} (HTTP 500)" in message
        assert f"{b.url} (stream ended without a finish reason)" in message
        assert len(message.splitlines()) == 1
    finally:
        engine.close()


def test_a_malformed_event_fails_over(fakes) -> None:  # type: ignore[no-untyped-def]
    a, b = fakes
    engine = _engine(fakes)
    try:
        key = _on(a, fakes)
        a.mode = "garbage:2"
        result = engine.generate(_request(key, a))
        assert list(result.token_ids) == a.reply and result.text == REPLY_TEXT
        assert b.bodies[0]["prompt"] == [1, 2, 3, *a.reply[:2]]  # continued after 2 tokens
        assert engine.router.is_down(a.url) and engine.replica_of(key) == b.url
    finally:
        engine.close()


def test_remote_applies_the_isolation_scope(fakes) -> None:  # type: ignore[no-untyped-def]
    from suffixmem.errors import ConfigError

    a = fakes[0]
    with pytest.raises(ConfigError, match=re.escape(
            "isolation 'public-prefix' is not supported by the remote engine")):
        _engine(fakes, isolation="public-prefix")
    for scope, salts in (("app", {"\x00app:acme"}), ("session", {"alice", "bob"})):
        engine = _engine([a], isolation=scope, tenant="acme")
        try:
            a.bodies.clear()
            for key in ("alice", "bob"):
                engine.generate(_request(key, a))
            assert {body["cache_salt"] for body in a.bodies} == salts
        finally:
            engine.close()


def test_a_consumer_that_leaves_frees_its_session_while_the_replica_is_silent(  # type: ignore[no-untyped-def]
        fakes, tmp_path) -> None:
    """A server's client gives up (its task is cancelled) while the session's replica, healthy
    by its /health, has gone silent: the turn ends at once and frees the session (it held
    the lock until the 600 s read timeout, so the next turn got 409 for ten minutes)."""
    import asyncio

    from suffixmem.conversation.manager import ConversationManager, ManagerConfig
    from suffixmem.engine.async_stream import aiter_events

    a, _ = fakes
    engine = _engine(fakes)
    mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'c.db'}",
                              ManagerConfig(detect_topics=False, lock_timeout_s=5))
    key = _on(a, fakes)
    a.mode = "stall:3"
    outcome: list[object] = []

    async def client() -> None:
        async def consume() -> None:
            async for _ in aiter_events(mgr.stream_chat(key, "Hi.", create=True,
                                                        max_tokens=20)):
                pass
        try:
            await asyncio.wait_for(consume(), 2)
        except TimeoutError as e:
            outcome.append(e)

    # in a thread of its own: asyncio.run waits for the executor, which held the old turn
    loop = threading.Thread(target=lambda: asyncio.run(client()), daemon=True)
    loop.start()
    loop.join(15)
    try:
        assert not loop.is_alive() and outcome, "the abandoned turn still holds its worker"
        a.mode = "ok"
        t0 = time.monotonic()
        turn = mgr.chat(key, "Hi.", create=True, max_tokens=3)  # the lock is free
        assert time.monotonic() - t0 < 4 and turn.text
        assert [m.role for m in mgr.history(key)] == ["user", "assistant"]  # nothing else
    finally:
        a.release.set()
        mgr.close()
        engine.close()
