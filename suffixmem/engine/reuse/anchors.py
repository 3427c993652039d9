"""Structural anchors: segments found from the prompt's structure rather than from attention.

Four sources, each a pure function from token ids (and, where needed, text offsets) to
``Segment``s of the protocol:

- ``system_tail``: the end of the system prompt. When an earlier system prompt is known, the
  segment is the tail both share (their longest common token suffix: the closing rules after a
  varying date or user name); otherwise the whole system message.
- ``recurring_runs``: a closing template that recurs across turns: runs of at least
  ``min_tokens`` tokens of the current prompt that already appeared in an earlier prompt.
- ``json_schema_segments``: JSON Schema objects written into the prompt's text.
- explicit reuse markers: the ``Segment``s a caller puts in ``Request.segments`` (kind
  ``anchor`` or ``document``); ``merge_segments`` combines them with the others, explicit ones
  first.

No tensors, no tokenizer: callers pass token ids and, for JSON, the text with each token's
character span (``offsets``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from suffixmem.engine.protocol import Segment

PRIORITY: dict[str, int] = {
    "anchor": 0,
    "document": 0,
    "json_schema": 1,
    "system_tail": 2,
    "template": 3,
    "detected": 4,
}
"""Lower wins when segments overlap: explicit markers, then structure, then detection."""

SCHEMA_KEYS = frozenset({"$schema", "properties", "items", "$defs", "definitions", "anyOf",
                         "oneOf", "allOf", "enum", "required"})


def common_suffix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of trailing tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if x != y:
            break
        n += 1
    return n


def system_tail(
    system_span: tuple[int, int],
    prompt_ids: Sequence[int],
    previous_system_ids: Sequence[int] | None = None,
    min_tokens: int = 8,
    shared: bool = False,
) -> Segment | None:
    """The reusable end of the system message that spans ``system_span`` of ``prompt_ids``.

    With ``previous_system_ids`` (an earlier system message's tokens) the segment is the common
    suffix; without, the whole message. ``None`` when shorter than ``min_tokens``.
    """
    start, end = system_span
    if not 0 <= start < end <= len(prompt_ids):
        raise ValueError(f"system span {system_span} lies outside the prompt")
    if previous_system_ids is not None:
        start = end - common_suffix_length(prompt_ids[start:end], previous_system_ids)
    if end - start < min_tokens:
        return None
    return Segment(start, end, kind="system_tail", shared=shared)


def recurring_runs(
    prompt_ids: Sequence[int],
    previous_prompts: Iterable[Sequence[int]],
    min_tokens: int = 12,
    skip_prefix: int = 0,
) -> list[Segment]:
    """Maximal runs (>= ``min_tokens``) of ``prompt_ids[skip_prefix:]`` that occur verbatim in
    one of ``previous_prompts``; pass the prefix-cache hit as ``skip_prefix``, since prefix
    caching serves those tokens already. Found by hashing every ``min_tokens``-gram of the
    earlier prompts, then extending each seed as far as the texts agree."""
    if min_tokens < 1:
        raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
    grams: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    prev = [list(p) for p in previous_prompts]
    for pi, p in enumerate(prev):
        for j in range(len(p) - min_tokens + 1):
            grams.setdefault(tuple(p[j:j + min_tokens]), []).append((pi, j))
    ids = list(prompt_ids)
    out: list[Segment] = []
    i = max(0, skip_prefix)
    while i + min_tokens <= len(ids):
        seeds = grams.get(tuple(ids[i:i + min_tokens]))
        if not seeds:
            i += 1
            continue
        best = 0
        for pi, j in seeds:
            p = prev[pi]
            n = min_tokens
            while i + n < len(ids) and j + n < len(p) and ids[i + n] == p[j + n]:
                n += 1
            best = max(best, n)
        out.append(Segment(i, i + best, kind="template"))
        i += best
    return out


def json_schema_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of top-level JSON objects in ``text`` that look like a
    JSON Schema (an object with a ``type`` or one of the schema keywords, at any depth)."""
    decoder = json.JSONDecoder()
    spans: list[tuple[int, int]] = []
    i = text.find("{")
    while i >= 0:
        try:
            value, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(value, dict) and _looks_like_schema(value):
            spans.append((i, end))
            i = text.find("{", end)
        else:
            i = text.find("{", i + 1)
    return spans


def _looks_like_schema(obj: dict) -> bool:
    if SCHEMA_KEYS & obj.keys():
        return True
    if isinstance(obj.get("type"), str) and obj["type"] in (
        "object", "array", "string", "number", "integer", "boolean", "null"
    ):
        return len(obj) > 1
    return any(isinstance(v, dict) and _looks_like_schema(v) for v in obj.values())


def json_schema_segments(
    text: str, offsets: Sequence[tuple[int, int]], base: int = 0, min_tokens: int = 8
) -> list[Segment]:
    """Segments over the tokens that lie wholly inside a JSON Schema block of ``text``.

    ``offsets[t]`` is token ``t``'s character span in ``text`` (a fast tokenizer's
    ``offset_mapping``); token ``t`` is prompt position ``base + t``. Tokens straddling a
    block's edge are left out: their ids depend on the neighbouring text.
    """
    out: list[Segment] = []
    for lo, hi in json_schema_spans(text):
        inside = [t for t, (a, b) in enumerate(offsets) if lo <= a and b <= hi and b > a]
        if len(inside) >= min_tokens:
            out.append(Segment(base + inside[0], base + inside[-1] + 1, kind="json_schema"))
    return out


def merge_segments(segments: Iterable[Segment], prompt_len: int) -> list[Segment]:
    """Non-overlapping segments within ``[0, prompt_len)``, sorted by start.

    Where segments overlap, the one of higher priority (``PRIORITY``; then the longer, then the
    earlier) is kept whole and the others are dropped.
    """
    ranked = sorted(
        (s for s in segments if s.end <= prompt_len),
        key=lambda s: (PRIORITY.get(s.kind, 5), -(s.end - s.start), s.start),
    )
    kept: list[Segment] = []
    for s in ranked:
        if all(s.end <= k.start or k.end <= s.start for k in kept):
            kept.append(s)
    return sorted(kept, key=lambda s: s.start)
