"""Process-wide engines and conversation managers, shared by every surface in one process.

Framework adapters (``langchain_suffixmem``, ``llama_index.llms.suffixmem``,
``llama_index.storage.chat_store.suffixmem``) are built per call or per chain, but an engine takes
seconds to start and holds the KV cache, and a ``ConversationManager`` holds the per-session
locks and topic state. So both must be shared:

- ``get_engine("vllm", max_model_len=4096)`` returns the same engine for the same name and
  configuration, building it on first use (``suffixmem.engine.create_engine``);
  ``register_engine`` makes an engine built elsewhere (a test fixture, an application) the
  shared one.
- ``get_manager(engine, database_url=...)`` returns the one manager of that engine and database,
  so a chat model and the chat history of the same session take the same session lock.
- ``close_all()`` closes every manager, then every engine (end of a script or test run).

Nothing here is a cache of conversation state: generated token ids live in SQL only.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from suffixmem.config import EngineConfig
from suffixmem.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from suffixmem.conversation.manager import ConversationManager, ManagerConfig
    from suffixmem.engine.protocol import Engine

__all__ = [
    "close_all",
    "get_engine",
    "get_manager",
    "register_engine",
    "supports_json_schema",
    "unregister_engine",
]

_engines: dict[tuple[str, str], Engine] = {}
# (id(engine), database url, manager config key) -> manager; the engine is kept alive by _engines
# or by the caller, and the manager holds a reference to it, so the id cannot be reused while
# the entry exists.
_managers: dict[tuple[int, str, str], ConversationManager] = {}
# One lock for everything: building two engines at once would only slow both down.
_lock = threading.RLock()


def _engine_config(name: str, config: EngineConfig | None, options: dict[str, Any]
                   ) -> tuple[EngineConfig, dict[str, Any]]:
    """(the engine's ``EngineConfig``, the options engine ``name`` takes itself: the remote
    engine's URLs and routing)."""
    from suffixmem.engine import engine_config, split_options

    own, options = split_options(name, options)
    if config is None:
        return engine_config(options), own
    if options:
        raise ConfigError("give either config or keyword options, not both")
    return config, own


def _engine_key(name: str, config: EngineConfig, own: dict[str, Any]) -> tuple[str, str]:
    # EngineConfig holds a dict (``extra``), so the key is its canonical JSON.
    return name, json.dumps({"config": asdict(config), "own": own}, sort_keys=True, default=repr)


def get_engine(name: str = "vllm", config: EngineConfig | None = None, **options: Any) -> Engine:
    """The process-wide engine called ``name`` with ``config`` (or ``EngineConfig(**options)``;
    for ``"remote"`` also its own options: ``urls=[...]``, ...).

    The first call builds it (seconds); later calls with an equal configuration return the same
    object. Do not ``close()`` a shared engine while others use it; ``close_all`` closes all.
    Raises ``ConfigError`` for an unknown name or invalid options.
    """
    config, own = _engine_config(name, config, options)
    key = _engine_key(name, config, own)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            from suffixmem.engine import create_engine

            engine = _engines[key] = create_engine(name, config, **own)
        return engine


def register_engine(
    engine: Engine, name: str | None = None, config: EngineConfig | None = None, **options: Any
) -> None:
    """Make ``engine`` the shared one that ``get_engine(name, config or **options)`` returns.

    ``name`` defaults to ``engine.name``. Raises ``ConfigError`` if another engine is already
    registered under that key.
    """
    name = name or engine.name
    key = _engine_key(name, *_engine_config(name, config, options))
    with _lock:
        current = _engines.get(key)
        if current is not None and current is not engine:
            raise ConfigError(f"another {key[0]!r} engine is already registered for that config")
        _engines[key] = engine


def unregister_engine(engine: Engine) -> bool:
    """Forget ``engine`` and close the managers built on it (without closing the engine):
    ``get_engine`` builds a new one next time. Returns whether it was registered."""
    with _lock:
        keys = [k for k, e in _engines.items() if e is engine]
        for k in keys:
            del _engines[k]
        managers = [k for k in _managers if k[0] == id(engine)]
        closing = [_managers.pop(k) for k in managers]
    for manager in closing:
        manager.close()
    return bool(keys)


def _manager_key(config: ManagerConfig | None) -> str:
    if config is None:
        return ""
    if not is_dataclass(config):
        raise ConfigError(f"config must be a ManagerConfig, got {type(config).__name__}")
    # repr for the strategy objects a config may hold (a topic detector, a value scorer): the
    # same object gives the same key, another object another manager.
    return json.dumps({f.name: repr(getattr(config, f.name)) for f in fields(config)},
                      sort_keys=True)


def get_manager(
    engine: str | Engine = "vllm",
    *,
    database_url: str | None = None,
    config: ManagerConfig | None = None,
    **engine_options: Any,
) -> ConversationManager:
    """The process-wide ``ConversationManager`` of ``engine`` (a name, started through
    ``get_engine(engine, **engine_options)``, or an engine instance) and ``database_url``
    (default: ``suffixmem.config.default_database_url()``).

    Every adapter of one process that names the same engine and database gets the same manager,
    hence the same per-session locks. ``engine_options`` with an engine instance raise
    ``ConfigError``.
    """
    from suffixmem.config import default_database_url
    from suffixmem.conversation.manager import ConversationManager

    url = database_url or default_database_url()
    if isinstance(engine, str):
        if engine == "remote":  # its replica pins live in the sessions' rows: this database
            engine_options = {**engine_options, "database_url": url}
        engine = get_engine(engine, **engine_options)
    elif engine_options:
        raise ConfigError("engine options apply to an engine name, not to an engine instance")
    key = (id(engine), url, _manager_key(config))
    with _lock:
        manager = _managers.get(key)
        if manager is None:
            manager = _managers[key] = ConversationManager(engine, url, config)
        return manager


def delete_session_on(database_url: str, session_id: str) -> None:
    """Delete ``session_id`` from the database at ``database_url``: through this process's
    managers on that database, each of which also drops its engine's KV and its own state of
    the session (also when the rows were deleted already), else from SQL alone. A session
    that does not exist (or an id no session can have) is no error: there is nothing to
    forget."""
    from suffixmem.conversation.store import Store
    from suffixmem.errors import InvalidRequestError, UnknownSessionError

    with _lock:
        managers = [m for (_, url, _), m in _managers.items() if url == database_url]
    try:
        if not managers:
            store = Store(database_url)
            try:
                store.delete_session(session_id)
            finally:
                store.close()
        for manager in managers:  # each has its engine's KV of the session to drop
            try:
                manager.delete_session(session_id)
            except UnknownSessionError:  # the rows went already (another manager, a process)
                manager.forget_session(session_id)
    except (UnknownSessionError, InvalidRequestError):
        pass


def database_of(database_url: str | None, engine_options: dict[str, Any]
                ) -> tuple[str | None, dict[str, Any]]:
    """An adapter's database and engine options: a ``database_url`` given among the remote
    engine's options (docs/integrations.md) is the manager's database too, since the replica
    pins live in the session rows; named twice, the two must agree (``ConfigError``)."""
    if "database_url" not in engine_options:
        return database_url, engine_options
    rest = {k: v for k, v in engine_options.items() if k != "database_url"}
    given = engine_options["database_url"]
    if database_url is not None and given != database_url:
        raise ConfigError("database_url is named twice, as database_url= and in the engine "
                          "options, with different values; give it once, as database_url=")
    return given, rest


def supports_json_schema(engine: str | Engine) -> bool:
    """Whether the engine (an instance, or an engine name) can constrain output to a JSON
    schema. A name is answered from the engine class, without starting an engine; an unknown
    name raises ``ConfigError``."""
    if not isinstance(engine, str):
        return bool(engine.supports_json_schema)
    from suffixmem.engine import engine_class

    return bool(engine_class(engine).supports_json_schema)


def close_all() -> None:
    """Close and forget every shared manager, then every shared engine."""
    with _lock:
        managers = list(_managers.values())
        engines = list(_engines.values())
        _managers.clear()
        _engines.clear()
    for manager in managers:
        manager.close()
    for engine in engines:
        engine.close()
