"""Context shift: kept turns reuse their KV at new positions after old turns were dropped."""

from __future__ import annotations

from collections.abc import Iterator
from difflib import SequenceMatcher

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suffixmem.engine.protocol import Message, Request, SamplingParams, Segment
from suffixmem.engine.reuse.blend import DEFAULT_BLEND, BlendConfig
from suffixmem.engine.reuse.context_shift import ContextShift, ShiftRun, find_runs, subtract
from suffixmem.engine.reuse.hook import SegmentReuseHook
from suffixmem.engine.reuse.segment_cache import SegmentCacheConfig


def test_find_runs_is_order_preserving_and_respects_min_run() -> None:
    old = list(range(100))
    new = old[:10] + old[40:100] + [500, 501]  # turns 10..39 dropped
    assert find_runs(old, new, 10, min_run=8) == [ShiftRun(10, 40, 60)]
    assert find_runs(old, new, 10, min_run=61) == []
    assert find_runs(old, new, len(new)) == []


def _difflib_runs(old: list[int], new: list[int], start: int, min_run: int) -> list[ShiftRun]:
    """The reference ``find_runs`` reproduces: difflib's matching blocks of that size."""
    blocks = SequenceMatcher(None, old, new[start:], autojunk=False).get_matching_blocks()
    return [ShiftRun(start + b, a, n) for a, b, n in blocks if n >= min_run]


@st.composite
def _token_pairs(draw: st.DrawFn) -> tuple[list[int], list[int], int, int]:
    """Two sequences over a small alphabet (many repeats and ties), the new one often made of
    pieces of the old one (shifted turns), with a start and a minimum run."""
    alphabet = draw(st.integers(1, 6))
    tokens = st.integers(0, alphabet - 1)
    old = draw(st.lists(tokens, max_size=90))
    new = draw(st.lists(tokens, max_size=30))
    for _ in range(draw(st.integers(0, 3))):
        if old:
            a = draw(st.integers(0, len(old) - 1))
            at = draw(st.integers(0, len(new)))
            new[at:at] = old[a:a + draw(st.integers(1, 40))]
    return old, new, draw(st.integers(0, len(new))), draw(st.integers(1, 12))


@settings(max_examples=400, deadline=None)
@given(_token_pairs())
def test_find_runs_equals_difflibs_matching_blocks(case: tuple) -> None:
    old, new, start, min_run = case
    assert find_runs(old, new, start, min_run) == _difflib_runs(old, new, start, min_run)


def test_find_runs_prefers_the_longest_then_earliest_run() -> None:
    # 0..9 occurs twice in old; the longer occurrence wins, then the earliest one breaks ties
    old = [*range(10), 77, *range(12), *range(10)]
    new = list(range(12))
    assert find_runs(old, new, 0, 5) == [ShiftRun(0, 11, 12)]
    assert find_runs(list(range(10)) * 2, list(range(10)), 0, 5) == [ShiftRun(0, 0, 10)]


def test_subtract_keeps_long_enough_pieces() -> None:
    runs = [ShiftRun(10, 40, 60)]
    assert subtract(runs, [(30, 35)], 5) == [ShiftRun(10, 40, 20), ShiftRun(35, 65, 35)]
    assert subtract(runs, [(12, 68)], 5) == []


def test_context_shift_remembers_a_bounded_number_of_sessions() -> None:
    shift = ContextShift(min_run=4, max_sessions=2)
    a = [1, 2, 3, 4, 5, 6]
    shift.remember("a", a)
    a.extend([7, 8])  # the engine appends output in place: it is seen
    shift.remember("b", [9])
    shift.remember("c", [9])
    assert shift.previous("a") is None and len(shift) == 2
    shift.remember("b", a)
    assert shift.runs("b", [0, 0, 3, 4, 5, 6, 7], 2, cached_len=8) == [ShiftRun(2, 2, 5)]
    assert shift.runs("b", [0, 0, 3, 4, 5, 6, 7], 2, cached_len=4) == []  # KV gone past 4
    assert shift.forget("b") and not shift.forget("b")


def test_a_prompt_that_continues_the_previous_sequence_has_nothing_to_shift() -> None:
    shift = ContextShift(min_run=2)
    old = list(range(10))
    assert shift.continues("s", old)  # nothing remembered: nothing to shift from
    shift.remember("s", old)
    # a turn that dropped nothing (the last token, never fed, may differ)
    assert shift.continues("s", [*old, 50, 51]) and shift.continues("s", [*old[:9], 7, 50])
    assert shift.continues("s", old[:4])
    # turns 1-2 dropped: the rest moved two positions to the left
    moved = [0, *old[3:], 50]
    assert not shift.continues("s", moved)
    assert shift.runs("s", moved, 1, cached_len=8) == [ShiftRun(1, 3, 5)]


def test_shifted_runs_use_their_own_method_unless_the_hook_was_given_one() -> None:
    from suffixmem.engine.reuse.context_shift import SHIFT_BLEND
    from suffixmem.engine.torch.block_pool import BlockPool

    class Config:
        num_layers = 30

    class Model:
        config = Config()

    class Engine:
        block_pool, model, reuse = BlockPool(64, 16), Model(), None

    default = SegmentReuseHook.install(Engine())  # type: ignore[arg-type]
    assert default.shift is not None and default.shift.blend == SHIFT_BLEND
    assert default.blend == DEFAULT_BLEND and default.documents
    given = SegmentReuseHook.install(Engine(), BlendConfig(first_k=16),  # type: ignore[arg-type]
                                     documents=False)
    assert given.shift is not None and given.shift.blend is None and not given.documents


SYSTEM = "You are a patient tutor. Explain things to a curious student in plain words."
TURNS = [
    ("What is a lighthouse for?", "A lighthouse warns ships about rocks and marks the coast at "
     "night with a bright rotating light, so sailors know where they are."),
    ("Who looked after them?", "Keepers lived in or near the tower, kept the lamp lit, cleaned "
     "the lens, wound the clockwork and wrote the weather into a log book every few hours."),
    ("Was it a lonely job?", "Often yes. Some stations were on small rocks far from land, and "
     "keepers spent weeks there with only one or two colleagues and a supply boat."),
    ("Are there keepers today?", "Very few. Most lights were automated in the last century and "
     "are now watched remotely, though some towers are museums with guides."),
    ("How far can the light be seen?", "Depending on the height of the tower and the lamp, a "
     "major light can be seen from about twenty to thirty nautical miles away at sea."),
]
QUESTION = "Summarise what we said about keepers in one sentence."
GREEDY = SamplingParams(max_tokens=8)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine() -> Iterator[object]:
    from suffixmem.engine import create_engine

    eng = create_engine("torch", max_model_len=1024, kv_cache_gib=0.25, dtype="float32",
                        extra={"num_threads": 2})
    hook = SegmentReuseHook.install(eng, BlendConfig(first_k=16),
                                    SegmentCacheConfig(max_blocks=64))
    yield eng, hook
    eng.close()


def render(eng, turns, question):  # type: ignore[no-untyped-def]
    msgs = [Message("system", SYSTEM)]
    for u, a in turns:
        msgs += [Message("user", u), Message("assistant", a)]
    ids = eng.render([*msgs, Message("user", question)])
    sys_ids = eng.render(msgs[:1], False)
    return ids, (Segment(0, len(sys_ids), "system_tail", shared=True),)


def ask(eng, session, ids, segs, exact=False):  # type: ignore[no-untyped-def]
    return eng.generate(Request(session, token_ids=ids, segments=segs, exact=exact,
                                sampling=GREEDY))


def test_context_shift_keeps_exact_text_when_nothing_was_dropped(engine) -> None:  # type: ignore[no-untyped-def]
    eng, hook = engine
    ids1, segs = render(eng, TURNS[:2], "And what did they eat?")
    first = ask(eng, "grow", ids1, segs)
    # the next turn appends: the stored reply, then a new question (nothing dropped)
    msgs = [Message("system", SYSTEM)]
    for u, a in TURNS[:2]:
        msgs += [Message("user", u), Message("assistant", a)]
    ids2 = eng.render([*msgs, Message("user", "And what did they eat?"),
                       Message("assistant", first.text), Message("user", QUESTION)])
    assert ids2[:len(ids1)] == ids1
    before = hook.shift.shifts
    second = ask(eng, "grow", ids2, segs)
    assert hook.shift.shifts == before  # the prefix cache covers it: no shift
    assert second.reused_segment_tokens == 0 and second.cached_tokens > len(ids1) // 2
    reference = ask(eng, "grow-ref", ids2, segs, exact=True)
    assert reference.cached_tokens == 0
    assert second.token_ids == reference.token_ids


def test_eviction_turn_reuses_kept_turns_and_exact_lookups_never_see_them(engine) -> None:  # type: ignore[no-untyped-def]
    eng, hook = engine
    bs = eng.block_size
    full, segs = render(eng, TURNS, QUESTION)
    ask(eng, "evict", full, segs)  # the turn before the eviction
    kept, segs = render(eng, TURNS[2:], QUESTION)  # the two oldest turns dropped
    before = hook.shift.shifts
    shifted = ask(eng, "evict", kept, segs)
    assert hook.shift.shifts == before + 1
    common = next(i for i, (a, b) in enumerate(zip(full, kept, strict=False)) if a != b)
    sys_blocks = common // bs * bs
    assert segs[0].end // bs * bs <= sys_blocks < segs[0].end + 16
    # everything after the first turn moved left: only the common prefix's whole blocks hit the
    # prefix cache, and the kept turns come from the previous sequence at new positions
    assert shifted.reused_segments == ()
    assert shifted.reused_segment_tokens > (len(kept) - sys_blocks) // 2
    assert shifted.cached_tokens == sys_blocks + shifted.reused_segment_tokens
    assert shifted.recomputed_tokens >= 16  # the first tokens of each run are recomputed

    # approximate blocks never come back from an exact lookup. The first run's first tokens
    # were recomputed in place (exact: they follow the exact prefix), so exactness ends at the
    # first reused token; every block from there on is cached under the approximate salt only.
    def pool_match(approx: bool):  # type: ignore[no-untyped-def]
        return eng.block_pool.match(kept, "evict", approx_salt="evict\x00approx" if approx
                                    else None)

    m_exact, m_approx = eng.run_in_driver(lambda _e: (pool_match(False), pool_match(True)))
    exact_end = m_approx.num_exact_tokens
    assert sys_blocks <= exact_end <= sys_blocks + shifted.recomputed_tokens
    assert m_exact.num_cached_tokens == exact_end < m_approx.num_cached_tokens
    # the exact request of the same session stops there and gives what a cache-free run gives
    exact = ask(eng, "evict", kept, segs, exact=True)
    assert exact.cached_tokens == exact_end and exact.reused_segment_tokens == 0
    cold = ask(eng, "evict-cold", kept, segs, exact=True)
    assert cold.cached_tokens == 0 and exact.token_ids == cold.token_ids
    # a later non-exact turn continues from the approximate blocks (the eviction stays warm)
    again = ask(eng, "evict", kept, segs)
    assert again.cached_tokens == (len(kept) - 1) // bs * bs
