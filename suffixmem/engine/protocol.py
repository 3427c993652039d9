"""The one protocol every engine implements, and the small types that cross it.

Contract:
- An engine knows nothing of sessions' history: it gets a ``Request`` (messages *or* token ids,
  a session key that namespaces its cache, sampling parameters) and streams.
- ``Engine.stream(request)`` is a generator: zero or more ``TokenEvent``, then exactly one
  ``Result`` as its last item. Closing the generator early (``close()``, ``break``) aborts the
  request and frees its resources; no ``Result`` is produced then.
- ``Engine.generate(request)`` is built on ``stream`` and returns the ``Result``.
- Bad input raises ``InvalidRequestError`` (a ``ValueError``) before any work is done, and the
  engine stays usable.
- Times are seconds (``time.perf_counter`` deltas); token counts are model tokens.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from suffixmem.errors import ContextWindowError, InvalidRequestError

ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})
FinishReason = Literal["stop", "length", "abort"]
SEGMENT_KINDS: frozenset[str] = frozenset(
    {"system_tail", "template", "json_schema", "document", "anchor", "detected"}
)


@dataclass(slots=True, frozen=True)
class Message:
    """One chat message.

    ``token_ids`` (assistant turns only) are the ids exactly as the model generated them, without
    the end-of-turn token; when present the prompt is rendered from them instead of re-tokenizing
    ``content``, so a later turn's prompt repeats the cached tokens bit for bit.
    """

    role: str
    content: str
    token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidRequestError(
                f"unknown message role {self.role!r}; expected one of {sorted(ROLES)}"
            )
        if not isinstance(self.content, str):
            raise InvalidRequestError(
                f"message content must be a string, got {type(self.content).__name__}"
            )
        if self.token_ids is not None and self.role != "assistant":
            raise InvalidRequestError("token_ids may only be given for assistant messages")


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` is greedy. ``max_tokens`` counts output tokens.

    ``json_schema`` asks for output constrained to that JSON schema, on engines whose
    ``supports_json_schema`` is true; others reject it.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    json_schema: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidRequestError(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be > 0, got {self.max_tokens}")
        if not 0.0 <= float(self.temperature) <= 5.0:
            raise InvalidRequestError(f"temperature must be in [0, 5], got {self.temperature}")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError(f"stop sequences must be non-empty strings: {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True, frozen=True)
class Segment:
    """A span ``[start, end)`` of the prompt's token ids whose KV may be reused elsewhere.

    ``shared`` segments (a common system prompt) live in a global namespace; others are keyed by
    the request's session. Engines without segment reuse ignore segments.
    """

    start: int
    end: int
    kind: str = "anchor"
    shared: bool = False

    def __post_init__(self) -> None:
        if self.kind not in SEGMENT_KINDS:
            raise InvalidRequestError(
                f"unknown segment kind {self.kind!r}; expected one of {sorted(SEGMENT_KINDS)}"
            )
        if not 0 <= self.start < self.end:
            raise InvalidRequestError(f"segment span must satisfy 0 <= start < end: {self}")

    def __len__(self) -> int:
        return self.end - self.start


def _new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(slots=True)
class Request:
    """One generation request: ``messages`` (rendered with the model's chat template) or
    pre-rendered ``token_ids``, exactly one of them.

    ``session_key`` namespaces the cache: another key never reuses this one's KV.
    ``exact`` disables approximate reuse (segments at new positions): output then equals a run
    without any cache.
    """

    session_key: str
    messages: Sequence[Message] | None = None
    token_ids: Sequence[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    segments: tuple[Segment, ...] = ()
    exact: bool = True
    request_id: str = field(default_factory=_new_request_id)

    def __post_init__(self) -> None:
        if not isinstance(self.session_key, str) or not self.session_key:
            raise InvalidRequestError("session_key must be a non-empty string")
        if (self.messages is None) == (self.token_ids is None):
            raise InvalidRequestError("give exactly one of messages or token_ids")
        if self.messages is not None:
            self.messages = tuple(self.messages)
            if not self.messages:
                raise InvalidRequestError("messages is empty: nothing to answer")
            for i, m in enumerate(self.messages):
                if not isinstance(m, Message):
                    raise InvalidRequestError(
                        f"messages[{i}] is a {type(m).__name__}, not a suffixmem Message"
                    )
                if m.role != "assistant" and not m.content.strip():
                    raise InvalidRequestError(f"messages[{i}] ({m.role}) has empty content")
        if self.token_ids is not None:
            self.token_ids = tuple(int(t) for t in self.token_ids)
            if not self.token_ids:
                raise InvalidRequestError("token_ids is empty: nothing to answer")
        for s in self.segments:
            if self.token_ids is not None and s.end > len(self.token_ids):
                raise InvalidRequestError(f"segment {s} lies beyond the prompt")


@dataclass(slots=True, frozen=True)
class TokenEvent:
    """One generated token. ``text`` is the newly decoded text it completes (may be '')."""

    token_id: int
    text: str
    index: int


@dataclass(slots=True, frozen=True)
class Result:
    """The outcome of one request. ``cached_tokens`` prompt tokens were served from cache
    (prefix and reused segments together; ``reused_segment_tokens`` of them by segment reuse)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    latency_s: float
    request_id: str = ""
    session_key: str = ""
    reused_segment_tokens: int = 0
    recomputed_tokens: int = 0

    @property
    def output_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def decode_tokens_per_s(self) -> float:
        """Output tokens per second after the first token (0 when only one token)."""
        span = self.latency_s - self.ttft_s
        return (self.output_tokens - 1) / span if self.output_tokens > 1 and span > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "ttft_s": self.ttft_s,
            "latency_s": self.latency_s,
            "request_id": self.request_id,
            "reused_segment_tokens": self.reused_segment_tokens,
            "recomputed_tokens": self.recomputed_tokens,
        }


@dataclass(slots=True)
class EngineStats:
    """Running totals since the engine started."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reused_segment_tokens: int = 0
    kv_capacity_bytes: int = 0
    kv_used_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def record(self, result: Result) -> None:
        self.requests += 1
        self.prompt_tokens += result.prompt_tokens
        self.cached_tokens += result.cached_tokens
        self.output_tokens += result.output_tokens
        self.reused_segment_tokens += result.reused_segment_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "reused_segment_tokens": self.reused_segment_tokens,
            "hit_rate": self.hit_rate,
            "kv_capacity_bytes": self.kv_capacity_bytes,
            "kv_used_bytes": self.kv_used_bytes,
            **self.extra,
        }


@runtime_checkable
class Engine(Protocol):
    """What the conversation manager and the adapters rely on."""

    name: str
    model_name: str
    max_model_len: int
    supports_json_schema: bool

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` under the model's chat template."""
        ...

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, token_ids: Sequence[int]) -> str: ...

    def stream(self, request: Request) -> Iterator[TokenEvent | Result]: ...

    def generate(self, request: Request) -> Result: ...

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...


class BaseEngine(ABC):
    """Shared behaviour: request validation, ``generate`` on top of ``stream``, async bridging,
    statistics and the context manager. Subclasses implement ``_stream`` and the tokenizer."""

    name: str = "base"
    model_name: str = ""
    max_model_len: int = 0
    supports_json_schema: bool = False

    def __init__(self) -> None:
        self._stats = EngineStats()
        self._stats_lock = threading.Lock()
        self._closed = False

    # -- tokenizer ------------------------------------------------------------------------------
    @abstractmethod
    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        ...

    @abstractmethod
    def tokenize(self, text: str) -> list[int]: ...

    @abstractmethod
    def detokenize(self, token_ids: Sequence[int]) -> str: ...

    # -- generation -----------------------------------------------------------------------------
    def prompt_ids(self, request: Request) -> list[int]:
        """The request's prompt token ids, validated against the context window."""
        ids = (
            list(request.token_ids)
            if request.token_ids is not None
            else self.render(request.messages or ())
        )
        need = len(ids) + 1
        if need > self.max_model_len:
            raise ContextWindowError(
                len(ids), self.max_model_len, "shorten the conversation or raise max_model_len"
            )
        if request.sampling.json_schema is not None and not self.supports_json_schema:
            raise InvalidRequestError(f"engine {self.name!r} does not support json_schema output")
        return ids

    def stream(self, request: Request) -> Iterator[TokenEvent | Result]:
        """Validate, then stream ``TokenEvent``s and finally the ``Result``."""
        from suffixmem.errors import EngineClosedError

        if self._closed:
            raise EngineClosedError(f"engine {self.name!r} is closed")
        ids = self.prompt_ids(request)  # raises before the generator starts
        return self._record(self._stream(request, ids))

    def _record(self, events: Iterator[TokenEvent | Result]) -> Iterator[TokenEvent | Result]:
        for event in events:
            if isinstance(event, Result):
                with self._stats_lock:
                    self._stats.record(event)
            yield event

    @abstractmethod
    def _stream(self, request: Request, prompt_ids: list[int]) -> Iterator[TokenEvent | Result]:
        ...

    def generate(self, request: Request) -> Result:
        return final_result(self.stream(request))

    async def astream(self, request: Request) -> AsyncIterator[TokenEvent | Result]:
        """``stream`` for asyncio: the blocking generator runs in a worker thread."""
        async for event in aiter_events(self.stream(request)):
            yield event

    async def agenerate(self, request: Request) -> Result:
        result: Result | None = None
        async for event in self.astream(request):
            if isinstance(event, Result):
                result = event
        assert result is not None
        return result

    def stats(self) -> EngineStats:
        with self._stats_lock:
            s = self._stats
            return EngineStats(
                s.requests, s.prompt_tokens, s.cached_tokens, s.output_tokens,
                s.reused_segment_tokens, s.kv_capacity_bytes, s.kv_used_bytes, dict(s.extra),
            )

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> BaseEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def final_result(events: Iterator[TokenEvent | Result]) -> Result:
    """Drain a stream and return its ``Result``."""
    for event in events:
        if isinstance(event, Result):
            return event
    raise RuntimeError("engine stream ended without a Result")


async def aiter_events(events: Iterator[TokenEvent | Result]) -> AsyncIterator[TokenEvent | Result]:
    """Iterate a blocking event generator from asyncio without blocking the loop.

    Each ``next`` runs in a worker thread; if the consumer stops early the generator is closed
    (in a thread too), which aborts the request.
    """
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
