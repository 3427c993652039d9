"""One turn, whatever the entry point (``chat``, ``complete``, stateless): plan, generate, commit.

1. **Plan** (before the engine starts; bad input raises here and nothing is stored): the turn's
   state comes from one read-only transaction (``Store.turn_state``); the layout builds the
   prompt token ids and ``Segment`` marks; the sampling values are checked.
2. **Topic** (under the session's lock, see ``locks``): the topic verdict (cached per session,
   so one ``observe_user`` per turn) decides the session's semantic temperature. When the
   caller did not fix ``temperature`` the verdict must precede sampling, so it runs before the
   engine starts (a jump then first releases the session's cached segments). When the caller
   fixed it, nothing of the prompt or the sampling depends on the verdict: it runs in the
   background while the engine generates and is collected before the commit.
3. **Run**: the engine streams (the lock is held only while the turn runs). The token counts
   of the messages to store are computed in the background meanwhile (only the commit needs
   them).
4. **Commit**: only a completed generation (``stop`` / ``length``) is stored, in one
   transaction (messages, statistics, session state; the session row itself for a new session;
   the replaced history for a rewritten one). Failure, early close or a refused commit store
   nothing. With ``durability="async"`` (the default) that transaction is the background
   worker's first job after the call returns (``write_behind``: this process's next read of
   the session waits for it; a commit refused there fails the session's next call, once).
   Bookkeeping runs afterwards in the background (``background``), while the next
   turn's engine works: the segment log, fed with the engine's real hits
   (``Result.reused_segments`` and the prefix-cache hit), and the topic detector's update
   with the reply (the session's next verdict runs it first if it has not run yet).

``TurnResult.manager_overhead_ms`` is the time spent outside the engine: from the call to the
engine stream's start (``Engine.stream`` checks and queues the request for the driver's next
step), plus from the engine's ``Result`` to the ``TurnResult``. Time a streaming caller spends
between events is not counted.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from suffixmem.conversation.layout import Layout, Prompt, passage_segments
from suffixmem.conversation.records import NewMessage, NewSession, TurnEvent
from suffixmem.conversation.topic import TopicVerdict
from suffixmem.engine.isolation import public_head
from suffixmem.engine.protocol import (
    Engine,
    Message,
    Request,
    Result,
    SamplingParams,
    TokenEvent,
)
from suffixmem.errors import ContextWindowError, EngineClosedError, InvalidRequestError

HistoryKind = Literal["new", "appended", "windowed", "rewritten", "stateless"]


@dataclass(slots=True)
class TurnResult:
    """The outcome of one committed turn. ``temperature`` is the sampling temperature used;
    ``similarity`` the topic similarity (None on a first turn or with detection off);
    ``evicted_turns`` the turns dropped from the prompt by this turn; ``history`` how the sent
    history was reconciled with the stored one; ``token_ids`` the generated ids;
    ``manager_overhead_ms`` the time spent outside the engine (module docstring)."""

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
    history: HistoryKind = "appended"
    finish_reason: str = "stop"
    token_ids: tuple[int, ...] = ()
    manager_overhead_ms: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def usage(self) -> dict[str, Any]:
        """Token counts and timings in the shape frameworks report as usage."""
        out = len(self.token_ids)
        return {
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "output_tokens": out, "total_tokens": self.prompt_tokens + out,
            "ttft_s": self.ttft_s, "latency_s": self.latency_s,
            "finish_reason": self.finish_reason, "session_id": self.session_id,
        }


@dataclass(slots=True)
class TurnSpec:
    """What a caller asked for, already validated and reconciled (nothing decided yet).

    ``key``: the engine's session key (the session id, or ``anon-...`` when stateless);
    ``session_id``: None when stateless; ``history``: messages rendered before ``tail``
    (stored ids attached); ``tail``: the user's text (``chat``) or the messages to answer;
    ``to_store``: what the commit stores before the reply; ``user_text``: what the topic
    detector observes (None: no verdict); ``fresh_topic``: the cached topic state does not
    describe ``history`` (rewritten or stateless)."""

    key: str
    session_id: str | None
    kind: HistoryKind
    system_prompt: str | None
    history: Sequence[Message]
    tail: str | Sequence[Message]
    context: tuple[str, ...]
    to_store: Sequence[Message]
    user_text: str | None
    session_temperature: float
    window_start: int
    stored_count: int
    version: int
    sampling: dict[str, Any]
    create: NewSession | None = None
    replace: bool = False
    fresh_topic: bool = False
    started: float = field(default_factory=time.perf_counter)
    # the session's own semantic temperature range (hot, cold); None: the manager's
    temperature_range: tuple[float | None, float | None] = (None, None)


PENDING = TopicVerdict(False, None, reason="pending")
"""``Plan.verdict`` until the topic step decided it."""


@dataclass(slots=True)
class Plan:
    """Everything decided for a turn (nothing stored yet). ``verdict``, ``temperature`` (the
    session's new semantic temperature) and, unless the caller fixed it, the sampling
    temperature are set by the topic step (``PENDING`` and the session's temperature until
    then)."""

    spec: TurnSpec
    prompt: Prompt
    verdict: TopicVerdict
    temperature: float
    sampling: SamplingParams


def build_prompt(layout: Layout, engine: Any, spec: TurnSpec, max_model_len: int,
                 context_window: int | None, reply_reserve: int | None,
                 sampling: SamplingParams) -> Prompt:
    """The layout's prompt for ``spec`` within the token budget: the window less the reply
    reserve. ``InvalidRequestError`` naming ``max_tokens`` when the reserve alone fills the
    window; ``ContextWindowError`` (with the window, not the budget, and what the reserve
    left) when the message does not fit what is left."""
    window = min(context_window or max_model_len, max_model_len)
    reserve = reply_reserve or sampling.max_tokens
    budget = window - reserve
    if budget <= 0:
        raise InvalidRequestError(
            f"max_tokens={reserve} alone fills the context window of {window} tokens; "
            "lower max_tokens")
    try:
        return layout.build(engine, spec.system_prompt, spec.history, spec.tail, spec.context,
                            spec.window_start, budget)
    except ContextWindowError as e:  # the layout knows only the budget
        raise ContextWindowError(
            e.prompt_tokens, window,
            f"with max_tokens={reserve} at most {budget} prompt tokens fit; shorten the "
            "message (with its context and the system prompt) or lower max_tokens") from None


def stream_turn(engine: Any, plan: Plan, exact: bool, context_shift: bool = False,
                rag_reuse: bool = False) -> Iterator[TokenEvent | Result]:
    """The engine's events for ``plan``; an early close or failure closes the engine stream
    (which aborts the request). Raises unless generation completed. ``exact=False`` lets the
    engine reuse the prompt's document segments approximately. With ``exact``, two workload
    classes still go as ``exact=False``, each where its flag and its gate allow:
    ``context_shift`` sends a turn without document segments (the shared system head stays,
    for the isolation scope), so that only the engine's context shift may approximate: kept
    turns at new positions after the layout, or the application's own sliding window
    (``windowed``), dropped old ones; ``rag_reuse`` sends a rewritten history whose
    system prompt carries passages (this turn's retrieval) with those passages marked, so
    that they and the history are reused at their new positions. Any other rewritten history
    (an edited conversation under a plain system prompt) stays exact: no gate measured it."""
    spec = plan.spec
    rewritten = spec.replace
    segments = plan.prompt.segments
    passages = passage_segments(engine, spec.system_prompt, plan.prompt.token_ids) if (
        not exact or (rag_reuse and rewritten)) else ()
    rag = exact and bool(passages)
    shift = exact and context_shift and not rewritten
    if not exact:  # passages the application wrote into the system prompt (layout, point 6)
        segments = (*segments, *passages)
    elif rag or shift:
        # no context blocks, but the shared head stays: the engine's isolation scope reads
        # it (``public-prefix`` shares those blocks across sessions), and KV reused at its own
        # position 0 with nothing before it is what computing it gives
        segments = (*public_head(segments), *passages)
    request = Request(
        session_key=plan.spec.key, token_ids=plan.prompt.token_ids, sampling=plan.sampling,
        segments=segments, exact=exact and not (shift or rag),
    )
    events = engine.stream(request)
    result: Result | None = None
    try:
        for event in events:
            if isinstance(event, Result):
                result = event
            yield event
    finally:
        if result is None:  # failed or closed early: abort, store nothing
            events.close()
    if result is None:
        raise EngineClosedError("engine stream ended without a Result; nothing was stored")
    if result.finish_reason not in ("stop", "length"):
        raise EngineClosedError(
            f"generation ended with {result.finish_reason!r}; the turn was not stored")


def stored_counts(spec: TurnSpec, count: Any) -> list[int]:
    """Token counts of ``spec.to_store`` (for the commit: computed while the engine works)."""
    return [len(m.token_ids) if m.token_ids is not None else count(m.content)
            for m in spec.to_store]


def turn_messages(plan: Plan, result: Result, engine: Any, count: Any,
                  counts: Sequence[int] | None = None) -> tuple[list[NewMessage], str]:
    """The messages to commit (``to_store`` with ``counts``, else counted now, and the reply)
    and the reply text as stored."""
    ids = tuple(result.token_ids)
    # NUL cannot be stored in PostgreSQL text; a model may still emit one: keep the text
    # storable (U+FFFD) and drop the ids, which then no longer match the text
    text = result.text.replace("\x00", "\ufffd")
    # keep the generated ids only when they are exactly the reply's text (a stop string may
    # have cut the text short of the ids); otherwise the reply is re-tokenized later
    keep = ids if ids and text == result.text and engine.detokenize(ids) == text else None
    if counts is None:
        counts = stored_counts(plan.spec, count)
    out = [NewMessage(m.role, m.content, m.token_ids, n)
           for m, n in zip(plan.spec.to_store, counts, strict=True)]
    out.append(NewMessage("assistant", text, keep, len(keep) if keep is not None
                          else count(text)))
    return out, text


def turn_event(plan: Plan, result: Result) -> TurnEvent:
    return TurnEvent(
        prompt_tokens=result.prompt_tokens, cached_tokens=result.cached_tokens,
        ttft_s=result.ttft_s, latency_s=result.latency_s,
        temperature=plan.sampling.temperature, output_tokens=len(result.token_ids),
        topic_jump=plan.verdict.jump, similarity=plan.verdict.similarity,
        evicted_turns=plan.prompt.evicted_turns, finish_reason=result.finish_reason,
        request_id=result.request_id or None,
    )


def turn_result(plan: Plan, result: Result, text: str, overhead_s: float) -> TurnResult:
    return TurnResult(
        text=text, session_id=plan.spec.session_id or plan.spec.key, result=result,
        prompt_tokens=result.prompt_tokens, cached_tokens=result.cached_tokens,
        ttft_s=result.ttft_s, latency_s=result.latency_s, topic_jump=plan.verdict.jump,
        temperature=plan.sampling.temperature, similarity=plan.verdict.similarity,
        evicted_turns=plan.prompt.evicted_turns, history=plan.spec.kind,
        finish_reason=result.finish_reason, token_ids=tuple(result.token_ids),
        manager_overhead_ms=overhead_s * 1000.0,
    )


def turn_pairs(history: Sequence[Message]) -> list[tuple[str, str]]:
    """(user, assistant) text pairs for the topic detector."""
    pairs: list[tuple[str, str]] = []
    for m in history:
        if m.role == "user":
            pairs.append((m.content, ""))
        elif m.role == "assistant" and pairs:
            u, a = pairs[-1]
            pairs[-1] = (u, f"{a}\n{m.content}" if a else m.content)
    return pairs


def schema_instruction(json_schema: dict[str, Any]) -> Message:
    """The system message that shows the model the JSON schema its reply is constrained to.
    Guided decoding forces the syntax, not sensible content: a small model shown the schema
    right before its reply closes the JSON far more often. Placed after the conversation, it
    leaves the cached prefix of the history untouched. Not stored."""
    return Message("system", "Reply with a JSON object that matches this JSON schema:\n"
                   + json.dumps(json_schema))


class _NoLock:  # stateless turns have no session to lock
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def last_event(events: Iterator[Any]) -> Any:
    out = None
    for out in events:  # noqa: B007 - the last event is the turn's result
        pass
    if out is None:
        raise InvalidRequestError("the turn produced no result")
    return out


async def alast_event(events: AsyncIterator[Any]) -> Any:
    """``last_event`` of an async stream."""
    out = None
    async for out in events:  # noqa: B007 - the last event is the turn's result
        pass
    if out is None:
        raise InvalidRequestError("the turn produced no result")
    return out


def no_lock() -> _NoLock:
    return _NoLock()


def check_system_fits(engine: Engine, system_prompt: str, context_window: int | None) -> None:
    """A session's system prompt leaves room in the window (else every turn of the session
    would fail, each naming the turn); tokenized here, so the template keeps the ids for the
    first turn. A template that refuses a system message fails that turn with its own error."""
    window = min(int(engine.max_model_len), context_window or 1 << 30)
    try:
        n = len(engine.render([Message("system", system_prompt)], False))
    except Exception:
        return
    if n >= window:
        raise InvalidRequestError(f"system_prompt is {n} tokens; the context window is {window}")
