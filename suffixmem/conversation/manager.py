"""The conversation manager: sessions in SQL, prompts laid out for the cache, atomic turns.

One turn (``chat`` / ``stream_chat``):

1. validate (session exists, message non-empty, sampling values) and load the history;
2. topic: is the message a jump? -> the session's semantic temperature (0.8 -> 0.3 on a jump,
   recovering while the topic holds); on a jump the session's cached segments are released
   (``engine.release_session(session_id)`` when the engine has that optional hook);
3. layout: token ids = system prompt + append-only history (oldest turns evicted in chunks) +
   retrieved ``context`` next to the message, with ``Segment`` marks (system prompt,
   documents); a prompt that cannot fit raises ``ContextWindowError`` before anything runs;
4. ``engine.stream(Request(session_key=session_id, token_ids=..., segments=...))``;
5. when generation has ended, the user message, the assistant message (with the token ids it
   was generated with) and the turn's statistics are committed in **one transaction**.

**Atomicity.** If the engine raises, the stream is closed early (``break``, ``close()``) or the
database refuses the commit, nothing of the turn is stored: the history is exactly as before and
the user's message is *not* stored (the caller still has it and may send it again). Only a
completed generation (finish reason ``stop`` or ``length``) is committed.

**Concurrency.** Turns of one session are serialised by a per-session lock (a turn sees the
previous one's reply); different sessions run in parallel. The store serialises writers too, so
several managers (processes) sharing one database lose nothing.

**Optional engine hook.** ``release_session(session_key: str) -> object``: drop the session's
cached segments (the torch engine's segment cache implements it). Engines without it are fine.

The manager never imports torch or vLLM: it speaks the engine protocol only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from suffixmem.conversation.layout import LAYOUTS, Layout, Prompt
from suffixmem.conversation.store import (
    NewMessage,
    SegmentSighting,
    SessionRecord,
    Store,
    TurnEvent,
    check_session_id,
)
from suffixmem.conversation.topic import (
    JUMP_TEMPERATURE,
    START_TEMPERATURE,
    SemanticTemperature,
    TopicDetector,
    TopicState,
    TopicVerdict,
)
from suffixmem.conversation.value import (
    HeuristicValueScorer,
    Tier,
    ValueFeatures,
    ValueScorer,
    segment_hash,
    token_entropy,
)
from suffixmem.engine.protocol import Message, Request, Result, SamplingParams, TokenEvent
from suffixmem.errors import ConfigError, InvalidRequestError
from suffixmem.tokens import TokenCounter

log = logging.getLogger(__name__)

_SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))


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
    - ``value_scorer``: rates segments for the segment log (None: the heuristic fallback).
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
    value_scorer: ValueScorer | None = None
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
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @staticmethod
    def default_database_url() -> str:
        """SQLite under ``SUFFIXMEM_HOME`` unless ``$SUFFIXMEM_DATABASE_URL`` is set."""
        from suffixmem.config import default_database_url

        return default_database_url()


@dataclass(slots=True)
class TurnResult:
    """The outcome of one committed turn. ``temperature`` is the sampling temperature used;
    ``similarity`` the topic similarity (None on a first turn or with detection off);
    ``evicted_turns`` the turns dropped from the prompt by this turn."""

    text: str
    session_id: str
    result: Result
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    latency_s: float
    topic_jump: bool
    temperature: float
    similarity: float | None
    evicted_turns: int

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


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


@dataclass(slots=True)
class _Plan:
    """Everything decided before generation (nothing stored yet)."""

    session: SessionRecord
    message: str
    prompt: Prompt
    verdict: TopicVerdict
    temperature: float  # the session's new semantic temperature
    sampling: SamplingParams
    history_len: int


class ConversationManager:
    """Sessions, history and turns over any engine that follows the protocol."""

    def __init__(self, engine: Any, database_url: str | None = None,
                 config: ManagerConfig | None = None) -> None:
        self.engine = engine
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
        self.value_scorer: ValueScorer = self.config.value_scorer or HeuristicValueScorer()
        self._detector = self.config.topic_detector
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._detector_lock = threading.Lock()
        # session -> (message count, topic state) so the topic is not replayed every turn
        self._topics: dict[str, tuple[int, TopicState]] = {}

    # -- sessions -------------------------------------------------------------------------------
    def open_session(self, session_id: str | None = None, *, title: str | None = None,
                     system_prompt: str | None = None) -> SessionInfo:
        """Create the session if missing, else return it unchanged."""
        rec, _ = self.store.open_session(
            session_id, title=title, model=getattr(self.engine, "model_name", None),
            system_prompt=system_prompt if system_prompt is not None
            else self.config.system_prompt,
            temperature=self.config.start_temperature,
        )
        return SessionInfo.from_record(rec)

    def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_record(self.store.require_session(session_id))

    def list_sessions(self) -> list[SessionInfo]:
        """All sessions, most recently active first."""
        return [SessionInfo.from_record(r) for r in self.store.list_sessions()]

    def fork_session(self, session_id: str, new_id: str | None = None) -> SessionInfo:
        with self._lock(session_id):
            return SessionInfo.from_record(self.store.fork_session(session_id, new_id))

    def delete_session(self, session_id: str) -> None:
        with self._lock(session_id):
            self.store.delete_session(session_id)
            self._topics.pop(session_id, None)
        self._release(session_id)

    def history(self, session_id: str) -> list[Message]:
        """Committed messages in order; assistant messages carry their generated token ids."""
        return [m.to_message() for m in self.store.messages(session_id)]

    def append_messages(self, session_id: str, messages: Sequence[Message]) -> None:
        """Append messages without generating (for framework chat-history stores), atomically."""
        new = []
        for i, m in enumerate(messages):
            if not isinstance(m, Message):
                raise InvalidRequestError(
                    f"messages[{i}] is a {type(m).__name__}, not a suffixmem Message")
            n = len(m.token_ids) if m.token_ids is not None else self.counter.count(m.content)
            new.append(NewMessage(m.role, m.content, m.token_ids, n))
        with self._lock(session_id):
            self.store.append_messages(session_id, new)
            self._topics.pop(session_id, None)

    def clear_history(self, session_id: str) -> None:
        with self._lock(session_id):
            self.store.clear_history(session_id)
            self._topics.pop(session_id, None)
        self._release(session_id)

    # -- turns ----------------------------------------------------------------------------------
    def chat(self, session_id: str, message: str, *, context: Sequence[str] = (),
             **sampling: Any) -> TurnResult:
        """One blocking turn (built on ``stream_chat``)."""
        out: TurnResult | None = None
        for event in self.stream_chat(session_id, message, context=context, **sampling):
            if isinstance(event, TurnResult):
                out = event
        assert out is not None  # stream_chat ends with a TurnResult or raises
        return out

    def stream_chat(self, session_id: str, message: str, *, context: Sequence[str] = (),
                    **sampling: Any) -> Iterator[TokenEvent | TurnResult]:
        """``TokenEvent``s as they are generated, then one ``TurnResult`` once the turn is
        committed. Bad input raises here, before any generation; see the module docstring for
        what a failure or an early close leaves behind (nothing)."""
        context = self._check_input(session_id, message, context, sampling)
        plan = self._plan(session_id, message, context, sampling)  # eager validation
        return self._run(plan, context, sampling)

    def _check_input(self, session_id: str, message: str, context: Sequence[str],
                     sampling: dict[str, Any]) -> tuple[str, ...]:
        check_session_id(session_id)
        if not isinstance(message, str) or not message.strip():
            raise InvalidRequestError("the message is empty: nothing to answer")
        if isinstance(context, str):
            context = (context,)
        ctx = tuple(context)
        if any(not isinstance(c, str) or not c.strip() for c in ctx):
            raise InvalidRequestError("context blocks must be non-empty strings")
        unknown = set(sampling) - _SAMPLING_FIELDS
        if unknown:
            raise InvalidRequestError(
                f"unknown sampling parameters {sorted(unknown)}; expected some of "
                f"{sorted(_SAMPLING_FIELDS)}")
        return ctx

    def _run(self, plan: _Plan, context: tuple[str, ...],
             sampling: dict[str, Any]) -> Iterator[TokenEvent | TurnResult]:
        sid = plan.session.id
        with self._lock(sid):
            if self.store.require_session(sid).message_count != plan.history_len:
                plan = self._plan(sid, plan.message, context, sampling)  # another turn landed
            if plan.verdict.jump:
                self._release(sid)
            request = Request(
                session_key=sid, token_ids=plan.prompt.token_ids, sampling=plan.sampling,
                segments=plan.prompt.segments, exact=self.config.exact,
            )
            events = self.engine.stream(request)
            result: Result | None = None
            try:
                for event in events:
                    if isinstance(event, Result):
                        result = event
                    else:
                        yield event
            finally:
                if result is None:  # failed or closed early: abort, store nothing
                    close = getattr(events, "close", None)
                    if close is not None:
                        close()
            if result is None:
                raise RuntimeError("engine stream ended without a Result; nothing was stored")
            if result.finish_reason not in ("stop", "length"):
                from suffixmem.errors import EngineClosedError

                raise EngineClosedError(
                    f"generation ended with {result.finish_reason!r}; the turn was not stored")
            turn = self._commit(plan, result)
        yield turn

    def _commit(self, plan: _Plan, result: Result) -> TurnResult:
        sid = plan.session.id
        ids = tuple(result.token_ids)
        # keep the generated ids only when they are exactly the reply's text (a stop string
        # may have cut the text short of the ids); otherwise the reply is re-tokenized later
        keep = ids if ids and self.engine.detokenize(ids) == result.text else None
        user = NewMessage("user", plan.message, None, self.counter.count(plan.message))
        assistant = NewMessage("assistant", result.text, keep,
                               len(keep) if keep is not None else self.counter.count(result.text))
        self.store.commit_turn(
            sid, [user, assistant],
            TurnEvent(
                prompt_tokens=result.prompt_tokens, cached_tokens=result.cached_tokens,
                ttft_s=result.ttft_s, latency_s=result.latency_s,
                temperature=plan.sampling.temperature, output_tokens=len(ids),
                topic_jump=plan.verdict.jump, similarity=plan.verdict.similarity,
                evicted_turns=plan.prompt.evicted_turns, finish_reason=result.finish_reason,
                request_id=result.request_id or None,
            ),
            temperature=plan.temperature, window_start=plan.prompt.window_start,
        )
        self._advance_topic(sid, plan, result.text)
        if self.config.record_segments and plan.prompt.segments:
            try:
                self._record_segments(sid, plan.prompt, result)
            except Exception:  # bookkeeping only: the turn itself is committed
                log.warning("segment bookkeeping failed for session %s", sid, exc_info=True)
        return TurnResult(
            text=result.text, session_id=sid, result=result,
            prompt_tokens=result.prompt_tokens, cached_tokens=result.cached_tokens,
            ttft_s=result.ttft_s, latency_s=result.latency_s, topic_jump=plan.verdict.jump,
            temperature=plan.sampling.temperature, similarity=plan.verdict.similarity,
            evicted_turns=plan.prompt.evicted_turns,
        )

    # -- planning -------------------------------------------------------------------------------
    def _plan(self, session_id: str, message: str, context: tuple[str, ...],
              sampling: dict[str, Any]) -> _Plan:
        session = self.store.require_session(session_id)
        stored = self.store.messages(session_id)
        history = [m.to_message() for m in stored]
        verdict = self._detect(session_id, history, message)
        temperature = (
            self.temperature.next(session.temperature, verdict.jump)
            if verdict.similarity is not None else session.temperature
        )
        params = {"max_tokens": self.config.max_tokens, "temperature": temperature, **sampling}
        params_obj = SamplingParams(**params)
        window = self.config.context_window or int(self.engine.max_model_len)
        window = min(window, int(self.engine.max_model_len))
        reserve = self.config.reply_reserve or params_obj.max_tokens
        budget = window - reserve
        if budget <= 0:
            from suffixmem.errors import ContextWindowError

            raise ContextWindowError(
                0, window, f"max_tokens={reserve} leaves no room for the prompt")
        prompt = self.layout.build(
            self.engine, session.system_prompt, history, message, context,
            session.window_start, budget,
        )
        return _Plan(session, message, prompt, verdict, temperature, params_obj, len(stored))

    # -- topics ---------------------------------------------------------------------------------
    def detector(self) -> TopicDetector:
        """The topic detector (built on first use)."""
        with self._detector_lock:
            if self._detector is None:
                from suffixmem.conversation.topic import default_detector

                self._detector = default_detector()
            return self._detector

    def _turn_pairs(self, history: Sequence[Message]) -> list[tuple[str, str]]:
        pairs: list[tuple[str, str]] = []
        for m in history:
            if m.role == "user":
                pairs.append((m.content, ""))
            elif m.role == "assistant" and pairs:
                u, a = pairs[-1]
                pairs[-1] = (u, f"{a}\n{m.content}" if a else m.content)
        return pairs

    def _detect(self, session_id: str, history: Sequence[Message], message: str) -> TopicVerdict:
        if not self.config.detect_topics:
            return TopicVerdict(False, None, reason="detection off")
        detector = self.detector()
        cached = self._topics.get(session_id)
        if cached is None or cached[0] != len(history):
            state = detector.replay(self._turn_pairs(history))
            self._topics[session_id] = (len(history), state)
        else:
            state = cached[1]
        return detector.observe_user(state, message)

    def _advance_topic(self, session_id: str, plan: _Plan, reply: str) -> None:
        if not self.config.detect_topics:
            return
        cached = self._topics.get(session_id)
        if cached is None or cached[0] != plan.history_len:
            self._topics.pop(session_id, None)  # rebuilt from the store next time
            return
        state = cached[1]
        self.detector().add_turn(state, plan.message, reply, plan.verdict.jump)
        self._topics[session_id] = (plan.history_len + 2, state)

    # -- segments -------------------------------------------------------------------------------
    def _record_segments(self, session_id: str, prompt: Prompt, result: Result) -> None:
        now = time.time()
        sightings = []
        tiers = []
        for seg in prompt.segments:
            span = prompt.token_ids[seg.start:seg.end]
            h = segment_hash(span)
            scope = "*" if seg.shared else session_id
            rec = self.store.segment(h, scope)
            seen = 0 if rec is None else self.store.sightings(h, scope)
            cached = rec is not None and rec.tier != Tier.NONE.value and (
                rec.expires_at is None or rec.expires_at.timestamp() > now)
            feats = ValueFeatures(
                num_tokens=len(span), kind=seg.kind, shared=seg.shared, seen=seen,
                position=seg.start, prompt_tokens=len(prompt.token_ids),
                age_s=0.0 if rec is None else max(0.0, now - rec.created_at.timestamp()),
                since_last_s=0.0 if rec is None else max(0.0, now - rec.last_seen_at.timestamp()),
                sessions_seen=1 if rec is None else rec.sessions_seen,
                token_entropy=token_entropy(span),
            )
            sightings.append(SegmentSighting(h, scope, seg.kind, len(span), feats.to_dict(),
                                             hit=cached))
            score = self.value_scorer.score(feats)
            tiers.append((h, scope, score, self.value_scorer.tier(score)))
        self.store.record_segments(session_id, sightings)
        from datetime import UTC, timedelta
        from datetime import datetime as dt

        from suffixmem.conversation.value import TTL_S

        for h, scope, score, tier in tiers:
            expires = None if tier is Tier.PINNED else dt.now(UTC) + timedelta(
                seconds=TTL_S if tier is Tier.TTL else 0)
            self.store.set_segment_tier(h, scope, tier.value, score, expires)

    # -- plumbing -------------------------------------------------------------------------------
    def _lock(self, session_id: str) -> threading.Lock:
        with self._locks_guard:
            lock = self._locks.get(session_id)
            if lock is None:
                lock = self._locks[session_id] = threading.Lock()
            return lock

    def _release(self, session_id: str) -> None:
        hook = getattr(self.engine, "release_session", None)
        if callable(hook):
            try:
                hook(session_id)
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

    def close(self) -> None:
        """Close the database connections (the engine is the caller's to close)."""
        self.store.close()

    def __enter__(self) -> ConversationManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
