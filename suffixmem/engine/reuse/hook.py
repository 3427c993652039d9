"""The torch engine's segment-reuse hook: segment cache + placement + blend.

``SegmentReuseHook.install(engine)`` sets ``engine.reuse``. From then on, for every request with
``segments`` and ``exact=False`` (the engine calls nothing for exact requests, so they never
approximate), in the engine's driver thread:

- ``apply``: each marked segment (overlaps resolved by ``anchors.merge_segments``) lying after
  the prefix-cache hit is looked up in the ``SegmentCache`` (the request's session namespace,
  then the global one for shared segments). The engine's isolation scope bounds sharing as it
  bounds the prefix cache's: in ``session`` scope (the default) a ``shared`` segment is kept
  in its session's namespace like any other, so no session is served (or can time) KV
  another computed; in ``public-prefix`` and ``app`` scope it is shared by the engine's
  tenant. Hits are placed at their new positions
  (``placement.place_segments``: RoPE re-rotation, first-k and top-r recompute); the engine
  then prefills only what remains. ``Result.reused_segment_tokens`` counts the reused tokens
  (they are part of ``cached_tokens``), ``recomputed_tokens`` the segment tokens recomputed.
- context shift (``context_shift.py``): the rest of the prompt after the prefix-cache hit is
  matched against the session's previous sequence; runs of at least ``min_run`` tokens whose KV
  is still cached there (the kept turns after old ones were dropped) are placed at their new
  positions the same way. They count in ``reused_segment_tokens`` but not in
  ``reused_segments`` (they come from the session's own blocks, not the segment cache).
- ``after_prefill``: segments that missed are stored: the cache takes a reference on the
  sequence's blocks that hold them (zero copy), keys rotated for their positions in this prompt.

The cache's block budget defaults to a quarter of the engine's pool, and when the pool runs short
the engine's scheduler takes blocks back from it (``SegmentCache.evict``, pinned entries last)
before a request waits, is preempted or is refused. ``release_session`` (a topic jump, a
session's end) may be called from any thread: it runs in the driver thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from suffixmem.engine.protocol import Request, Segment
from suffixmem.engine.reuse.anchors import merge_segments
from suffixmem.engine.reuse.blend import DEFAULT_BLEND, BlendConfig
from suffixmem.engine.reuse.context_shift import SHIFT_BLEND, ContextShift, subtract
from suffixmem.engine.reuse.placement import SegmentSource, place_segments
from suffixmem.engine.reuse.segment_cache import (
    SegmentCache,
    SegmentCacheConfig,
    SegmentCacheStats,
    SegmentFeatures,
    SegmentHit,
    ValueScorer,
)
from suffixmem.engine.torch.reuse_hook import ReuseEngine, ReuseOutcome

if TYPE_CHECKING:  # pragma: no cover
    from suffixmem.engine.torch.sequence import Sequence

DEFAULT_BUDGET_SHARE = 0.25
"""Share of the engine's KV blocks the segment cache may hold when no budget is given."""
MAX_PENDING_STORES = 1024
"""Bound on remembered store plans (a sequence that fails between apply and prefill leaves one)."""


class SegmentReuseHook:
    """Implements the torch engine's ``ReuseHook`` (``apply``) and ``after_prefill``."""

    def __init__(self, cache: SegmentCache, blend: BlendConfig | None = None,
                 engine: ReuseEngine | None = None,
                 shift: ContextShift | None = None, documents: bool = True) -> None:
        self.cache = cache
        self.blend = blend or DEFAULT_BLEND
        self.engine = engine
        self.shift = shift
        self.documents = documents
        # may a ``shared`` segment serve other sessions? (the isolation scope decides)
        iso = getattr(engine, "isolation", None)
        self.share = iso is not None and iso.shares_across_sessions
        self._stores: dict[str, list[Segment]] = {}
        self.requests = 0
        self.segments_seen = 0
        self.segments_reused = 0

    @classmethod
    def install(
        cls,
        engine: ReuseEngine,
        blend: BlendConfig | None = None,
        cache_config: SegmentCacheConfig | None = None,
        scorer: ValueScorer | None = None,
        clock: Callable[[], float] = time.monotonic,
        shift: ContextShift | None = None,
        context_shift: bool = True,
        documents: bool = True,
    ) -> SegmentReuseHook:
        """Create a hook over ``engine``'s block pool and set it as ``engine.reuse``.

        ``context_shift`` (default on; it only acts on ``exact=False`` requests) reuses a
        session's kept turns at their new positions, with ``shift`` or a default
        ``ContextShift``. ``documents=False`` ignores ``Request.segments`` (nothing is looked
        up or stored): context shift alone, the torch engine's default."""
        if cache_config is None:
            budget = max(1, int(engine.block_pool.num_blocks * DEFAULT_BUDGET_SHARE))
            cache_config = SegmentCacheConfig(max_blocks=budget)
        own_blend = blend is not None
        blend = blend or DEFAULT_BLEND
        if blend.fresh_depth > engine.model.config.num_layers:
            raise ValueError(
                f"{blend.label()} needs {blend.fresh_depth} fresh layers: the model has "
                f"{engine.model.config.num_layers} layers"
            )
        cache = SegmentCache(engine.block_pool, cache_config, scorer=scorer, clock=clock)
        if context_shift and shift is None:
            shift = ContextShift(blend=None if own_blend else SHIFT_BLEND)
        hook = cls(cache, blend, engine, shift if context_shift else None, documents)
        engine.reuse = hook
        return hook

    # -- the engine's calls (driver thread) -----------------------------------------------------
    def apply(self, engine: ReuseEngine, seq: Sequence, request: Request) -> ReuseOutcome:
        """Place cached segments of ``seq``'s prompt; return the positions left to compute."""
        self.cache.evict_expired()
        self.requests += 1
        n = seq.num_prompt_tokens
        prompt = seq.token_ids[:n]
        num_cached = seq.num_computed
        sources: list[SegmentSource] = []
        spans: list[tuple[int, int]] = []
        stores: list[Segment] = []
        for s in merge_segments(request.segments if self.documents else (), n):
            self.segments_seen += 1
            ids = prompt[s.start:s.end]
            hit = None if s.start < num_cached else self.cache.lookup(request.session_key, ids)
            if hit is None:
                if not self.cache.contains(request.session_key, ids):
                    stores.append(s)
                continue
            self.segments_reused += 1
            spans.append((s.start, s.end))
            sources.append(SegmentSource(s.start, self._slots(engine, hit), hit.origin_start))
        if len(self._stores) >= MAX_PENDING_STORES:  # sequences that failed before prefill
            self._stores.pop(next(iter(self._stores)))
        if request.segments:  # (``after_prefill`` runs only for requests with segments)
            self._stores[seq.seq_id] = stores
        if self.shift is not None:
            shifted = self._shift_sources(engine, seq, request, prompt, num_cached, spans)
            if shifted:
                sources = sorted([*sources, *shifted], key=lambda src: src.start)
            self.shift.remember(request.session_key, seq.token_ids)
        # a request that marks documents (passages, context blocks) is the documents / rag
        # class: its shifted history too is placed by the document method, as ``bench
        # segments`` gated it on the rag workload's events; shifted runs alone (the overflow
        # class) by the method their own gate chose (``ContextShift``)
        documents = self.documents and any(s.kind == "document" for s in request.segments)
        blend = (self.blend if spans or documents or self.shift is None
                 else self.shift.blend or self.blend)
        placement = place_segments(engine.runner, seq.block_table, prompt, num_cached, sources,
                                   blend)
        return ReuseOutcome(placement.compute_positions, len(placement.reused_positions),
                            placement.recomputed, tuple(spans))

    def after_prefill(self, engine: ReuseEngine, seq: Sequence, request: Request) -> None:
        """Store the segments that missed; their K/V now sit in ``seq``'s blocks."""
        stores = self._stores.pop(seq.seq_id, None)
        n = seq.num_prompt_tokens
        if not self.documents:
            return
        if stores is None:  # re-prefilled exactly (after preemption): every uncached segment
            stores = list(merge_segments(request.segments, n))
        bs = engine.block_size
        for s in stores:
            ids = seq.token_ids[s.start:s.end]
            if self.cache.contains(request.session_key, ids):
                continue
            blocks = seq.block_table[s.start // bs:(s.end - 1) // bs + 1]
            shared = s.shared and self.share
            features = SegmentFeatures(
                num_tokens=len(ids), kind=s.kind, shared=shared, position=s.start,
                prompt_tokens=n,
            )
            self.cache.put(request.session_key, ids, blocks, s.start % bs, s.start,
                           kind=s.kind, shared=shared, features=features)

    def _shift_sources(self, engine: ReuseEngine, seq: Sequence, request: Request,
                       prompt: list[int], num_cached: int,
                       taken: list[tuple[int, int]]) -> list[SegmentSource]:
        """Context shift: the prompt's runs found in the session's previous sequence whose KV
        is still cached (looked up under this sequence's salts), minus spans ``taken``."""
        assert self.shift is not None
        old = self.shift.previous(request.session_key)
        if old is None or old is seq.token_ids or self.shift.continues(request.session_key,
                                                                         prompt):
            return []
        bs = engine.block_size
        match = engine.block_pool.match(
            old, seq.salt, approx_salt=seq.approx_salt, public_blocks=seq.public_len // bs,
            public_salt=seq.public_salt)
        runs = self.shift.runs(request.session_key, prompt, num_cached, match.num_cached_tokens)
        runs = subtract(runs, taken, self.shift.min_run)
        if runs:
            self.shift.shifts += 1
            self.shift.shifted_tokens += sum(r.length for r in runs)
        ids = match.block_ids
        return [SegmentSource(r.new_start, tuple(ids[(r.old_start + i) // bs] * bs
                                                 + (r.old_start + i) % bs
                                                 for i in range(r.length)), r.old_start)
                for r in runs]

    # -- other threads --------------------------------------------------------------------------
    def release_session(self, session_key: str) -> int:
        """Drop the session's own segments (shared ones stay); returns how many. Safe from any
        thread: the work runs in the engine's driver thread."""
        def release(_engine: object = None) -> int:
            if self.shift is not None:
                self.shift.forget(session_key)
            return self.cache.release_session(session_key)

        if self.engine is None:
            return release()
        return self.engine.run_in_driver(release)

    def stats(self) -> SegmentCacheStats:
        return self.cache.stats()

    # -- internals ------------------------------------------------------------------------------
    @staticmethod
    def _slots(engine: ReuseEngine, hit: SegmentHit) -> tuple[int, ...]:
        bs = engine.block_size
        return tuple(
            hit.block_ids[(hit.offset + i) // bs] * bs + (hit.offset + i) % bs
            for i in range(hit.num_tokens)
        )
