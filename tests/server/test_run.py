"""``suffixmem.server.serve`` builds its manager with the settings it is given (the CLI's
``--durability``), on the real torch engine; uvicorn itself is not started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from suffixmem.conversation.manager_config import ManagerConfig


@pytest.mark.slow
def test_serve_builds_its_manager_with_the_given_durability(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import uvicorn

    from suffixmem.server.run import serve

    seen: dict[str, Any] = {}

    def run(app: Any, **kw: Any) -> None:  # where uvicorn would serve until interrupted
        seen["config"] = app.state.service.manager.config
        seen["kw"] = kw

    monkeypatch.setattr(uvicorn, "run", run)
    serve(port=8765, engine="torch", database_url=f"sqlite:///{tmp_path / 's.db'}",
          max_model_len=512, manager_config=ManagerConfig(durability="sync"))
    assert seen["config"].durability == "sync" and seen["kw"]["port"] == 8765


@pytest.mark.slow
def test_sigterm_stores_the_answered_turn_and_closes(tmp_path: Path) -> None:
    """``kill -TERM`` right after a reply (how systemd, docker and Kubernetes stop a service):
    the turn the client got is stored and the process exits 0 after closing (uvicorn re-raised
    the signal, whose default action killed the process before ``close()``: exit 143, the
    write-behind turn lost, SQLite's WAL left behind). Also the loopback server's Host check
    and its database file's mode."""
    import os
    import signal
    import socket
    import sqlite3
    import subprocess
    import sys

    import httpx

    from tests.server.conftest import wait_for_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = tmp_path / "s.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "suffixmem.cli", "serve", "--engine", "torch", "--port",
         str(port), "--max-model-len", "512", "--database", f"sqlite:///{db}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SUFFIXMEM_HOME": os.environ.get("SUFFIXMEM_HOME", str(tmp_path))})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_server(proc, url, 240, lambda: proc.stderr.read() if proc.stderr else "")
        r = httpx.post(f"{url}/v1/chat/completions", headers={"X-Session-ID": "t1"}, timeout=120,
                       json={"messages": [{"role": "user", "content": "Say one."}],
                             "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        # on loopback it answers loopback names only: a page on another origin whose DNS name
        # was rebound to 127.0.0.1 sends its own Host, and is refused (it read every session)
        foreign = httpx.get(f"{url}/v1/sessions", headers={"Host": f"rebind.test:{port}"})
        assert foreign.status_code == 421, foreign.text
        assert httpx.get(f"http://localhost:{port}/health").status_code == 200
        assert db.stat().st_mode & 0o777 == 0o600  # every conversation: the owner's only
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert not (tmp_path / "s.db-wal").exists()  # closed: the WAL was checkpointed away
    conn = sqlite3.connect(db)
    roles = [r[0] for r in conn.execute(
        "SELECT role FROM messages WHERE session_id = 't1' ORDER BY position")]
    conn.close()
    assert roles == ["user", "assistant"]
