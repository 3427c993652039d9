"""Placing cached segment K/V at new positions on the real model (fp32), against full
recomputation with the same primitives."""

from __future__ import annotations

import pytest
import torch

from suffixmem.engine.reuse.blend import BlendConfig
from suffixmem.engine.reuse.placement import SegmentSource, forward_layers, place_segments

pytestmark = pytest.mark.slow

DOC = (
    "Document: Beijing is the capital of the People's Republic of China. It is the country's "
    "political and cultural centre, home to the Forbidden City and Tiananmen Square, and it "
    "hosted the 2008 Summer Olympics. The city lies in northern China and has more than twenty "
    "million inhabitants."
)
PREFIX_A = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
PREFIX_B = (
    "<|im_start|>system\nYou are a concise assistant who answers geography questions for "
    "students.<|im_end|>\n<|im_start|>user\nHere is some reading material.\n"
)
QUESTION_1 = "\nWhat is the capital of China?<|im_end|>\n<|im_start|>assistant\n"
QUESTION_2 = "\nWhich Olympics did the city host?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def enc(tokenizer):  # type: ignore[no-untyped-def]
    return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])


def full(rig, ids: list[int]) -> tuple[list[int], torch.Tensor]:  # type: ignore[no-untyped-def]
    """Full recomputation of ``ids``: its blocks and every position's logits."""
    bt = rig.alloc(len(ids))
    return bt, forward_layers(rig.runner, bt, ids, range(len(ids)), len(ids), want_logits=True)


def reuse(rig, ids, num_prefix, src_slots, origin, blend):  # type: ignore[no-untyped-def]
    """Place one segment at ``num_prefix`` and compute the rest; returns (blocks, placement,
    logits of the computed positions)."""
    bt = rig.alloc(len(ids))
    pl = place_segments(rig.runner, bt, ids, 0, [SegmentSource(num_prefix, src_slots, origin)],
                        blend)
    logits = forward_layers(rig.runner, bt, [ids[p] for p in pl.compute_positions],
                            pl.compute_positions, len(ids), want_logits=True)
    return bt, pl, logits


def greedy(rig, bt, ids, first_logits, steps):  # type: ignore[no-untyped-def]
    """Greedy continuation after a prefilled prompt whose last logits are ``first_logits``."""
    out = [int(first_logits.argmax())]
    need = len(ids) + steps
    bt = bt + rig.alloc(need - len(bt) * rig.blocks.block_size) if need > len(bt) * 16 else bt
    for j in range(steps - 1):
        p = len(ids) + j
        lg = forward_layers(rig.runner, bt, [out[-1]], [p], p + 1, want_logits=True)
        out.append(int(lg[-1].argmax()))
    return bt, out


def cached_segment(rig, enc, prefix: str):  # type: ignore[no-untyped-def]
    """Compute prefix + DOC + QUESTION_1 once; return (blocks, DOC's slots, DOC's start)."""
    pre, doc = enc(prefix), enc(DOC)
    bt, _ = full(rig, pre + doc + enc(QUESTION_1))
    return bt, tuple(rig.runner.slots(bt, range(len(pre), len(pre) + len(doc)))), len(pre)


@pytest.mark.parametrize("blend", [BlendConfig(0, 0.0), BlendConfig(4, 0.2, (1, 2))])
def test_reuse_at_the_original_position_gives_the_same_logits(rig, enc, blend) -> None:  # type: ignore[no-untyped-def]
    src_bt, slots, start = cached_segment(rig, enc, PREFIX_A)
    ids = enc(PREFIX_A) + enc(DOC) + enc(QUESTION_2)  # same prefix, another question
    ref_bt, ref = full(rig, ids)
    bt, pl, got = reuse(rig, ids, start, slots, start, blend)
    assert len(pl.reused_positions) > 0.7 * len(slots)
    # the computed positions' logits equal full recomputation's (float summation order aside)
    want = ref[list(pl.compute_positions)]
    assert (got - want).abs().max().item() < 1e-3
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    for b in (src_bt, ref_bt, bt):
        rig.blocks.decref(b)


@pytest.mark.parametrize("shift", [-9, 13])
def test_rerotated_keys_equal_keys_computed_at_the_new_position(rig, enc, shift) -> None:  # type: ignore[no-untyped-def]
    """Layer 0's keys depend only on the token and its position: after re-rotation they must
    equal a direct computation at the new positions."""
    src_bt, slots, start = cached_segment(rig, enc, PREFIX_B)
    pre = enc(PREFIX_B)[: start + shift] if shift < 0 else enc(PREFIX_B) + enc(" x" * shift)[:shift]
    ids = pre + enc(DOC) + enc(QUESTION_1)
    ref_bt, _ = full(rig, ids)
    bt = rig.alloc(len(ids))
    place_segments(rig.runner, bt, ids, 0, [SegmentSource(len(pre), slots, start)],
                   BlendConfig(0, 0.0))
    pos = range(len(pre), len(pre) + len(slots))
    pool = rig.runner.kv_pool
    k_got = pool.k[0, rig.runner.slots(bt, pos)]
    k_ref = pool.k[0, rig.runner.slots(ref_bt, pos)]
    assert len(pre) == start + shift
    assert (k_got - k_ref).abs().max().item() < 1e-4
    # and the keys were moved: the cached ones (old positions) differ
    assert (pool.k[0, list(slots)] - k_ref).abs().max().item() > 1e-2
    for b in (src_bt, ref_bt, bt):
        rig.blocks.decref(b)


def test_layout_is_contiguous_and_recompute_counts_match(rig, enc) -> None:  # type: ignore[no-untyped-def]
    src_bt, slots, start = cached_segment(rig, enc, PREFIX_A)
    pre = enc(PREFIX_B)
    ids = pre + enc(DOC) + enc(QUESTION_2)
    blend = BlendConfig(first_k=3, ratio=0.25)
    bt, pl, _ = reuse(rig, ids, len(pre), slots, start, blend)
    computed, reused = set(pl.compute_positions), set(pl.reused_positions)
    assert not computed & reused
    assert computed | reused == set(range(len(ids)))  # every position exactly once
    assert list(pl.compute_positions) == sorted(computed)
    assert pl.compute_positions[-1] == len(ids) - 1
    assert reused <= set(range(len(pre), len(pre) + len(slots)))
    assert set(range(len(pre), len(pre) + 3)) <= computed  # first k
    assert pl.recomputed == 3 + blend.num_deviating(len(slots))
    assert pl.checked_layers == 2
    for b in (src_bt, bt):
        rig.blocks.decref(b)


def test_moved_segment_stays_close_to_full_recomputation(rig, enc) -> None:  # type: ignore[no-untyped-def]
    src_bt, slots, start = cached_segment(rig, enc, PREFIX_A)
    pre = enc(PREFIX_B)
    ids = pre + enc(DOC) + enc(QUESTION_2)
    ref_bt, ref = full(rig, ids)
    kls = []
    for blend in (BlendConfig(0, 0.0), BlendConfig(8, 0.3)):
        bt, _, got = reuse(rig, ids, len(pre), slots, start, blend)
        lp, lq = torch.log_softmax(ref[-1], -1), torch.log_softmax(got[-1], -1)
        kls.append(float((lp.exp() * (lp - lq)).sum()))
        assert int(got[-1].argmax()) == int(ref[-1].argmax())
        rig.blocks.decref(bt)
    # an approximation, not a recomputation in disguise: the logits differ, but not by much
    assert 1e-6 < kls[0] < 0.2 and kls[1] < kls[0]
    for b in (src_bt, ref_bt):
        rig.blocks.decref(b)


def test_no_repetition_collapse_after_a_move(rig, enc, tokenizer) -> None:  # type: ignore[no-untyped-def]
    """The "Beijing Beijing Beijing" guard: a segment moved behind a longer prefix must keep
    contiguous positions, and its continuation must read like full recomputation's."""
    src_bt, slots, start = cached_segment(rig, enc, PREFIX_A)
    pre = enc(PREFIX_B)
    ids = pre + enc(DOC) + enc(QUESTION_1)
    assert len(pre) != start
    ref_bt, ref = full(rig, ids)
    ref_bt, ref_out = greedy(rig, ref_bt, ids, ref[-1], 16)
    bt, pl, got = reuse(rig, ids, len(pre), slots, start, BlendConfig(4, 0.0))
    bt, out = greedy(rig, bt, ids, got[-1], 16)
    assert sorted([*pl.compute_positions, *pl.reused_positions]) == list(range(len(ids)))
    text = tokenizer.decode(out)
    assert "Beijing" in tokenizer.decode(ref_out) and "Beijing" in text
    assert text.count("Beijing") <= max(1, tokenizer.decode(ref_out).count("Beijing"))
    assert not any(out[i] == out[i + 1] == out[i + 2] for i in range(len(out) - 2))
    assert out[:8] == ref_out[:8]
    # control: the same segment with keys left 40 positions off derails the answer, so the
    # checks above do catch misaligned positions
    bad_bt, _, bad = reuse(rig, ids, len(pre), slots, start - 40, BlendConfig(0, 0.0))
    bad_bt, bad_out = greedy(rig, bad_bt, ids, bad[-1], 16)
    assert bad_out[:8] != ref_out[:8]
    for b in (src_bt, ref_bt, bt, bad_bt):
        rig.blocks.decref(b)


def test_fresh_lower_layers_are_recomputed_and_all_fresh_is_exact(rig, enc) -> None:  # type: ignore[no-untyped-def]
    """``full_layers``: reused tokens read cached K/V only above the fresh layers. The fresh
    layers' K/V equal full recomputation's; with every layer fresh the logits do too."""
    src_bt, slots, start = cached_segment(rig, enc, PREFIX_A)
    pre = enc(PREFIX_B)
    ids = pre + enc(DOC) + enc(QUESTION_2)
    ref_bt, ref = full(rig, ids)
    pool, layers = rig.runner.kv_pool, rig.runner.model.config.num_layers
    bt, pl, _ = reuse(rig, ids, len(pre), slots, start, BlendConfig(first_k=4, full_layers=3))
    assert pl.checked_layers == 3 and pl.recomputed == 4
    reused = list(pl.reused_positions)
    got_k = pool.k[:, rig.runner.slots(bt, reused)]
    ref_k = pool.k[:, rig.runner.slots(ref_bt, reused)]
    assert (got_k[:3] - ref_k[:3]).abs().max().item() < 1e-3  # fresh below
    assert (got_k[3:] - ref_k[3:]).abs().max().item() > 1e-2  # cached (moved context) above
    rig.blocks.decref(bt)
    bt, pl, got = reuse(rig, ids, len(pre), slots, start, BlendConfig(0, full_layers=layers))
    assert len(pl.reused_positions) > 0.9 * len(slots)
    assert (got[-1] - ref[-1]).abs().max().item() < 1e-3
    for b in (src_bt, ref_bt, bt):
        rig.blocks.decref(b)


def test_query_aware_recompute_picks_what_the_question_reads(rig, enc) -> None:  # type: ignore[no-untyped-def]
    """``query_ratio``: the share q of reused tokens the question attends to most is recomputed;
    drafted positions before the first pick keep final K/V (full recomputation's), later ones
    are recomputed; the moved segment's logits move towards full recomputation's."""
    src_bt, slots, start = cached_segment(rig, enc, PREFIX_A)
    pre = enc(PREFIX_B)
    ids = pre + enc(DOC) + enc(QUESTION_1)
    ref_bt, ref = full(rig, ids)
    seg = set(range(len(pre), len(pre) + len(slots)))
    bt, pl, got = reuse(rig, ids, len(pre), slots, start, BlendConfig(4, query_ratio=0.25))
    computed, reused = set(pl.compute_positions), set(pl.reused_positions)
    picked = seg - reused - set(range(len(pre), len(pre) + 4))
    assert len(picked) == round(0.25 * (len(slots) - 4)) and picked <= computed
    assert not computed & reused and pl.compute_positions[-1] == len(ids) - 1
    assert pl.recomputed == 4 + len(picked)
    assert pl.drafted == len(ids) - (len(slots) - 4)  # everything but the reused tokens
    kept = set(range(len(ids))) - computed - reused
    assert kept == set(range(min(picked))) - reused and len(kept) >= len(pre) + 4
    pool = rig.runner.kv_pool
    kept_k = pool.k[:, rig.runner.slots(bt, sorted(kept))]
    assert (kept_k - pool.k[:, rig.runner.slots(ref_bt, sorted(kept))]).abs().max() < 1e-3
    base_bt, _, base = reuse(rig, ids, len(pre), slots, start, BlendConfig(4))

    def kl(logits: torch.Tensor) -> float:
        lp, lq = torch.log_softmax(ref[-1], -1), torch.log_softmax(logits[-1], -1)
        return float((lp.exp() * (lp - lq)).sum())

    assert kl(got) < kl(base)
    # every reused token picked: the recomputation is complete and the logits exact
    all_bt, every, exact = reuse(rig, ids, len(pre), slots, start, BlendConfig(4, query_ratio=1))
    assert not every.reused_positions
    assert (exact[-1] - ref[-1]).abs().max().item() < 1e-3
    for b in (src_bt, ref_bt, bt, base_bt, all_bt):
        rig.blocks.decref(b)


def test_query_patch_recomputes_the_picks_and_the_question_rows_only(rig, enc) -> None:  # type: ignore[no-untyped-def]
    """``query_patch``: the same picks as ``query_ratio`` alone (the same draft), but only they
    and the last ``QUERY_ROWS`` drafted positions after the first pick are computed again; the
    logits still move towards full recomputation's, at less work than the plain variant."""
    from suffixmem.engine.reuse.placement import QUERY_ROWS

    src_bt, slots, start = cached_segment(rig, enc, PREFIX_A)
    pre = enc(PREFIX_B)
    long_question = ("\nWhich Olympics did the city host, in which year was that, and what "
                     "else is the city known for among visitors and students of history and "
                     "politics?" + QUESTION_2.split("?", 1)[1])
    ids = pre + enc(DOC) + enc(long_question)
    assert len(enc(long_question)) > QUERY_ROWS
    ref_bt, ref = full(rig, ids)
    first_k = set(range(len(pre), len(pre) + 4))
    plain = BlendConfig(4, query_ratio=0.25)
    patch = BlendConfig(4, query_ratio=0.25, query_patch=True)
    assert patch.label() == "k4-p0.25" and plain.label() == "k4-q0.25"
    bt_q, pl_q, _ = reuse(rig, ids, len(pre), slots, start, plain)
    bt, pl, got = reuse(rig, ids, len(pre), slots, start, patch)
    assert pl.reused_positions == pl_q.reused_positions and pl.drafted == pl_q.drafted
    seg = set(range(len(pre), len(pre) + len(slots)))
    picked = seg - set(pl.reused_positions) - first_k
    drafted = [p for p in range(len(ids)) if p not in seg or p in first_k]
    assert len(drafted) == pl.drafted
    tail = {p for p in drafted[-QUERY_ROWS:] if p > min(picked)}
    assert set(pl.compute_positions) == picked | tail
    assert pl.compute_positions[-1] == len(ids) - 1
    assert len(pl.compute_positions) < len(pl_q.compute_positions)
    base_bt, _, base = reuse(rig, ids, len(pre), slots, start, BlendConfig(4))

    def kl(logits: torch.Tensor) -> float:
        lp, lq = torch.log_softmax(ref[-1], -1), torch.log_softmax(logits[-1], -1)
        return float((lp.exp() * (lp - lq)).sum())

    assert kl(got) < kl(base)
    for b in (src_bt, ref_bt, bt_q, bt, base_bt):
        rig.blocks.decref(b)


def test_attention_contribution_weighs_attention_by_value_norm() -> None:
    """Query-aware selection ranks by what a key adds to the outputs (softmax attention times
    its value's norm), causally: equal attention, larger value, larger share; future keys 0."""
    from suffixmem.engine.reuse.placement import _attention_mass

    q = torch.zeros(1, 2, 4)  # two query heads sharing one KV head; zero scores: uniform
    k = torch.randn(4, 1, 4)
    v = torch.zeros(4, 1, 4)
    v[:, 0, 0] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    got = _attention_mass(q, k, v, torch.tensor([2]), scale=0.125)
    assert torch.allclose(got, torch.tensor([2 / 3, 4 / 3, 2.0, 0.0]))
