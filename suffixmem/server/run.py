"""Run the server: one engine, one manager, uvicorn on loopback unless told otherwise."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from suffixmem.conversation.manager_config import ManagerConfig
from suffixmem.server.serving import ServerConfig

log = logging.getLogger(__name__)


def serve(host: str = "127.0.0.1", port: int = 8000, *, engine: str = "vllm",
          model: str | None = None, database_url: str | None = None,
          config: ServerConfig | None = None, max_model_len: int = 8192,
          log_level: str = "info", upstream: list[str] | None = None,
          manager_config: ManagerConfig | None = None, kv_tier: bool = False,
          isolation: dict[str, str] | None = None,
          engine_options: dict[str, Any] | None = None,
          on_ready: Callable[[], None] | None = None) -> None:
    """Start the engine and manager (``manager_config``: its settings, e.g. ``durability``;
    ``kv_tier``: the engine's disk tier, docs/kv-tier.md; ``isolation``: its ``isolation`` and
    ``tenant`` options, docs/segment-reuse.md; ``engine_options``: more of the engine's options,
    e.g. ``kv_cache_gib``), then serve until interrupted (Ctrl-C
    or SIGTERM); both are closed on exit. ``on_ready`` runs once both started, before uvicorn
    binds (the command line's "serving on" line: printed earlier, it stood above an engine
    that then failed to start).

    ``engine="remote"`` serves over the vLLM servers in ``upstream`` (session affinity recorded
    in ``database_url``, shared by every suffixmem process on that database)."""
    import uvicorn

    from suffixmem.conversation.manager import ConversationManager
    from suffixmem.engine import create_engine
    from suffixmem.server.app import create_app
    from suffixmem.server.guards import LOOPBACK_HOSTS

    options: dict[str, object] = {"max_model_len": max_model_len}
    if kv_tier:
        options["kv_tier"] = True  # blocks leaving the pool go to disk, also across restarts
    if model is not None:
        options["model"] = model
    options.update(isolation or {})
    options.update(engine_options or {})
    if engine == "remote":
        options.update(urls=list(upstream or ()), database_url=database_url)
    eng = create_engine(engine, **options)
    try:
        mgr = ConversationManager(eng, database_url=database_url, config=manager_config)
        try:
            mgr.detector()  # load the topic detector now, not inside the first request
            if host in LOOPBACK_HOSTS:  # a page elsewhere must not reach it via DNS rebinding
                config = dataclasses.replace(config or ServerConfig(),
                                             allowed_hosts=LOOPBACK_HOSTS)
            app = create_app(mgr, config)
            if host not in LOOPBACK_HOSTS and not (config and config.api_keys):
                log.warning("serving on %s without an API key: anyone who can reach it can "
                            "read every session", host)
            if on_ready is not None:
                on_ready()
            with _sigterm_exits():
                uvicorn.run(app, host=host, port=port, log_level=log_level)
        finally:
            mgr.close()
    finally:
        eng.close()


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM (systemd, docker stop, Kubernetes) stops the server as Ctrl-C does: uvicorn
    drains, then re-raises the signal it caught, which Python's default SIGTERM action turned
    into an instant exit that skipped ``close()``: the turns still being stored were lost and
    the engine never closed. Here the re-raised signal ends the process with ``SystemExit(0)``
    after the callers' ``finally`` blocks."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
