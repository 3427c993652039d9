"""A real ``suffixmem serve`` app on loopback for the server tests: uvicorn in a thread over
the session's shared vLLM engine and a manager on a temporary SQLite database, with two API
keys (A and B) so namespaces can be tested."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

KEY_A = "key-a-0123456789"
KEY_B = "key-b-9876543210"


@dataclass
class Server:
    url: str
    manager: object
    model: str
    app: object


def wait_for_server(proc: subprocess.Popen[str] | subprocess.Popen[bytes], url: str,
                 timeout_s: float, log: Callable[[], str]) -> None:
    """Until ``url``/health answers 200; fails with ``log()`` if ``proc`` exits first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log()
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} did not start"
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(app: object) -> tuple[object, threading.Thread, str]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def server(vllm_engine: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from suffixmem.conversation.manager import ConversationManager
    from suffixmem.server import ServerConfig, create_app

    db = Path(tmp_path_factory.mktemp("serve")) / "serve.db"
    mgr = ConversationManager(vllm_engine, database_url=f"sqlite:///{db}")  # type: ignore[arg-type]
    mgr.detector()
    app = create_app(mgr, ServerConfig(api_keys=(KEY_A, KEY_B), max_body_bytes=64 * 1024))
    uv, thread, url = start(app)
    try:
        yield Server(url, mgr, app.state.service.model_name, app)
    finally:
        uv.should_exit = True  # type: ignore[attr-defined]
        thread.join(30)
        mgr.close()
