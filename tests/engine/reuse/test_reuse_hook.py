"""Segment reuse inside the torch engine: the hook, end to end, on the real model (fp32)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from suffixmem.engine.protocol import Request, SamplingParams, Segment
from suffixmem.engine.reuse.blend import BlendConfig
from suffixmem.engine.reuse.hook import SegmentReuseHook
from suffixmem.engine.reuse.segment_cache import SegmentCacheConfig, Tier

pytestmark = pytest.mark.slow

DOC = (
    "Document: The json module exposes an API familiar to users of the standard library marshal "
    "and pickle modules. It encodes Python objects as JSON strings with dumps and decodes them "
    "with loads; dump and load work on file objects. Custom classes can be supported by "
    "passing a default function or a JSONEncoder subclass."
)
PREFIXES = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n",
    "<|im_start|>system\nYou answer questions about Python for beginners, in one sentence."
    "<|im_end|>\n<|im_start|>user\nI am reading the documentation.\n",
)
QUESTION = "\nWhich function decodes JSON strings?<|im_end|>\n<|im_start|>assistant\n"
GREEDY = SamplingParams(max_tokens=8)
BLEND = BlendConfig(first_k=4, ratio=0.3)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def engine() -> Iterator[object]:
    from suffixmem.engine import create_engine

    # ``public-prefix``: shared segments serve other sessions (in ``session`` scope they do
    # not: the last test); the segments here never start at 0, so no prefix block is public
    eng = create_engine("torch", max_model_len=1024, kv_cache_gib=0.25, dtype="float32",
                        isolation="public-prefix", extra={"num_threads": 2})
    yield eng
    eng.close()


@pytest.fixture()
def hook(engine) -> Iterator[tuple[SegmentReuseHook, Clock]]:  # type: ignore[no-untyped-def]
    clock = Clock()
    h = SegmentReuseHook.install(engine, BLEND,
                                 SegmentCacheConfig(max_blocks=64), clock=clock)
    yield h, clock
    engine.run_in_driver(lambda e: h.cache.clear())
    engine.reuse = None


def prompt(engine, prefix: int, shared: bool = False) -> tuple[list[int], tuple[Segment, ...]]:  # type: ignore[no-untyped-def]
    pre, doc = engine.tokenize(PREFIXES[prefix]), engine.tokenize(DOC)
    ids = pre + doc + engine.tokenize(QUESTION)
    return ids, (Segment(len(pre), len(pre) + len(doc), kind="document", shared=shared),)


def ask(engine, session: str, prefix: int, exact: bool = False, shared: bool = False):  # type: ignore[no-untyped-def]
    ids, segs = prompt(engine, prefix, shared)
    return engine.generate(Request(session, token_ids=ids, segments=segs, exact=exact,
                                   sampling=GREEDY))


def test_second_request_reuses_the_segment_at_a_new_position(engine, hook) -> None:  # type: ignore[no-untyped-def]
    h, _ = hook
    first = ask(engine, "s-move", 0)
    assert first.reused_segment_tokens == 0 and len(h.cache) == 1 and first.reused_segments == ()
    _, (seg,) = prompt(engine, 1)
    second = ask(engine, "s-move", 1)
    recomputed = 4 + BLEND.num_deviating(len(seg))  # first k, then the top r deviating
    assert second.recomputed_tokens == recomputed
    assert second.reused_segment_tokens == len(seg) - recomputed
    assert second.cached_tokens >= second.reused_segment_tokens
    assert second.reused_segments == ((seg.start, seg.end),)  # the span, for the value policy
    reference = ask(engine, "s-move-ref", 1, exact=True)
    assert reference.reused_segment_tokens == 0 and reference.cached_tokens == 0
    assert second.token_ids[:6] == reference.token_ids[:6]


def test_same_position_after_identical_prefix_is_exact(engine, hook) -> None:  # type: ignore[no-untyped-def]
    ask(engine, "s-exact-a", 0, shared=True)
    reused = ask(engine, "s-exact-b", 0, shared=True)  # another session: no prefix-cache hit
    assert reused.reused_segment_tokens > 0 and reused.cached_tokens == reused.reused_segment_tokens
    reference = ask(engine, "s-exact-c", 0, exact=True)
    assert reused.token_ids == reference.token_ids


def test_exact_requests_never_reuse(engine, hook) -> None:  # type: ignore[no-untyped-def]
    h, _ = hook
    ask(engine, "s-x", 0)
    exact = ask(engine, "s-x", 1, exact=True)
    assert exact.reused_segment_tokens == 0 and exact.recomputed_tokens == 0
    assert exact.reused_segments == ()
    assert h.cache.stats().hits == 0


def test_approximate_blocks_never_serve_an_exact_request(engine, hook) -> None:  # type: ignore[no-untyped-def]
    """After a segment was reused at a new position, the blocks from the first reused token on
    are cached under the session's approximate salt: an exact request of the same session stops
    before them and gives what a cache-free run gives; a non-exact one walks into them."""
    bs = engine.block_size
    ask(engine, "s-approx", 0)
    ids, (seg,) = prompt(engine, 1)
    moved = ask(engine, "s-approx", 1)
    assert moved.reused_segment_tokens > 0
    exact = ask(engine, "s-approx", 1, exact=True)
    # exactness ends at the first reused token, at most first k + top r into the segment
    limit = seg.start + BLEND.first_k + BLEND.num_deviating(len(seg))
    assert exact.cached_tokens % bs == 0 and exact.cached_tokens <= limit
    assert exact.reused_segment_tokens == 0
    cold = ask(engine, "s-approx-cold", 1, exact=True)
    assert cold.cached_tokens == 0 and exact.token_ids == cold.token_ids
    again = ask(engine, "s-approx", 1)
    assert again.cached_tokens == (len(ids) - 1) // bs * bs > limit


def test_sessions_are_isolated_unless_shared(engine, hook) -> None:  # type: ignore[no-untyped-def]
    ask(engine, "alice", 0)
    assert ask(engine, "bob", 1).reused_segment_tokens == 0
    ask(engine, "carol", 0, shared=True)
    assert ask(engine, "dave", 1, shared=True).reused_segment_tokens > 0


def test_expired_segments_are_not_served(engine, hook) -> None:  # type: ignore[no-untyped-def]
    h, clock = hook
    ask(engine, "s-ttl", 0)
    clock.now += 299.0
    assert ask(engine, "s-ttl", 1).reused_segment_tokens > 0  # and restarts the TTL
    clock.now += 300.0
    assert ask(engine, "s-ttl", 0).reused_segment_tokens == 0
    assert h.cache.stats().expired == 1


def test_release_session_drops_its_segments_and_blocks(engine, hook) -> None:  # type: ignore[no-untyped-def]
    h, _ = hook
    ask(engine, "s-rel", 0)
    held = h.cache.stats().blocks
    used_before = engine.run_in_driver(lambda e: e.block_pool.num_used)
    assert h.release_session("s-rel") == 1
    assert engine.run_in_driver(lambda e: e.block_pool.num_used) == used_before - held
    assert ask(engine, "s-rel", 1).reused_segment_tokens == 0


def test_value_tiers_apply_in_the_engine(engine) -> None:  # type: ignore[no-untyped-def]
    class Low:
        def score(self, features):  # type: ignore[no-untyped-def]
            return 0.3

    class High:
        def score(self, features):  # type: ignore[no-untyped-def]
            return 0.9

    for scorer, tier in ((Low(), None), (High(), Tier.PINNED)):
        clock = Clock()
        # the segment cache's tiers alone: context shift would reuse the session's previous
        # sequence whatever the tier (its own KV, not a cached segment)
        h = SegmentReuseHook.install(engine, BlendConfig(first_k=4), scorer=scorer, clock=clock,
                                     context_shift=False)
        try:
            ask(engine, f"s-tier-{tier}", 0)
            clock.now += 10_000.0  # far beyond every TTL
            reused = ask(engine, f"s-tier-{tier}", 1).reused_segment_tokens
            assert (reused > 0) == (tier is Tier.PINNED)
        finally:
            engine.run_in_driver(lambda e, h=h: h.cache.clear())
            engine.reuse = None


def test_session_scope_keeps_shared_segments_in_their_session() -> None:
    """The isolation scope bounds the segment cache as it bounds the prefix cache: in the
    default ``session`` scope a segment marked ``shared`` serves its own session only."""
    from suffixmem.engine import create_engine

    private = create_engine("torch", max_model_len=1024, kv_cache_gib=0.25, dtype="float32",
                            extra={"num_threads": 2})
    try:
        SegmentReuseHook.install(private, BLEND, SegmentCacheConfig(max_blocks=64))
        ask(private, "erin", 0, shared=True)
        assert ask(private, "frank", 1, shared=True).reused_segment_tokens == 0
        assert ask(private, "erin", 1, shared=True).reused_segment_tokens > 0
        assert private.reuse.cache.stats().entries == 2  # one per session, none global
    finally:
        private.close()
