"""Per-key session namespaces, and a client that disconnects mid-stream storing nothing."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from suffixmem.server.serving import namespace
from tests.server.conftest import KEY_A, KEY_B, Server

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}


def chat(server: Server, auth: dict[str, str], sid: str, text: str) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=60,
                      headers={**auth, "X-Session-ID": sid},
                      json={"messages": [{"role": "user", "content": text}],
                            "max_tokens": 8, "temperature": 0})


def test_key_b_cannot_see_continue_or_delete_key_a_session(server: Server) -> None:
    sid = f"secret-{uuid.uuid4().hex[:8]}"
    first = chat(server, A, sid, "My password is swordfish. Remember it.")
    assert first.status_code == 200
    a_history = server.manager.history(namespace(KEY_A) + sid)  # type: ignore[attr-defined]
    assert len(a_history) == 2

    # see: not in B's list, and unknown by id
    listed = httpx.get(server.url + "/v1/sessions", headers=B).json()["data"]
    assert sid not in [s["id"] for s in listed]
    mine = httpx.get(server.url + "/v1/sessions", headers=A).json()["data"]
    assert sid in [s["id"] for s in mine]
    r = httpx.get(f"{server.url}/v1/sessions/{sid}", headers=B)
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    # delete: refused, A's session untouched
    assert httpx.delete(f"{server.url}/v1/sessions/{sid}", headers=B).status_code == 404
    # continue: the same id under B is a different, new session, without A's history
    r = chat(server, B, sid, "What is my password?")
    assert r.status_code == 200 and r.json()["suffixmem"]["history"] == "new"
    a_usage = first.json()["usage"]
    # continuing A's session would put A's turn (prompt and reply) into the prompt
    assert r.json()["usage"]["prompt_tokens"] < a_usage["prompt_tokens"] + a_usage[
        "completion_tokens"]
    b_history = server.manager.history(namespace(KEY_B) + sid)  # type: ignore[attr-defined]
    assert [m.content for m in b_history][:1] == ["What is my password?"]
    assert server.manager.history(namespace(KEY_A) + sid) == a_history  # type: ignore[attr-defined]
    # A still sees and may delete its own session
    got = httpx.get(f"{server.url}/v1/sessions/{sid}", headers=A).json()
    assert got["messages"][0]["content"].startswith("My password is swordfish")
    assert httpx.delete(f"{server.url}/v1/sessions/{sid}", headers=A).json()["deleted"] is True
    assert httpx.get(f"{server.url}/v1/sessions/{sid}", headers=A).status_code == 404
    assert httpx.get(f"{server.url}/v1/sessions/{sid}", headers=B).status_code == 200


@pytest.mark.parametrize("existing", [False, True])
def test_disconnect_mid_stream_stores_nothing(server: Server, existing: bool) -> None:
    sid = f"gone-{uuid.uuid4().hex[:8]}"
    stored_id = namespace(KEY_A) + sid
    if existing:
        assert chat(server, A, sid, "Hello there.").status_code == 200
    before = server.manager.history(stored_id) if existing else []  # type: ignore[attr-defined]
    service = server.app.state.service  # type: ignore[attr-defined]
    body = {"messages": [{"role": "user", "content": "Write a very long story about ships."}],
            "max_tokens": 1000, "ignore_eos": True, "temperature": 0, "stream": True}
    start_tokens = server.manager.engine.stats().output_tokens  # type: ignore[attr-defined]
    got = 0
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={**A, "X-Session-ID": sid}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                got += 1
            if got >= 3:
                break  # leave mid-stream: the connection is closed here
    assert got == 3
    deadline = time.monotonic() + 30
    while service.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service.pending == 0, "the aborted turn is still running"
    # the engine stopped generating: its output count no longer moves, far short of 1000
    engine = server.manager.engine  # type: ignore[attr-defined]
    after = engine.stats().output_tokens
    time.sleep(1.0)
    assert engine.stats().output_tokens == after
    assert after - start_tokens < 500
    if existing:
        assert server.manager.history(stored_id) == before  # type: ignore[attr-defined]
        assert server.manager.stats(stored_id)["turns"] == 1  # type: ignore[attr-defined]
    else:
        assert sid not in [s.id for s in server.manager.list_sessions()]  # type: ignore[attr-defined]
        assert httpx.get(f"{server.url}/v1/sessions/{sid}", headers=A).status_code == 404


def test_disconnect_while_waiting_for_a_non_streamed_reply_stores_nothing(server: Server
                                                                          ) -> None:
    sid = f"gone-sync-{uuid.uuid4().hex[:8]}"
    service = server.app.state.service  # type: ignore[attr-defined]
    engine = server.manager.engine  # type: ignore[attr-defined]
    start_tokens = engine.stats().output_tokens
    body = {"messages": [{"role": "user", "content": "Write a very long story about trains."}],
            "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=2.0,
                   headers={**A, "X-Session-ID": sid})
    deadline = time.monotonic() + 30
    while service.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service.pending == 0
    after = engine.stats().output_tokens
    time.sleep(1.0)
    assert engine.stats().output_tokens == after
    assert after - start_tokens < 500
    assert httpx.get(f"{server.url}/v1/sessions/{sid}", headers=A).status_code == 404
    # on a session with history, the abandoned turn frees the session: the next turn runs
    # (closing the cancelled turn raised "generator already executing" and its lock was held
    # for good: every later turn was a 409 after the lock timeout)
    short = {"messages": [{"role": "user", "content": "Say one word."}], "max_tokens": 2,
             "temperature": 0}
    head = {**A, "X-Session-ID": sid}
    ok = httpx.post(server.url + "/v1/chat/completions", json=short, headers=head, timeout=60)
    assert ok.status_code == 200, ok.text
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=2.0, headers=head)
    again = httpx.post(server.url + "/v1/chat/completions", json=short, headers=head, timeout=20)
    assert again.status_code == 200, again.text
    stored = httpx.get(f"{server.url}/v1/sessions/{sid}", headers=A).json()
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"] == [
        "Say one word."] * 2
