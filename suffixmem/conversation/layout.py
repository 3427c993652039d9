"""Cache-stable prompt layout: what each turn's prompt looks like, so the engine's cache hits.

A prefix cache serves a prompt's longest already-seen prefix. So the layout keeps every prompt an
extension of the previous one for as long as it can:

1. **Static first.** The system prompt comes first and never changes within a session.
2. **History append-only.** Messages are rendered one by one and assistant turns from the token
   ids they were generated with (``Message.token_ids``), so turn ``n+1``'s prompt starts with
   turn ``n``'s prompt plus its reply, token for token.
3. **Chunked eviction.** When the prompt exceeds the budget (context window minus the reply
   reserve), the oldest *whole turns* (a user message and what follows it) are dropped until the
   prompt is at most ``(1 - evict_fraction) * budget``. The prefix changes once per chunk, not
   once per turn as with a per-message sliding window; the turns in between hit the cache.
4. **The tail.** ``message`` is the user's text (``chat``) or the messages to answer verbatim
   (``complete``: a user message, tool results, a schema instruction after the conversation).
5. **Context next to the question.** Retrieved context and memory blocks go into the last user
   message (before the question), never into the system prompt, so they do not disturb the
   cached prefix; each block is marked as a ``Segment`` of kind ``"document"`` for engines that
   reuse segments at new positions. The stored history keeps the plain question.
6. **Passages in the system prompt.** Frameworks that write this turn's retrieved passages into
   the system prompt (LlamaIndex's ``CondensePlusContextChatEngine``) break the prefix near the
   top every turn. For approximate turns (``exact=False``) ``passage_segments`` marks each
   paragraph of the system prompt (blank-line separated, at least ``MIN_PASSAGE_TOKENS``) as a
   shared ``"document"`` segment, so an engine with segment reuse serves a passage it has seen
   in any earlier prompt, at its new position. Shared like the system prompt itself (the global
   namespace): the system prompt is the application's, not a session's.

``SlidingWindowLayout`` is the baseline: LlamaIndex ``ChatMemoryBuffer``'s policy (drop the
oldest messages, never leaving an assistant message first, until the rest fits), recomputed
every turn.

Layouts are pure: they call only the engine's ``render`` and ``tokenize`` (token ids in, token
ids out) and never touch the database.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from suffixmem.engine.protocol import Message, Segment
from suffixmem.errors import ConfigError, ContextWindowError, InvalidRequestError

MIN_PASSAGE_TOKENS = 32
"""Shorter paragraphs are not marked: cheaper to recompute than to place (context shift's
``min_run``)."""
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


class Renderer(Protocol):
    """The part of the engine protocol a layout needs."""

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        ...

    def tokenize(self, text: str) -> list[int]: ...


@dataclass(slots=True, frozen=True)
class Prompt:
    """One turn's prompt.

    ``window_start`` is the index (into the stored history) of the first message kept;
    ``evicted_turns`` counts turns dropped by *this* build. ``messages`` are what was rendered
    (the last one is the user message with its context blocks).
    """

    token_ids: tuple[int, ...]
    segments: tuple[Segment, ...]
    messages: tuple[Message, ...]
    window_start: int
    evicted_turns: int
    budget: int

    def __len__(self) -> int:
        return len(self.token_ids)


def turn_starts(history: Sequence[Message]) -> list[int]:
    """Indices where a turn begins: every user message (and 0, whatever its role)."""
    starts = [i for i, m in enumerate(history) if m.role == "user"]
    if history and (not starts or starts[0] != 0):
        starts.insert(0, 0)
    return starts


def compose_user(message: str, context: Sequence[str]) -> str:
    """The last user message as rendered: context blocks, a blank line each, then the question."""
    if not context:
        return message
    return "".join(f"{block}\n\n" for block in context) + message


def tail_messages(message: str | Sequence[Message], context: Sequence[str]) -> list[Message]:
    """What follows the history: one user message (``message`` with its ``context`` blocks), or
    the given messages verbatim (``complete``: tool results, a schema instruction...)."""
    if isinstance(message, str):
        return [Message("user", compose_user(message, context))]
    return list(message)


def _find(haystack: Sequence[int], needle: Sequence[int], start: int) -> int:
    n = len(needle)
    first = needle[0]
    for i in range(start, len(haystack) - n + 1):
        if haystack[i] == first and tuple(haystack[i:i + n]) == tuple(needle):
            return i
    return -1


def passage_segments(engine: Renderer, system_prompt: str | None,
                     prompt_ids: Sequence[int]) -> tuple[Segment, ...]:
    """Shared ``"document"`` segments over the paragraphs of ``system_prompt`` found in
    ``prompt_ids`` (point 6 of the module docstring), in order. A paragraph is tokenized on its
    own and marked without its first token: that one may merge with the whitespace before it
    (indentation, a line break), which differs from prompt to prompt, and a passage's segment
    must have the same ids wherever it sits to be found again. A paragraph not found token for
    token is left unmarked."""
    if not system_prompt or not PARAGRAPH_BREAK.search(system_prompt):
        return ()
    out: list[Segment] = []
    at = 0
    for para in PARAGRAPH_BREAK.split(system_prompt):
        ids = engine.tokenize(para.strip())[1:]
        if len(ids) < MIN_PASSAGE_TOKENS:
            continue
        pos = _find(prompt_ids, ids, at)
        if pos < 0:
            continue
        out.append(Segment(pos, pos + len(ids), "document", shared=True))
        at = pos + len(ids)
    return tuple(out)


class Layout(Protocol):
    """A layout strategy: build this turn's prompt."""

    def build(
        self, engine: Renderer, system_prompt: str | None, history: Sequence[Message],
        message: str | Sequence[Message], context: Sequence[str], window_start: int,
        budget: int,
    ) -> Prompt: ...


class _Base:
    def _static(self, system_prompt: str | None) -> list[Message]:
        return [Message("system", system_prompt)] if system_prompt else []

    def _assemble(
        self, engine: Renderer, static: list[Message], kept: Sequence[Message],
        message: str | Sequence[Message], context: Sequence[str],
    ) -> tuple[list[int], list[Message]]:
        msgs = [*static, *kept, *tail_messages(message, context)]
        return engine.render(msgs, True), msgs

    def _finish(
        self, engine: Renderer, static: list[Message], ids: list[int], msgs: list[Message],
        context: Sequence[str], window_start: int, evicted: int, budget: int,
    ) -> Prompt:
        segments: list[Segment] = []
        if static:
            sys_ids = engine.render(static, False)
            if 0 < len(sys_ids) <= len(ids) and ids[:len(sys_ids)] == sys_ids:
                segments.append(Segment(0, len(sys_ids), "system_tail", shared=True))
        if context:
            # the blocks sit in the last user message: search from its start
            before = engine.render(msgs[:-1], False) if len(msgs) > 1 else []
            at = len(before) if ids[:len(before)] == before else 0
            for block in context:
                block_ids = engine.tokenize(block)
                if not block_ids:
                    continue
                pos = _find(ids, block_ids, at)
                if pos < 0:  # a token merged across the block's edge: no exact span to mark
                    continue
                segments.append(Segment(pos, pos + len(block_ids), "document"))
                at = pos + len(block_ids)
        return Prompt(tuple(ids), tuple(segments), tuple(msgs), window_start, evicted, budget)

    @staticmethod
    def _check(message: str | Sequence[Message], budget: int) -> None:
        if (isinstance(message, str) and not message.strip()) or not message:
            raise InvalidRequestError("the message is empty: nothing to answer")
        if budget <= 0:
            raise ConfigError(f"the token budget must be > 0, got {budget}")


class CacheStableLayout(_Base):
    """Static first, append-only history, eviction of the oldest turns in chunks of
    ``evict_fraction`` of the budget (see the module docstring)."""

    def __init__(self, evict_fraction: float = 0.5) -> None:
        if not 0.0 < evict_fraction < 1.0:
            raise ConfigError(f"evict_fraction must be in (0, 1), got {evict_fraction}")
        self.evict_fraction = evict_fraction

    def build(
        self, engine: Renderer, system_prompt: str | None, history: Sequence[Message],
        message: str | Sequence[Message], context: Sequence[str], window_start: int,
        budget: int,
    ) -> Prompt:
        self._check(message, budget)
        static = self._static(system_prompt)
        starts = turn_starts(history)
        # the stored window start: a turn boundary (this layout's evictions) or where an
        # application's window began, which may be a reply (a replaced history starts at 0)
        w = min(window_start, len(history))
        ids, msgs = self._assemble(engine, static, history[w:], message, context)
        if len(ids) <= budget:
            return self._finish(engine, static, ids, msgs, context, w, 0, budget)
        target = int((1.0 - self.evict_fraction) * budget)
        candidates = [s for s in starts if s > w] + [len(history)]
        best: tuple[int, list[int], list[Message]] | None = None
        for c in candidates:
            ids, msgs = self._assemble(engine, static, history[c:], message, context)
            if len(ids) <= budget and best is None:
                best = (c, ids, msgs)  # the least eviction that fits, if the target is unreachable
            if len(ids) <= target:
                best = (c, ids, msgs)
                break
        if best is None:
            raise ContextWindowError(
                len(ids), budget,
                "the message (with its context and the system prompt) alone exceeds the budget "
                "of context window minus reply reserve; shorten it or lower max_tokens",
            )
        c, ids, msgs = best
        evicted = sum(1 for s in starts if w <= s < c)
        return self._finish(engine, static, ids, msgs, context, c, evicted, budget)


class SlidingWindowLayout(_Base):
    """Baseline: per-message sliding window like LlamaIndex ``ChatMemoryBuffer``: each turn keep
    the longest suffix of the history that fits the budget and starts with a user message."""

    def build(
        self, engine: Renderer, system_prompt: str | None, history: Sequence[Message],
        message: str | Sequence[Message], context: Sequence[str], window_start: int,
        budget: int,
    ) -> Prompt:
        self._check(message, budget)
        static = self._static(system_prompt)
        starts = turn_starts(history)
        ids: list[int] = []
        for c in [*starts, len(history)]:
            ids, msgs = self._assemble(engine, static, history[c:], message, context)
            if len(ids) <= budget:
                evicted = sum(1 for s in starts if window_start <= s < c)
                return self._finish(engine, static, ids, msgs, context, c, evicted, budget)
        raise ContextWindowError(
            len(ids), budget,
            "the message (with its context and the system prompt) alone exceeds the budget",
        )


LAYOUTS: dict[str, type[CacheStableLayout] | type[SlidingWindowLayout]] = {
    "stable": CacheStableLayout,
    "sliding": SlidingWindowLayout,
}
