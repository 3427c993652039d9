"""What the command line checks before it starts an engine: every bad input costs a second,
not an engine start-up, and fails with one line (``suffixmem.cli`` prints it and exits 2).
Order: engine name, sampling values, texts, SUFFIXMEM_HOME, database URL (parsed, opened
and, for the commands that write, written to), whether ``--session`` names a session there
(``--new``: one not there yet), then the model (resolved, its context); ``_manager_config``
builds the manager's settings (and an opt-in topic signal's model) before the engine too."""

from __future__ import annotations

from typing import Any

from suffixmem.config import ENGINES, database_url, mask_url, suffixmem_home
from suffixmem.errors import ConfigError, InvalidRequestError, StoreError, UnknownSessionError


def _check_engine(name: str) -> None:
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; expected one of {list(ENGINES)}")


def check_text(text: str, field: str) -> str:
    """``text`` unchanged if it is valid Unicode without NUL; else ``InvalidRequestError``
    naming ``field``. Undecodable bytes in argv or stdin arrive as lone surrogates
    (surrogateescape), which nothing downstream can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(
            f"{field} is not valid UTF-8 text (undecodable byte at character {e.start})"
        ) from None
    if "\x00" in text:
        raise InvalidRequestError(f"{field} contains a NUL character")
    return text


def _check_database(url: str | None, *, writable: bool = False) -> str:
    """The database URL, parsed, opened and upgraded to the newest schema once, before any
    engine starts: a typo costs a second, not an engine start-up; ``writable``: a write is
    tried and rolled back (a read-only file or role otherwise answered every turn and stored
    none). Messages show the URL with its password masked."""
    from sqlalchemy import text

    from suffixmem.conversation.database import make_engine, upgrade

    url = database_url(url)
    eng = make_engine(url)  # our URL options (``?synchronous=``) are checked here
    try:
        try:
            with eng.connect():
                pass
            # the schema too, which the manager would upgrade once the engine had started: a
            # database of a newer suffixmem or of another application fails here (StoreError)
            upgrade(eng)
            if writable:
                with eng.connect() as conn:
                    conn.execute(text("UPDATE alembic_version SET version_num = version_num"))
                    conn.rollback()
        finally:
            eng.dispose()
    except StoreError:
        raise
    except Exception as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()
        detail = reason[0] if reason else type(e).__name__
        from sqlalchemy.engine import make_url

        password = make_url(url).password
        if password:
            detail = detail.replace(str(password), "***")
        raise StoreError(f"cannot open the database {mask_url(url)}: {detail}") from None
    return url


def _check_kv_sizes(engine: str, kv_tier: bool, cache_gib: float | None,
                    tier_gib: float | None) -> dict[str, float]:
    """``--kv-cache-gib`` and ``--kv-tier-gib`` as engine options (positive; the tier's with
    ``--kv-tier``; neither with ``--engine remote``, whose servers size their own caches)."""
    sizes = {k: v for k, v in (("kv_cache_gib", cache_gib), ("kv_tier_gib", tier_gib))
             if v is not None}
    for key, value in sizes.items():
        flag = "--" + key.replace("_", "-")
        if engine == "remote":
            raise ConfigError(f"{flag} needs --engine vllm or torch (vLLM servers size their "
                              "own caches)")
        if not value > 0:
            raise ConfigError(f"{flag} must be > 0, got {value:g}")
    if "kv_tier_gib" in sizes and not kv_tier:
        raise ConfigError("--kv-tier-gib needs --kv-tier")
    return sizes


def _check_engine_options(engine: str, upstream: list[str] | None, kv_tier: bool) -> None:
    """The options that depend on the engine: ``--upstream`` with ``remote`` only (and
    needed there), ``--kv-tier`` with an embedded engine only."""
    if engine == "remote":
        if kv_tier:
            raise ConfigError("--kv-tier needs --engine vllm or torch (vLLM servers keep "
                              "their own caches)")
        if not upstream:
            raise ConfigError("--engine remote needs --upstream URL (one per vLLM server)")
        from urllib.parse import urlsplit

        for url in upstream:
            parts = urlsplit(url.strip())
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError(f"--upstream {url!r} is not an http(s) URL "
                                  "(e.g. http://127.0.0.1:8001)")
    elif upstream:
        raise ConfigError("--upstream is only used with --engine remote")


def _check_port(host: str, port: int) -> None:
    """That the server can listen on ``host:port``, checked before the engine starts (uvicorn
    reported a taken port after it, and accepted a port above 65535)."""
    import socket

    if not 0 < port < 65536:
        raise ConfigError(f"--port must be 1..65535, got {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            s.bind(address)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _sampling(max_tokens: int, temperature: float | None) -> dict[str, Any]:
    """Sampling options for the manager, validated before paying for an engine start; without
    a temperature the session's semantic temperature applies."""
    from suffixmem.engine.protocol import SamplingParams

    sampling: dict[str, Any] = {"max_tokens": max_tokens}
    if temperature is not None:
        sampling["temperature"] = temperature
    SamplingParams(**sampling)
    return sampling


def session_to_use(exists: bool, session: str | None, new: bool) -> str | None:
    """Resolve ``--session``/``--new`` given whether ``session`` is stored: an existing
    session to continue, or the id of one to create (None: a fresh id). ``--session`` alone
    must name an existing session, so a typo is an error instead of a silently created empty
    session; ``--new`` refuses an id that is taken."""
    if session is None:
        return None
    if new and exists:
        raise InvalidRequestError(
            f"--session {session!r} already exists; drop --new to continue it")
    if not new and not exists:
        raise UnknownSessionError(session)
    return session


def _check_session(url: str, session: str, new: bool, system: str | None = None) -> None:
    """``session_to_use`` against the database at ``url``, before any engine starts (the
    command checks again once its manager is up: another process may have acted since); a
    ``--system`` for a stored session must be the one it has (it would be ignored)."""
    from suffixmem.conversation.store import Store

    store = Store(url)
    try:
        record = store.get_session(session)
    finally:
        store.close()
    session_to_use(record is not None, session, new)
    if record is not None and system is not None and system != record.system_prompt:
        raise InvalidRequestError(
            f"--system sets a new session's system prompt, and session {session!r} has its "
            "own; drop --system to continue it")


def _preflight(engine: str, max_tokens: int, temperature: float | None,
               database: str | None, session: str | None, new: bool = False, *,
               message: str | None = None, system: str | None = None,
               max_model_len: int | None = None, model: str | None = None,
               ) -> tuple[dict[str, Any], str]:
    """Every check that needs no engine, in order: engine name, sampling values (and
    ``max_tokens`` below ``max_model_len``), the texts
    (``ask``'s message, which must not be blank, ``--system``, the session id),
    SUFFIXMEM_HOME, database URL (parsed, opened, written to and rolled back), the session
    (``_check_session``), the model (resolved, its context against ``max_model_len``).
    Returns (sampling, database URL)."""
    _check_engine(engine)
    sampling = _sampling(max_tokens, temperature)
    if max_model_len is not None and max_model_len < 32:  # EngineConfig's floor, named first
        raise InvalidRequestError(f"--max-model-len must be >= 32, got {max_model_len}")
    if max_model_len is not None and max_tokens >= max_model_len:  # every turn would fail
        raise InvalidRequestError(f"max_tokens={max_tokens} alone fills the context window of "
                                  f"{max_model_len} tokens; lower --max-tokens")
    if message is not None:
        check_text(message, "the message")
        if not message.strip():
            raise InvalidRequestError("the message is empty")
    if system is not None:
        check_text(system, "--system")
        if not system.strip():
            raise InvalidRequestError("--system is empty")
    if session is not None:
        check_text(session, "--session")
    elif new:  # it would be ignored: without --session every chat or ask starts a new session
        raise InvalidRequestError("--new creates the session that --session names; give both")
    suffixmem_home()
    url = _check_database(database, writable=True)
    if session is not None:
        _check_session(url, session, new, system)
    if model is not None and engine != "remote":  # a remote engine's window is its servers'
        from suffixmem.models import check_context, resolve_model

        folder = resolve_model(model)  # converts a GGUF once, as the engine would
        if max_model_len is not None:
            check_context(folder, max_model_len)
    return sampling, url


def _check_isolation(engine: str, isolation: str, tenant: str) -> dict[str, str]:
    """``serve``'s ``--isolation`` and ``--tenant`` as engine options, checked (a scope the
    engine cannot serve is one line before it starts)."""
    from suffixmem.engine.isolation import IsolationPolicy

    policy = IsolationPolicy(isolation, tenant)
    policy.require(engine)
    return {"isolation": policy.scope, "tenant": policy.tenant}


def _manager_config(model: str, topic_signal: str = "tfidf", **fields: Any) -> Any:
    """``ManagerConfig(**fields)``, checked first (before a model loads); with
    ``topic_signal`` ``hidden`` or ``gain`` its topic detector also weighs that signal of the
    served model (``suffixmem.hidden_similarity``, ``suffixmem.context_gain``: each loads
    the model's weights a second time)."""
    import dataclasses

    from suffixmem.conversation.manager_config import ManagerConfig

    if topic_signal not in ("tfidf", "hidden", "gain"):
        raise ConfigError(f"--topic-signal must be tfidf, hidden or gain, got {topic_signal!r}")
    config = ManagerConfig(**fields)
    if topic_signal == "tfidf":
        return config
    from suffixmem.conversation.topic import default_detector

    if topic_signal == "hidden":
        from suffixmem.hidden_similarity import HiddenSimilarity

        signal: Any = HiddenSimilarity(model)
    else:
        from suffixmem.context_gain import ContextGain

        signal = ContextGain(model)
    return dataclasses.replace(config, topic_detector=default_detector(gain=signal))
