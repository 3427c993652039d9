"""The conversation manager: sessions in SQL, prompts laid out for the cache, atomic turns.

Entry points (all end in the same turn path, ``turns``):

- ``chat`` / ``stream_chat``: one user message against the stored session;
- ``complete`` / ``stream_complete``: a framework resends the whole message list; it is
  reconciled with the stored session (``reconcile``: new / appended / rewritten / stateless);
- async twins ``achat``, ``astream_chat``, ``acomplete``, ``astream_complete``: the blocking
  work runs in worker threads; closing the async iterator aborts the turn and stores nothing;
- ``stream_text`` / ``complete_text``: raw text completion, stateless, nothing stored.

A turn: validate (one line per bad field, before anything else), read the session and history
in one transaction, decide topic and temperature, lay out the prompt, stream from the engine
under the session's lock, then commit the messages, statistics and session state in **one**
transaction. If the engine raises, the stream is closed early or the commit fails, nothing of
the turn is stored (the caller still has the message and may send it again). With
``create=True`` (and for a new session in ``complete``) the session row is created in that same
commit, so a failed first turn leaves no session.

**Concurrency.** Turns of one session are serialised by a per-session lock held only while the
turn runs (``locks``); an abandoned stream releases it when collected; a waiting turn times out
with ``SessionBusyError``. Different sessions never wait for each other. The store serialises
writers too, so several managers (processes) sharing one database lose nothing.

The manager never imports torch or vLLM: it speaks the ``Engine`` protocol only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from suffixmem.conversation import segment_log
from suffixmem.conversation.layout import LAYOUTS, Layout
from suffixmem.conversation.locks import SessionBusyError, SessionLocks
from suffixmem.conversation.reconcile import anon_key, check_messages, reconcile
from suffixmem.conversation.records import NewMessage, NewSession, SessionRecord
from suffixmem.conversation.store import Store
from suffixmem.conversation.topic import (
    JUMP_TEMPERATURE,
    START_TEMPERATURE,
    SemanticTemperature,
    TopicDetector,
    TopicState,
    TopicVerdict,
)
from suffixmem.conversation.turns import (
    Plan,
    TurnResult,
    TurnSpec,
    build_prompt,
    stream_turn,
    turn_event,
    turn_messages,
    turn_pairs,
    turn_result,
)
from suffixmem.conversation.validation import (
    MAX_TEXT_CHARS,
    check_sampling,
    check_session_id,
    check_text,
)
from suffixmem.engine.protocol import Engine, Message, Request, Result, SamplingParams, TokenEvent
from suffixmem.errors import ConfigError, InvalidRequestError, UnknownSessionError
from suffixmem.retention import PinnedLRU, RetentionPolicy
from suffixmem.tokens import TokenCounter

__all__ = [
    "ConversationManager", "ManagerConfig", "SessionBusyError", "SessionInfo", "TurnResult",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class ManagerConfig:
    """Settings of a ``ConversationManager``.

    - ``system_prompt``: default system prompt of new sessions (None: the model template's).
    - ``layout``: ``"stable"`` (cache-stable, the default) or ``"sliding"`` (baseline).
    - ``evict_fraction``: share of the budget freed at once when the prompt is too long.
    - ``context_window``: tokens the prompt plus reply may use (None: the engine's
      ``max_model_len``). The budget for the prompt is this minus ``reply_reserve``
      (None: the turn's ``max_tokens``).
    - ``max_tokens``: default reply length.
    - ``start_temperature`` / ``jump_temperature`` / ``temperature_recovery``: semantic
      temperature (0.8, 0.3, +0.1 per turn on topic).
    - ``topic_detector``: the detector (None: ``default_detector()``, fitted on the bundled
      corpus when available); ``detect_topics=False`` turns detection off.
    - ``retention``: the segment retention policy of the segment log (None: ``PinnedLRU``,
      the same default as the engine's segment cache).
    - ``lock_timeout_s``: how long a turn waits for its session's lock (``SessionBusyError``).
    - ``max_message_chars``: size limit of each message / context block / system prompt.
    - ``exact``: passed to the engine (False lets it reuse document segments approximately).
    """

    system_prompt: str | None = None
    layout: str = "stable"
    evict_fraction: float = 0.5
    context_window: int | None = None
    reply_reserve: int | None = None
    max_tokens: int = 256
    start_temperature: float = START_TEMPERATURE
    jump_temperature: float = JUMP_TEMPERATURE
    temperature_recovery: float = 0.1
    detect_topics: bool = True
    topic_detector: TopicDetector | None = None
    retention: RetentionPolicy | None = None
    lock_timeout_s: float = 60.0
    max_message_chars: int = MAX_TEXT_CHARS
    record_segments: bool = True
    exact: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"unknown layout {self.layout!r}; expected one of {list(LAYOUTS)}")
        if not 0.0 < self.evict_fraction < 1.0:
            raise ConfigError(f"evict_fraction must be in (0, 1), got {self.evict_fraction}")
        if self.context_window is not None and self.context_window < 32:
            raise ConfigError(f"context_window must be >= 32, got {self.context_window}")
        if self.reply_reserve is not None and self.reply_reserve < 1:
            raise ConfigError(f"reply_reserve must be >= 1, got {self.reply_reserve}")
        if not self.lock_timeout_s > 0:
            raise ConfigError(f"lock_timeout_s must be > 0, got {self.lock_timeout_s}")
        if self.max_message_chars < 1:
            raise ConfigError(f"max_message_chars must be >= 1, got {self.max_message_chars}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @staticmethod
    def default_database_url() -> str:
        """SQLite under ``SUFFIXMEM_HOME`` unless ``$SUFFIXMEM_DATABASE_URL`` is set."""
        from suffixmem.config import default_database_url

        return default_database_url()


@dataclass(slots=True, frozen=True)
class SessionInfo:
    id: str
    title: str | None
    model: str | None
    temperature: float
    state: str
    created_at: datetime
    updated_at: datetime
    message_count: int
    system_prompt: str | None

    @classmethod
    def from_record(cls, r: SessionRecord) -> SessionInfo:
        return cls(r.id, r.title, r.model, r.temperature, r.state, r.created_at, r.updated_at,
                   r.message_count, r.system_prompt)


class ConversationManager:
    """Sessions, history and turns over any engine that follows the protocol."""

    def __init__(self, engine: Engine, database_url: str | None = None,
                 config: ManagerConfig | None = None) -> None:
        self.engine: Engine = engine
        self.config = config or ManagerConfig()
        self.store = Store(database_url or self.config.default_database_url())
        self.layout: Layout = (
            LAYOUTS[self.config.layout](self.config.evict_fraction)  # type: ignore[call-arg]
            if self.config.layout == "stable" else LAYOUTS[self.config.layout]()
        )
        self.temperature = SemanticTemperature(
            self.config.start_temperature, self.config.jump_temperature,
            self.config.temperature_recovery,
        )
        self.counter = TokenCounter(engine)
        self.retention: RetentionPolicy = self.config.retention or PinnedLRU()
        self._detector = self.config.topic_detector
        self._detector_lock = threading.Lock()
        self._locks = SessionLocks(self.config.lock_timeout_s)
        # session -> (message count, topic state) so the topic is not replayed every turn
        self._topics: dict[str, tuple[int, TopicState]] = {}
        # session -> writes by this manager; a turn re-reads its state only if it moved
        self._versions: dict[str, int] = {}
        self._bookkeeping = ThreadPoolExecutor(1, thread_name_prefix="suffixmem-segments")

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
        rec, _ = self.store.open_session(
            session_id, title=title, model=self.engine.model_name, system_prompt=sp,
            temperature=self.config.start_temperature,
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
        with self._locks.hold(check_session_id(session_id), "delete_session"):
            self.store.delete_session(session_id)
            self._forget(session_id)
        self._release(session_id)

    def history(self, session_id: str) -> list[Message]:
        """Committed messages in order; assistant messages carry their generated token ids."""
        return [m.to_message() for m in self.store.messages(session_id)]

    def append_messages(self, session_id: str, messages: Sequence[Message]) -> None:
        """Append messages without generating (for framework chat-history stores), atomically.
        Empty non-assistant messages are rejected (they would poison every later turn)."""
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
            self.store.append_messages(session_id, new)
            self._forget(session_id)

    def clear_history(self, session_id: str) -> None:
        with self._locks.hold(check_session_id(session_id), "clear_history"):
            self.store.clear_history(session_id)
            self._forget(session_id)
        self._release(session_id)

    # -- turns: one user message ----------------------------------------------------------------
    def chat(self, session_id: str, message: str, *, context: Sequence[str] = (),
             create: bool = False, **sampling: Any) -> TurnResult:
        """One blocking turn (``stream_chat`` drained)."""
        return _last(self.stream_chat(session_id, message, context=context, create=create,
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
            version = self._versions.get(sid, 0)
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
                else self.config.start_temperature,
                window_start=rec.window_start if rec is not None else 0,
                stored_count=len(stored), version=version, sampling=params, create=new,
                started=started,
            )

        return self._run(self._plan(spec()), spec)

    # -- turns: a resent message list -----------------------------------------------------------
    def complete(self, session_id: str | None, messages: Sequence[Message], *,
                 show_schema: bool = False, **sampling: Any) -> TurnResult:
        """``stream_complete`` drained."""
        return _last(self.stream_complete(session_id, messages, show_schema=show_schema,
                                          **sampling))

    def stream_complete(self, session_id: str | None, messages: Sequence[Message], *,
                        show_schema: bool = False, **sampling: Any
                        ) -> Iterator[TokenEvent | TurnResult]:
        """Answer ``messages`` (the whole conversation, as frameworks send it), reconciled with
        the stored session (see ``reconcile``); ``session_id=None`` is stateless. With
        ``show_schema`` and a ``json_schema``, a system message showing the schema follows the
        conversation (not stored). Same atomicity as ``stream_chat``."""
        started = time.perf_counter()
        sid = None if session_id is None else check_session_id(session_id)
        msgs = check_messages(messages, self.config.max_message_chars)
        params = check_sampling(sampling)
        schema = params.get("json_schema")
        if show_schema and not isinstance(schema, dict):
            raise InvalidRequestError("show_schema needs a json_schema (a dict)")

        def spec() -> TurnSpec:
            version = self._versions.get(sid, 0) if sid is not None else 0
            state = self.store.turn_state(sid) if sid is not None else None
            rec, stored = state if state is not None else (None, None)
            r = reconcile(msgs, None if stored is None else [m.to_message() for m in stored],
                          rec.system_prompt if rec is not None else None,
                          self.config.system_prompt)
            tail = list(r.tail)
            if show_schema:
                tail.append(schema_instruction(schema))  # type: ignore[arg-type]
            users = [m.content for m in r.tail if m.role == "user"]
            new = None
            if rec is None and sid is not None:
                new = self._new_session(r.system_prompt)
            elif r.replace:
                new = NewSession(rec.title, rec.model, r.system_prompt)  # type: ignore[union-attr]
            return TurnSpec(
                key=sid if sid is not None else anon_key(msgs), session_id=sid,
                kind=r.kind if sid is not None else "stateless", system_prompt=r.system_prompt,
                history=list(r.history), tail=tail, context=(), to_store=list(r.to_store),
                user_text=users[-1] if users else None,
                session_temperature=rec.temperature if rec is not None
                else self.config.start_temperature,
                window_start=rec.window_start if rec is not None and not r.replace else 0,
                stored_count=len(stored) if stored is not None else 0, version=version,
                sampling=params, create=new, replace=r.replace,
                fresh_topic=r.replace or sid is None, started=started,
            )

        return self._run(self._plan(spec()), spec)

    # -- async twins ----------------------------------------------------------------------------
    async def achat(self, session_id: str, message: str, **kwargs: Any) -> TurnResult:
        return await asyncio.to_thread(self.chat, session_id, message, **kwargs)

    async def acomplete(self, session_id: str | None, messages: Sequence[Message],
                        **kwargs: Any) -> TurnResult:
        return await asyncio.to_thread(self.complete, session_id, messages, **kwargs)

    async def astream_chat(self, session_id: str, message: str, **kwargs: Any
                           ) -> AsyncIterator[TokenEvent | TurnResult]:
        events = await asyncio.to_thread(self.stream_chat, session_id, message, **kwargs)
        async for e in _athread(events):
            yield e

    async def astream_complete(self, session_id: str | None, messages: Sequence[Message],
                               **kwargs: Any) -> AsyncIterator[TokenEvent | TurnResult]:
        events = await asyncio.to_thread(self.stream_complete, session_id, messages, **kwargs)
        async for e in _athread(events):
            yield e

    # -- raw text completion --------------------------------------------------------------------
    def stream_text(self, session_key: str, prompt: str, **sampling: Any
                    ) -> Iterator[TokenEvent | Result]:
        """Complete raw ``prompt`` (no chat template; special tokens never parsed). Stateless:
        nothing is stored; ``session_key`` only namespaces the engine's cache."""
        key = check_session_id(session_key, "session_key")
        check_text("prompt", prompt, max_chars=self.config.max_message_chars)
        params = {"max_tokens": self.config.max_tokens,
                  "temperature": self.config.start_temperature, **check_sampling(sampling)}
        ids = self.engine.tokenize(prompt)
        if not ids:
            raise InvalidRequestError("prompt is empty after tokenization")
        return self.engine.stream(Request(session_key=key, token_ids=ids,
                                          sampling=SamplingParams(**params)))

    def complete_text(self, session_key: str, prompt: str, **sampling: Any) -> Result:
        return _last(self.stream_text(session_key, prompt, **sampling))

    # -- the turn path --------------------------------------------------------------------------
    def _new_session(self, system_prompt: str | None = None) -> NewSession:
        return NewSession(None, self.engine.model_name,
                          system_prompt if system_prompt is not None
                          else self.config.system_prompt)

    def _plan(self, spec: TurnSpec) -> Plan:
        verdict = self._detect(spec)
        temperature = (
            self.temperature.next(spec.session_temperature, verdict.jump)
            if verdict.similarity is not None else spec.session_temperature
        )
        sampling = SamplingParams(**{"max_tokens": self.config.max_tokens,
                                     "temperature": temperature, **spec.sampling})
        prompt = build_prompt(self.layout, self.engine, spec, int(self.engine.max_model_len),
                              self.config.context_window, self.config.reply_reserve, sampling)
        return Plan(spec, prompt, verdict, temperature, sampling)

    def _run(self, plan: Plan, respec: Callable[[], TurnSpec]
             ) -> Iterator[TokenEvent | TurnResult]:
        sid = plan.spec.session_id
        lock = self._locks.hold(sid, f"turn {id(plan):x}") if sid is not None else _nolock()
        with lock:
            if sid is not None and self._versions.get(sid, 0) != plan.spec.version:
                plan = self._plan(respec())  # another turn of this manager landed meanwhile
            if plan.verdict.jump and sid is not None:
                self._release(sid)
            engine_start = time.perf_counter()
            result: Result | None = None
            for event in stream_turn(self.engine, plan, self.config.exact):
                if isinstance(event, Result):
                    result = event
                else:
                    yield event
            assert result is not None  # stream_turn raises otherwise
            done = time.perf_counter()
            messages, text = turn_messages(plan, result, self.engine, self.counter.count)
            if sid is not None:
                self.store.commit_turn(
                    sid, messages, turn_event(plan, result), temperature=plan.temperature,
                    window_start=plan.prompt.window_start, create=plan.spec.create,
                    replace_history=plan.spec.replace,
                )
                self._versions[sid] = self._versions.get(sid, 0) + 1
                self._advance_topic(plan, text)
                if self.config.record_segments and plan.prompt.segments:
                    self._bookkeeping.submit(self._record_segments, sid, plan, result)
            overhead = (engine_start - plan.spec.started) + (time.perf_counter() - done)
            turn = turn_result(plan, result, text, overhead)
        yield turn

    def _record_segments(self, sid: str, plan: Plan, result: Result) -> None:
        try:
            segment_log.record(self.store, self.retention, sid, plan.prompt, result)
        except Exception:  # bookkeeping only: the turn itself is committed
            log.warning("segment bookkeeping failed for session %s", sid, exc_info=True)

    # -- topics ---------------------------------------------------------------------------------
    def detector(self) -> TopicDetector:
        """The topic detector (built on first use)."""
        with self._detector_lock:
            if self._detector is None:
                from suffixmem.conversation.topic import default_detector

                self._detector = default_detector()
            return self._detector

    def _detect(self, spec: TurnSpec) -> TopicVerdict:
        if not self.config.detect_topics:
            return TopicVerdict(False, None, reason="detection off")
        if spec.user_text is None:
            return TopicVerdict(False, None, reason="no user message")
        detector = self.detector()
        cached = None if spec.fresh_topic else self._topics.get(spec.key)
        if cached is None or cached[0] != len(spec.history):
            state = detector.replay(turn_pairs(spec.history))
            if not spec.fresh_topic:
                self._topics[spec.key] = (len(spec.history), state)
        else:
            state = cached[1]
        return detector.observe_user(state, spec.user_text)

    def _advance_topic(self, plan: Plan, reply: str) -> None:
        key = plan.spec.key
        if not self.config.detect_topics or plan.spec.user_text is None:
            self._topics.pop(key, None)
            return
        cached = self._topics.get(key)
        if plan.spec.fresh_topic or cached is None or cached[0] != len(plan.spec.history):
            self._topics.pop(key, None)  # rebuilt from the store next time
            return
        state = cached[1]
        self.detector().add_turn(state, plan.spec.user_text, reply, plan.verdict.jump)
        self._topics[key] = (len(plan.spec.history) + len(plan.spec.to_store) + 1, state)

    # -- plumbing -------------------------------------------------------------------------------
    def _forget(self, session_id: str) -> None:
        self._topics.pop(session_id, None)
        self._versions[session_id] = self._versions.get(session_id, 0) + 1

    def _release(self, session_id: str) -> None:
        try:
            self.engine.release_session(session_id)
        except Exception:  # the cache is an optimisation; a failed release is not fatal
            log.warning("engine.release_session(%r) failed", session_id, exc_info=True)
        try:
            self.store.release_segments(session_id)
        except Exception:
            log.warning("releasing segments of %s in the store failed", session_id,
                        exc_info=True)

    def stats(self, session_id: str | None = None) -> dict[str, Any]:
        """Totals from the committed turns' events (one session, or all)."""
        if session_id is not None:
            self.store.require_session(session_id)
        events = self.store.turn_events(session_id)
        prompt = sum(e.prompt_tokens for e in events)
        cached = sum(e.cached_tokens for e in events)
        n = len(events)
        out: dict[str, Any] = {
            "turns": n,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "output_tokens": sum(e.output_tokens for e in events),
            "hit_rate": cached / prompt if prompt else 0.0,
            "mean_ttft_s": sum(e.ttft_s for e in events) / n if n else 0.0,
            "mean_latency_s": sum(e.latency_s for e in events) / n if n else 0.0,
            "topic_jumps": sum(1 for e in events if e.topic_jump),
            "evicted_turns": sum(e.evicted_turns for e in events),
        }
        if session_id is not None:
            out["session_id"] = session_id
            out["temperature"] = self.store.require_session(session_id).temperature
        else:
            out["sessions"] = len(self.store.list_sessions())
        return out

    def flush(self) -> None:
        """Wait for pending segment bookkeeping (tests, shutdown)."""
        self._bookkeeping.submit(lambda: None).result()

    def close(self) -> None:
        """Finish bookkeeping and close the database connections (the engine is the
        caller's to close)."""
        self._bookkeeping.shutdown(wait=True)
        self.store.close()

    def __enter__(self) -> ConversationManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def schema_instruction(json_schema: dict[str, Any]) -> Message:
    """The system message that shows the model the JSON schema its reply is constrained to.
    Guided decoding forces the syntax, not sensible content: a small model shown the schema
    right before its reply closes the JSON far more often. Placed after the conversation, it
    leaves the cached prefix of the history untouched. Not stored."""
    return Message("system", "Reply with a JSON object that matches this JSON schema:\n"
                   + json.dumps(json_schema))


class _nolock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _last(events: Iterator[Any]) -> Any:
    out = None
    for out in events:  # noqa: B007 - the last event is the turn's result
        pass
    if out is None:
        raise InvalidRequestError("the turn produced no result")
    return out


async def _athread(events: Iterator[T]) -> AsyncIterator[T]:
    """Iterate a blocking generator from asyncio, each step in a worker thread; if the consumer
    stops early the generator is closed (in a thread too), which aborts the turn."""
    done = object()
    finished = False
    try:
        while True:
            event = await asyncio.to_thread(next, events, done)
            if event is done:
                finished = True
                return
            yield event  # type: ignore[misc]
    finally:
        if not finished:
            await asyncio.to_thread(events.close)  # type: ignore[attr-defined]
