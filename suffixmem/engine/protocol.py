"""The one protocol every engine implements, and the small types that cross it.

Contract:
- An engine knows nothing of sessions' history: it gets a ``Request`` (messages *or* token ids,
  a session key that namespaces its cache, sampling parameters) and streams.
- ``Engine.stream(request)`` is a generator: zero or more ``TokenEvent``, then exactly one
  ``Result`` as its last item. Closing the generator early (``close()``, ``break``) aborts the
  request and frees its resources; no ``Result`` is produced then.
- ``Engine.generate(request)`` is built on ``stream`` and returns the ``Result``.
- Bad input raises ``InvalidRequestError`` (a ``ValueError``, one line naming the field) before
  any work is done, and the engine stays usable. ``SamplingParams``/``Request`` check types and
  ranges strictly when built; engines call ``Request.check()`` again at their boundary.
- ``Engine`` lists everything the manager and adapters call; ``suffixmem.engine.base.BaseEngine``
  implements the shared part (driver thread, tokenizer trio, checks, close).
- Times are seconds (``time.perf_counter`` deltas); token counts are model tokens.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from suffixmem.engine.async_stream import aiter_events  # noqa: F401  (its home before)
from suffixmem.engine.checks import (
    MAX_SEED,
    MAX_TEMPERATURE,
    check_session_key,
    check_text,
    integer,
    real_number,
)
from suffixmem.errors import InvalidRequestError

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
        if not isinstance(self.role, str) or self.role not in ROLES:
            raise InvalidRequestError(
                f"unknown message role {self.role!r}; expected one of {sorted(ROLES)}"
            )
        check_text("message content", self.content)
        if self.token_ids is not None:
            if self.role != "assistant":
                raise InvalidRequestError("message token_ids may only be given for assistant "
                                          "messages")
            ids = tuple(self.token_ids)
            if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
                raise InvalidRequestError("message token_ids must be non-negative integers")
            object.__setattr__(self, "token_ids", ids)


@dataclass(slots=True, frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` is greedy. ``max_tokens`` counts output tokens.
    ``frequency_penalty``/``presence_penalty`` are OpenAI's, in [-2, 2]: before sampling (and
    before greedy's argmax) a token's logit drops by ``frequency_penalty`` times its count in
    the output so far, plus ``presence_penalty`` if it occurs there at all.

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
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Validate (again): engines call this at their boundary, so values changed after
        construction cannot slip through."""
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, list | tuple):
            stop = tuple(stop)
        else:
            raise InvalidRequestError(f"stop must be a string or a list of strings, got "
                                      f"{type(stop).__name__}")
        for s in stop:
            if not isinstance(s, str) or not s:
                raise InvalidRequestError(f"stop sequences must be non-empty strings: {s!r}")
            check_text("stop", s)
        object.__setattr__(self, "stop", stop)
        temperature = real_number("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_p", real_number("top_p", self.top_p, 0.0, 1.0))
        for name in ("frequency_penalty", "presence_penalty"):
            object.__setattr__(self, name, real_number(name, getattr(self, name), -2.0, 2.0))
        if self.top_p == 0.0:
            raise InvalidRequestError("top_p must be in (0, 1], got 0.0")
        integer("top_k", self.top_k)
        if self.top_k == 0 or self.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        integer("max_tokens", self.max_tokens)
        if self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be > 0, got {self.max_tokens}")
        if self.seed is not None:
            integer("seed", self.seed)
            if not 0 <= self.seed <= MAX_SEED:
                raise InvalidRequestError(f"seed must be in 0..2**63-1, got {self.seed}")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequestError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise InvalidRequestError(f"json_schema must be a dict, got "
                                      f"{type(self.json_schema).__name__}")
        if self.json_schema is not None and _depth(self.json_schema) > MAX_SCHEMA_DEPTH:
            # compiling the grammar of a deeper one cost ~20 s of CPU for a 17 KB request
            raise InvalidRequestError(f"json_schema nests deeper than {MAX_SCHEMA_DEPTH} levels")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


MAX_SCHEMA_DEPTH = 32  # of dicts and lists; OpenAI's structured outputs allow 10 levels


def _depth(value: Any) -> int:
    """How deeply ``value`` nests dicts and lists (iterative: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if deepest > MAX_SCHEMA_DEPTH:
                return deepest
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return deepest


@dataclass(slots=True, frozen=True)
class Segment:
    """A span ``[start, end)`` of the prompt's token ids whose KV may be reused elsewhere.

    ``shared`` segments (a common system prompt, passages the application wrote) live in a
    global namespace where the engine's isolation scope shares across sessions
    (``public-prefix``, ``app``), else in the session's own like the others. Engines without
    segment reuse ignore segments.
    """

    start: int
    end: int
    kind: str = "anchor"
    shared: bool = False

    def __post_init__(self) -> None:
        integer("segment start", self.start)
        integer("segment end", self.end)
        if not isinstance(self.kind, str) or self.kind not in SEGMENT_KINDS:
            raise InvalidRequestError(
                f"unknown segment kind {self.kind!r}; expected one of {sorted(SEGMENT_KINDS)}"
            )
        if not 0 <= self.start < self.end:
            raise InvalidRequestError(f"segment span must satisfy 0 <= start < end: {self}")

    def __len__(self) -> int:
        return self.end - self.start


def _non_negative_ints(ids: tuple[Any, ...]) -> bool:
    """Whether every id is a non-negative ``int`` (not a bool). Checked twice per turn over the
    whole prompt, so plain ints take C-level passes (a generator cost ~0.2 ms per 600 ids)."""
    if set(map(type, ids)) <= {int}:
        return not ids or min(ids) >= 0
    return all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)


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
        self.check()

    def check(self) -> None:
        """Validate (again, at the engine's boundary: ``Request`` is mutable)."""
        check_session_key(self.session_key)
        if not isinstance(self.request_id, str) or not self.request_id:
            raise InvalidRequestError("request_id must be a non-empty string")
        check_text("request_id", self.request_id)
        if not isinstance(self.sampling, SamplingParams):
            raise InvalidRequestError(f"sampling must be a SamplingParams, got "
                                      f"{type(self.sampling).__name__}")
        self.sampling.check()
        if not isinstance(self.exact, bool):
            raise InvalidRequestError(f"exact must be a bool, got {self.exact!r}")
        if (self.messages is None) == (self.token_ids is None):
            raise InvalidRequestError("give exactly one of messages or token_ids")
        if self.messages is not None:
            if isinstance(self.messages, str | bytes):
                raise InvalidRequestError("messages must be a list of Message, not a string")
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
            ids = tuple(self.token_ids)
            if not _non_negative_ints(ids):
                raise InvalidRequestError("token_ids must be non-negative integers")
            self.token_ids = ids
            if not self.token_ids:
                raise InvalidRequestError("token_ids is empty: nothing to answer")
        self.segments = tuple(self.segments)
        for s in self.segments:
            if not isinstance(s, Segment):
                raise InvalidRequestError(f"segments holds a {type(s).__name__}, not a Segment")
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
    reused_segments: tuple[tuple[int, int], ...] = ()
    """Prompt spans ``[start, end)`` whose KV came from the segment cache (approximate reuse)."""

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
            "reused_segments": [list(span) for span in self.reused_segments],
        }


@dataclass(slots=True)
class EngineStats:
    """Running totals since the engine started (token counts are model tokens)."""

    requests: int = 0  # finished requests (aborted and failed ones are not counted)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from cache, segment reuse included
    output_tokens: int = 0
    reused_segment_tokens: int = 0  # of cached_tokens, those from the segment cache
    kv_capacity_bytes: int = 0  # the KV pool's size
    kv_used_bytes: int = 0  # KV held right now (running requests and cached blocks)
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

    async def astream(self, request: Request) -> AsyncIterator[TokenEvent | Result]:
        """``stream`` for asyncio (never blocks the loop; closing it aborts the request)."""
        ...

    async def agenerate(self, request: Request) -> Result: ...

    def stats(self) -> EngineStats: ...

    def release_session(self, session_key: str) -> int:
        """Drop the session's cached segments; returns how many (0 without a segment cache)."""
        ...

    def reuse_passes_gate(self, workload: str) -> bool:
        """Whether the engine's approximate reuse passed the quality gate for the workload
        class ``workload`` (``"rag"``) in the method and dtype it serves
        (``suffixmem.engine.reuse.blend.GATE_PASSED``); the manager's defaults ask it. False
        on engines without approximate reuse. Optional: the manager treats an engine without
        it as False."""
        ...

    def delete_session_kv(self, session_key: str) -> int:
        """Forget the KV a deleted session left behind (its disk-tier files, and on engines that
        can, its cached blocks); returns the tier files removed (0 without a tier)."""
        ...

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix block not in use; returns how many (or 1/0 when the
        backend only says whether it succeeded)."""
        ...

    def unavailable(self) -> str | None:
        """Why a request would fail now, in one line (closed; every remote replica down), or
        None when the engine can serve. Optional: the server's ``/health`` treats an engine
        without it as available."""
        ...

    def close(self) -> None:
        """Stop; every pending caller gets ``EngineClosedError``."""
        ...


def final_result(events: Iterator[TokenEvent | Result]) -> Result:
    """Drain a stream and return its ``Result``."""
    for event in events:
        if isinstance(event, Result):
            return event
    raise RuntimeError("engine stream ended without a Result")
