"""The manager's segment log: each turn's marked segments, whether the engine really reused
them, and the tier the shared retention policy (``suffixmem.retention``) gives them.

A sighting is a *hit* when the engine served the span from cache: it lies inside the prefix
the prefix cache served (``cached_tokens - reused_segment_tokens`` leading tokens), or it is
one of ``Result.reused_segments`` (spans taken from the segment cache). Nothing is guessed from
SQL. The log is the training data of ``conversation.value.train_value_scorer``. Bookkeeping
only: it runs after the turn is committed, off the path to the reply.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from suffixmem.conversation.layout import Prompt
from suffixmem.conversation.records import SegmentSighting
from suffixmem.conversation.store import Store
from suffixmem.engine.protocol import Result
from suffixmem.retention import (
    RetentionPolicy,
    SegmentFeatures,
    Tier,
    segment_hash,
    token_entropy,
)

TTL_S = {Tier.EXTENDED: 30 * 60.0, Tier.STANDARD: 5 * 60.0, Tier.NONE: 0.0}


def engine_hits(result: Result) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(tokens served by the prefix cache, spans served by the segment cache)."""
    spans = result.reused_segments
    return max(0, result.cached_tokens - result.reused_segment_tokens), spans


def record(store: Store, policy: RetentionPolicy, session_id: str, prompt: Prompt,
           result: Result) -> list[SegmentSighting]:
    """Log ``prompt``'s segments for the committed turn and store their tiers."""
    now = time.time()
    prefix, spans = engine_hits(result)
    reused = set(spans)
    sightings: list[SegmentSighting] = []
    tiers = []
    pieces = [prompt.token_ids[seg.start:seg.end] for seg in prompt.segments]
    keys = [(segment_hash(span), "*" if seg.shared else session_id)
            for seg, span in zip(prompt.segments, pieces, strict=True)]
    known = store.segment_states(keys)  # one read for all of them
    for seg, span, (h, scope) in zip(prompt.segments, pieces, keys, strict=True):
        rec, seen = known.get((h, scope), (None, 0))
        feats = SegmentFeatures(
            num_tokens=len(span), kind=seg.kind, shared=seg.shared,
            seen=seen, position=seg.start, prompt_tokens=len(prompt.token_ids),
            age_s=0.0 if rec is None else max(0.0, now - rec.created_at.timestamp()),
            since_last_s=0.0 if rec is None else max(0.0, now - rec.last_seen_at.timestamp()),
            sessions_seen=1 if rec is None else rec.sessions_seen,
            token_entropy=token_entropy(span),
        )
        hit = seg.end <= prefix or (seg.start, seg.end) in reused
        sightings.append(SegmentSighting(h, scope, seg.kind, len(span), feats.to_dict(), hit))
        decision = policy.decide(feats)
        expires = None if decision.tier is Tier.PINNED else (
            datetime.now(UTC) + timedelta(seconds=TTL_S[decision.tier]))
        tiers.append((h, scope, decision.tier.value, decision.score, expires))
    # the sightings and the tiers in one write transaction
    store.record_segments(session_id, sightings, tiers=tiers)
    return sightings

