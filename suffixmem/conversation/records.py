"""Row types the conversation store returns: small frozen dataclasses, never ORM rows.

Times are timezone-aware UTC (``aware`` fixes SQLite's naive datetimes on the way out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from suffixmem.engine.protocol import Message


def aware(t: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything stored is UTC.
    if t is not None and t.tzinfo is None:
        return t.replace(tzinfo=UTC)
    return t


@dataclass(slots=True, frozen=True)
class SessionRecord:
    id: str
    title: str | None
    model: str | None
    system_prompt: str | None
    temperature: float
    state: str
    window_start: int
    created_at: datetime
    updated_at: datetime
    message_count: int
    forked_from: str | None = None
    temperature_hot: float | None = None  # the session's own range; None: the manager's
    temperature_cold: float | None = None


@dataclass(slots=True, frozen=True)
class StoredMessage:
    position: int
    role: str
    content: str
    token_ids: tuple[int, ...] | None
    token_count: int
    created_at: datetime
    # the Message built once: a cached history is rendered every turn, and building a Message
    # re-validates its text and ids (O(history) per turn otherwise)
    _message: Message | None = field(default=None, compare=False, repr=False)

    def to_message(self) -> Message:
        if self._message is None:
            object.__setattr__(self, "_message", Message(self.role, self.content, self.token_ids))
        return self._message  # type: ignore[return-value]


@dataclass(slots=True, frozen=True)
class NewMessage:
    """A message to store: ``token_ids`` only for assistant turns (as generated)."""

    role: str
    content: str
    token_ids: tuple[int, ...] | None = None
    token_count: int = 0


@dataclass(slots=True, frozen=True)
class TurnEvent:
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    latency_s: float
    temperature: float
    output_tokens: int = 0
    topic_jump: bool = False
    similarity: float | None = None
    evicted_turns: int = 0
    finish_reason: str = "stop"
    request_id: str | None = None
    reply_position: int | None = None  # set by the store: where the turn's reply was stored


def totals(events: Sequence[TurnEvent]) -> dict[str, Any]:
    """What ``ConversationManager.stats`` reports of committed turns: token sums, the share
    of prompt tokens served from cache, mean times, jumps and evicted turns."""
    prompt = sum(e.prompt_tokens for e in events)
    cached = sum(e.cached_tokens for e in events)
    n = len(events)
    return {
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


def turn_summaries(positions: Sequence[int], events: Sequence[TurnEvent]
                   ) -> list[dict[str, Any]]:
    """Each committed turn's figures, as ``GET /v1/sessions/{id}`` and ``sessions show --json``
    give them, with ``message_index``: the index (in ``positions``, the stored messages'
    positions in order) of the message that is its reply; None for a turn an edit abandoned
    (the turns after an edit reuse their positions) or one stored before migration 0005."""
    index = {p: i for i, p in enumerate(positions)}
    latest = {t.reply_position: k for k, t in enumerate(events)}
    return [{"prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens,
             "completion_tokens": t.output_tokens, "ttft_s": t.ttft_s,
             "temperature": t.temperature, "topic_jump": t.topic_jump,
             "message_index": index.get(t.reply_position)  # type: ignore[arg-type]
             if latest.get(t.reply_position) == k else None}
            for k, t in enumerate(events)]


@dataclass(slots=True, frozen=True)
class SegmentSighting:
    """One segment seen in a prompt (``scope``: a session id or ``"*"`` when shared)."""

    hash: str
    scope: str
    kind: str
    tokens: int
    features: dict[str, float]
    hit: bool = False


@dataclass(slots=True, frozen=True)
class SegmentRecord:
    hash: str
    scope: str
    kind: str
    tokens: int
    tier: str
    score: float | None
    expires_at: datetime | None
    hits: int
    tokens_saved: int
    sessions_seen: int
    created_at: datetime
    last_seen_at: datetime


@dataclass(slots=True, frozen=True)
class SegmentEvent:
    hash: str
    scope: str
    session_id: str | None
    kind: str
    tokens: int
    seen_at: datetime
    hit: bool
    features: dict[str, float]




@dataclass(slots=True, frozen=True)
class NewSession:
    """A session to create with its first turn (``Store.commit_turn(create=...)``);
    ``replica``: the remote engine's replica that served that turn (``sessions.replica``)."""

    title: str | None = None
    model: str | None = None
    system_prompt: str | None = None
    replica: str | None = None
