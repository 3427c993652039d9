"""The conversation manager: sessions in SQL, prompts laid out for the cache, atomic turns.

Entry points (all end in the same turn path, ``turns``):

- ``chat`` / ``stream_chat``: one user message against the stored session;
- ``complete`` / ``stream_complete``: a framework resends the whole message list; it is
  reconciled with the stored session (``reconcile``: new / appended / rewritten / stateless);
- async twins ``achat``, ``astream_chat``, ``acomplete``, ``astream_complete``: the blocking
  work runs in worker threads; closing the async iterator aborts the turn and stores nothing;
- ``stream_text`` / ``complete_text``: raw text completion, stateless, nothing stored.

A turn: validate (one line per bad field, before anything else), read the session and history
in one read-only transaction, lay out the prompt, decide topic and temperature (before the
engine only when the sampling temperature depends on it), stream from the engine under the
session's lock, then commit the messages, statistics and session state in **one** transaction;
bookkeeping follows in the background (``turns``, ``turn_path``). If the engine raises, the
stream is closed early or the commit fails, nothing of the turn is stored (the caller still has
the message and may send it again). With ``create=True`` (and for a new session in
``complete``) the session row is created in that same commit, so a failed first turn leaves no
session.

**Concurrency.** Turns of one session are serialised by a per-session lock held only while the
turn runs (``locks``); an abandoned stream releases it when collected; a waiting turn times out
with ``SessionBusyError``. Different sessions never wait for each other. On PostgreSQL (an
advisory lock) and on a SQLite file with ``durability="sync"`` (a byte-range file lock),
``cluster.SharedTurnLock`` extends that across processes, and a turn plans again from the
stored history once it holds it, so no process generates from stale history.

The manager never imports torch or vLLM: it speaks the ``Engine`` protocol only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from suffixmem import heap
from suffixmem.conversation.anon_keys import AnonKeys
from suffixmem.conversation.background import Background, Job
from suffixmem.conversation.cluster import SharedTurnLock
from suffixmem.conversation.layout import LAYOUTS, Layout
from suffixmem.conversation.locks import SessionBusyError, SessionLocks
from suffixmem.conversation.manager_config import ManagerConfig, SessionInfo
from suffixmem.conversation.reconcile import check_messages, reconcile
from suffixmem.conversation.records import NewMessage, NewSession, totals
from suffixmem.conversation.store import Store
from suffixmem.conversation.temperature import scheme_for, session_range
from suffixmem.conversation.topic import TopicDetector, TopicVerdict, default_detector
from suffixmem.conversation.topic_cache import TopicCache
from suffixmem.conversation.turn_path import TurnPath
from suffixmem.conversation.turns import (
    PENDING,
    Plan,
    TurnResult,
    TurnSpec,
    alast_event,
    build_prompt,
    check_system_fits,
    last_event,
    schema_instruction,
)
from suffixmem.conversation.validation import check_sampling, check_session_id, check_text
from suffixmem.conversation.versions import Versions
from suffixmem.engine.async_stream import aiter_events
from suffixmem.engine.protocol import Engine, Message, Request, Result, SamplingParams, TokenEvent
from suffixmem.errors import InvalidRequestError, UnknownSessionError
from suffixmem.retention import PinnedLRU, RetentionPolicy
from suffixmem.tokens import TokenCounter

__all__ = [
    "ConversationManager", "ManagerConfig", "SessionBusyError", "SessionInfo", "TurnResult",
]

log = logging.getLogger(__name__)


class ConversationManager(TurnPath):
    """Sessions, history and turns over any engine that follows the protocol."""

    def __init__(self, engine: Engine, database_url: str | None = None,
                 config: ManagerConfig | None = None) -> None:
        if not isinstance(database_url, str | None):
            raise TypeError(f"database_url must be a string (a SQLAlchemy URL) or None, got "
                            f"{type(database_url).__name__}; pass the settings as config=...")
        if config is not None and not isinstance(config, ManagerConfig):
            raise TypeError(f"config must be a ManagerConfig, got {type(config).__name__}")
        self.engine: Engine = engine
        self.config = config or ManagerConfig()
        self.store = Store(database_url or self.config.default_database_url())
        self.layout: Layout = (
            LAYOUTS[self.config.layout](self.config.evict_fraction)  # type: ignore[call-arg]
            if self.config.layout == "stable" else LAYOUTS[self.config.layout]()
        )
        cfg = self.config
        self.temperature = scheme_for(engine.model_name, cfg.start_temperature,
                                      cfg.jump_temperature, cfg.temperature_recovery)
        self.counter = TokenCounter(engine)
        self.retention: RetentionPolicy = self.config.retention or PinnedLRU()
        # the rag class goes approximate only where the engine's method passed its gate in the
        # dtype it serves (None), unless the caller decided
        gated = getattr(engine, "reuse_passes_gate", None)
        self.rag_reuse: bool = (cfg.rag_reuse if cfg.rag_reuse is not None
                                else bool(gated is not None and gated("rag")))
        self.topics = TopicCache(self.config.detect_topics, self.config.topic_detector,
                                 default_detector)
        self._locks = SessionLocks(self.config.lock_timeout_s)
        # across processes: PostgreSQL, and SQLite files written by several ("sync")
        self._shared = SharedTurnLock(self.store, processes=self.config.durability == "sync")
        # session -> writes by this manager; a turn re-reads its state only if it moved
        self._versions = Versions()
        self._anon = AnonKeys()  # stateless calls' keys, across the caller's window
        self._topic_updates: dict[str, Job] = {}
        self._background = Background()
        heap.settle()  # its objects (SQLAlchemy's, the store's) out of full collections too

    # -- sessions -------------------------------------------------------------------------------
    def open_session(self, session_id: str | None = None, *, title: str | None = None,
                     system_prompt: str | None = None) -> SessionInfo:
        """Create the session if missing, else return it unchanged."""
        if session_id is not None:
            check_session_id(session_id)
        if title is not None:
            check_text("title", title, max_chars=1000)
        sp = system_prompt if system_prompt is not None else self.config.system_prompt
        if sp is not None:
            check_text("system_prompt", sp, max_chars=self.config.max_message_chars)
            # tokenized now rather than inside the first turn (the template keeps the ids)
            check_system_fits(self.engine, sp, self.config.context_window)
        rec, _ = self.store.open_session(
            session_id, title=title, model=self.engine.model_name, system_prompt=sp,
            temperature=self.temperature.initial(),
        )
        return SessionInfo.from_record(rec)

    def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_record(self.store.require_session(session_id))

    def list_sessions(self) -> list[SessionInfo]:
        """All sessions, most recently active first."""
        return [SessionInfo.from_record(r) for r in self.store.list_sessions()]

    def fork_session(self, session_id: str, new_id: str | None = None) -> SessionInfo:
        with self._locks.hold(check_session_id(session_id), "fork_session"):
            return SessionInfo.from_record(self.store.fork_session(session_id, new_id))

    def delete_session(self, session_id: str) -> None:
        """Delete the session's rows (``UnknownSessionError`` when there are none), then what
        this manager holds of it, as ``forget_session``."""
        with self._locks.hold(check_session_id(session_id), "delete_session"):
            self.store.delete_session(session_id)
            self._forget(session_id)
        self._drop_kv(session_id)

    def forget_session(self, session_id: str) -> None:
        """Drop what this manager holds of a session whose rows are gone (deleted through
        another manager or process): its topic state, its cached segments and its KV, KV tier
        included, so a session re-created under that id starts cold. Nothing to drop is no
        error; a session that still exists only loses its cache (its next turn is cold)."""
        with self._locks.hold(check_session_id(session_id), "forget_session"):
            self._forget(session_id)
        self._drop_kv(session_id)

    def _drop_kv(self, session_id: str) -> None:
        self._release(session_id)
        try:  # the history is gone; KV files left behind would only waste the tier's budget
            self.engine.delete_session_kv(session_id)
        except Exception:
            log.warning("deleting the KV of session %s failed", session_id, exc_info=True)

    def history(self, session_id: str) -> list[Message]:
        """Committed messages in order; assistant messages carry their generated token ids."""
        return [m.to_message() for m in self.store.messages(session_id)]

    def append_messages(self, session_id: str, messages: Sequence[Message], *,
                        replace: bool = False) -> None:
        """Append messages without generating (for framework chat-history stores), atomically.
        Empty non-assistant messages are rejected (they would poison every later turn).
        ``replace=True`` clears the history first (a chat store's ``set_messages``), only once
        every message passed its checks: a bad one changes nothing."""
        check_session_id(session_id)
        new = []
        for i, m in enumerate(messages):
            if not isinstance(m, Message):
                raise InvalidRequestError(
                    f"messages[{i}] is a {type(m).__name__}, not a suffixmem Message")
            check_text(f"messages[{i}].content", m.content,
                       max_chars=self.config.max_message_chars,
                       allow_empty=m.role == "assistant")
            n = len(m.token_ids) if m.token_ids is not None else self.counter.count(m.content)
            new.append(NewMessage(m.role, m.content, m.token_ids, n))
        with self._locks.hold(session_id, "append_messages"):
            if new or replace:
                self.store.append_messages(
                    session_id, new, replace_at=self.temperature.initial() if replace else None)
            self._forget(session_id)
        if replace:
            self._release(session_id)

    def set_temperature_range(self, session_id: str, hot: float | None = None,
                              cold: float | None = None) -> SessionInfo:
        """Store the session's own semantic temperature range (``temperature.py``): ``hot``
        while a topic holds, ``cold`` on a jump; None: the manager's. Its current temperature
        moves into the range; a per-call ``temperature=`` still wins."""
        scheme = self.temperature.with_range(hot, cold)  # InvalidRequestError names the field
        with self._locks.hold(check_session_id(session_id), "set_temperature_range"):
            rec = self.store.set_temperature_range(session_id, hot, cold, scheme.clamp)
            self._versions.bump(session_id)
        return SessionInfo.from_record(rec)

    def clear_history(self, session_id: str) -> None:
        with self._locks.hold(check_session_id(session_id), "clear_history"):
            self.store.clear_history(session_id, self.temperature.initial())
            self._forget(session_id)
        self._release(session_id)

    # -- turns: one user message ----------------------------------------------------------------
    def chat(self, session_id: str, message: str, *, context: Sequence[str] = (),
             create: bool = False, **sampling: Any) -> TurnResult:
        """One blocking turn (``stream_chat`` drained)."""
        return last_event(self.stream_chat(session_id, message, context=context, create=create,
                                      **sampling))

    def stream_chat(self, session_id: str, message: str, *, context: Sequence[str] = (),
                    create: bool = False, **sampling: Any) -> Iterator[TokenEvent | TurnResult]:
        """``TokenEvent``s as they are generated, then one ``TurnResult`` once the turn is
        committed. Bad input raises here, before any generation; a failure or an early close
        stores nothing. ``create=True`` creates a missing session with the turn's commit."""
        started = time.perf_counter()
        sid = check_session_id(session_id)
        check_text("message", message, max_chars=self.config.max_message_chars)
        if isinstance(context, str):
            context = (context,)
        ctx = tuple(context)
        for i, c in enumerate(ctx):
            check_text(f"context[{i}]", c, max_chars=self.config.max_message_chars)
        params = check_sampling(sampling)

        def spec() -> TurnSpec:
            version = self._versions.get(sid)
            state = self.store.turn_state(sid)
            if state is None and not create:
                raise UnknownSessionError(sid)
            rec, stored = state if state is not None else (None, [])
            new = None if rec is not None else self._new_session()
            return TurnSpec(
                key=sid, session_id=sid, kind="new" if rec is None else "appended",
                system_prompt=rec.system_prompt if rec is not None else new.system_prompt,
                history=[m.to_message() for m in stored], tail=message, context=ctx,
                to_store=[Message("user", message)], user_text=message,
                session_temperature=rec.temperature if rec is not None
                else self.temperature.initial(),
                window_start=rec.window_start if rec is not None else 0,
                stored_count=len(stored), version=version, sampling=params, create=new,
                started=started,
                temperature_range=session_range(rec),
            )

        return self._turn(self._plan(spec()), spec)

    # -- turns: a resent message list -----------------------------------------------------------
    def complete(self, session_id: str | None, messages: Sequence[Message], *,
                 show_schema: bool = False, anon_scope: str = "", **sampling: Any) -> TurnResult:
        """``stream_complete`` drained."""
        return last_event(self.stream_complete(session_id, messages, show_schema=show_schema,
                                               anon_scope=anon_scope, **sampling))

    def stream_complete(self, session_id: str | None, messages: Sequence[Message], *,
                        show_schema: bool = False, anon_scope: str = "",
                        continue_single: bool = False, **sampling: Any
                        ) -> Iterator[TokenEvent | TurnResult]:
        """Answer ``messages`` (the whole conversation, as frameworks send it), reconciled with
        the stored session (see ``reconcile``); ``session_id=None`` is stateless, and so is one
        user message sent alone to a session with history unless ``continue_single``. With
        ``show_schema`` and a ``json_schema``, a system message showing the schema follows the
        conversation (not stored). ``anon_scope`` (stateless calls): who may share the derived
        cache key, e.g. an API key's namespace; the key follows the conversation across the
        caller's own sliding window (``anon_keys``). Same atomicity as ``stream_chat``."""
        started = time.perf_counter()
        sid = None if session_id is None else check_session_id(session_id)
        msgs = check_messages(messages, self.config.max_message_chars)
        params = check_sampling(sampling)
        schema = params.get("json_schema")
        if show_schema and not isinstance(schema, dict):
            raise InvalidRequestError("show_schema needs a json_schema (a dict)")

        def spec() -> TurnSpec:
            version = self._versions.get(sid) if sid is not None else 0
            state = self.store.turn_state(sid) if sid is not None else None
            rec, stored = state if state is not None else (None, None)
            r = reconcile(msgs, None if stored is None else [m.to_message() for m in stored],
                          rec.system_prompt if rec is not None else None,
                          self.config.system_prompt, continue_single=continue_single)
            owner = sid if r.kind != "stateless" else None  # None: the turn stores nothing
            if owner is None:
                rec = stored = None
            tail = list(r.tail)
            if show_schema:
                tail.append(schema_instruction(schema))  # type: ignore[arg-type]
            users = [m.content for m in r.tail if m.role == "user"]
            new = None
            if rec is None and owner is not None:
                new = self._new_session(r.system_prompt)
            elif r.replace:
                new = NewSession(rec.title, rec.model, r.system_prompt)  # type: ignore[union-attr]
            return TurnSpec(
                key=sid if sid is not None else self._anon.key(msgs, anon_scope),  # its cache
                session_id=owner, kind=r.kind if owner is not None else "stateless",
                system_prompt=r.system_prompt,
                history=list(r.history), tail=tail, context=(), to_store=list(r.to_store),
                user_text=users[-1] if users else None,
                session_temperature=rec.temperature if rec is not None
                else self.temperature.initial(),
                window_start=r.window_start(rec.window_start) if rec is not None else 0,
                stored_count=len(stored) if stored is not None else 0,
                version=version if owner is not None else 0,
                sampling=params, create=new, replace=r.replace,
                fresh_topic=r.replace or owner is None, started=started,
                temperature_range=session_range(rec),
            )

        return self._turn(self._plan(spec()), spec)

    # -- async twins ----------------------------------------------------------------------------
    # they drain the streams: a cancelled call aborts its turn (run whole in a worker thread,
    # the turn went on, and was stored, after its caller left)
    async def achat(self, session_id: str, message: str, **kwargs: Any) -> TurnResult:
        return await alast_event(self.astream_chat(session_id, message, **kwargs))

    async def acomplete(self, session_id: str | None, messages: Sequence[Message],
                        **kwargs: Any) -> TurnResult:
        return await alast_event(self.astream_complete(session_id, messages, **kwargs))

    async def astream_chat(self, session_id: str, message: str, **kwargs: Any
                           ) -> AsyncIterator[TokenEvent | TurnResult]:
        events = await asyncio.to_thread(self.stream_chat, session_id, message, **kwargs)
        async for e in aiter_events(events):
            yield e

    async def astream_complete(self, session_id: str | None, messages: Sequence[Message],
                               **kwargs: Any) -> AsyncIterator[TokenEvent | TurnResult]:
        events = await asyncio.to_thread(self.stream_complete, session_id, messages, **kwargs)
        async for e in aiter_events(events):
            yield e

    # -- raw text completion --------------------------------------------------------------------
    def stream_text(self, session_key: str, prompt: str, **sampling: Any
                    ) -> Iterator[TokenEvent | Result]:
        """Complete raw ``prompt`` (no chat template; special tokens never parsed). Stateless:
        nothing is stored; ``session_key`` only namespaces the engine's cache."""
        key = check_session_id(session_key, "session_key")
        check_text("prompt", prompt, max_chars=self.config.max_message_chars)
        params = {"max_tokens": self.config.max_tokens,
                  "temperature": self.temperature.initial(), **check_sampling(sampling)}
        ids = self.engine.tokenize(prompt)
        if not ids:
            raise InvalidRequestError("prompt is empty after tokenization")
        return self.engine.stream(Request(session_key=key, token_ids=ids,
                                          sampling=SamplingParams(**params)))

    def complete_text(self, session_key: str, prompt: str, **sampling: Any) -> Result:
        return last_event(self.stream_text(session_key, prompt, **sampling))

    # -- the turn path --------------------------------------------------------------------------
    def _new_session(self, system_prompt: str | None = None) -> NewSession:
        return NewSession(None, self.engine.model_name,
                          system_prompt if system_prompt is not None
                          else self.config.system_prompt)

    def _plan(self, spec: TurnSpec) -> Plan:
        """The prompt and the checked sampling values (bad ones raise here); the topic verdict
        and the semantic temperature are decided later, under the session's lock
        (``TurnPath._decide``)."""
        sampling = SamplingParams(**{"max_tokens": self.config.max_tokens,
                                     "temperature": spec.session_temperature, **spec.sampling})
        prompt = build_prompt(self.layout, self.engine, spec, int(self.engine.max_model_len),
                              self.config.context_window, self.config.reply_reserve, sampling)
        return Plan(spec, prompt, PENDING, spec.session_temperature, sampling)

    def _temperature(self, spec: TurnSpec, verdict: TopicVerdict) -> float:
        """The session's semantic temperature after this turn's verdict. With detection off
        there are no jumps: a session warms from its cold first turn like an on-topic one
        (it stayed greedy for good)."""
        off = verdict.reason == "detection off" and bool(spec.history)
        if verdict.similarity is None and not off:
            return spec.session_temperature
        scheme = self.temperature.for_session(*spec.temperature_range)  # the session's own range
        return scheme.next(spec.session_temperature, verdict.jump)

    def detector(self) -> TopicDetector:
        """The topic detector (built on first use)."""
        return self.topics.detector()

    # -- plumbing -------------------------------------------------------------------------------
    def stats(self, session_id: str | None = None) -> dict[str, Any]:
        """Totals from the committed turns' events (one session, or all)."""
        if session_id is not None:
            self.store.require_session(session_id)
        out = totals(self.store.turn_events(session_id))
        if session_id is not None:
            out["session_id"] = session_id
            out["temperature"] = self.store.require_session(session_id).temperature
        else:
            out["sessions"] = len(self.store.list_sessions())
        return out

    def flush(self) -> None:
        """Run the pending bookkeeping now and wait for it (tests, shutdown)."""
        self._background.flush()

    def close(self) -> None:
        """Finish bookkeeping and close the database connections (the engine is the
        caller's to close)."""
        self._background.close()
        self.store.close()

    def __enter__(self) -> ConversationManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
