"""Decode over ``PagedMirror`` (vLLM's CPU attention kernel, bf16) against the SDPA sources on
the same pool contents: a tiny random Llama with the default model's head size (64), built in
the test. Prefills stay at <= 32 tokens, where both runners run the same SDPA path, so the two
pools start equal and only decode differs: attention, and the layers' elementwise work through
vLLM's fused kernels (``fused.FusedOps``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from suffixmem.engine.torch import paged_mirror
from suffixmem.engine.torch.kv_pool import KVPool
from suffixmem.engine.torch.llama import Llama
from suffixmem.engine.torch.model_runner import ModelRunner, SeqInput
from suffixmem.engine.torch.vllm_attention import VllmAttention
from tests.engine.torch.conftest import state_of

pytestmark = pytest.mark.skipif(VllmAttention.load(4, 2, 64) is None,
                                reason="vLLM's CPU kernels are not installed")
BS = 16
# bf16 logits of magnitude ~3 (one unit in the last place: 0.016), after differences compound
# over steps; one context token dropped instead gives a mean of 0.8. vLLM's AVX2 build (a CPU
# without AVX-512 BF16, where bf16 is emulated) rounds more: up to 0.48 / 0.088 over 20 steps
NATIVE_BF16 = torch.cpu._is_avx512_bf16_supported()
MAX_DIFF = 0.25 if NATIVE_BF16 else 0.75
MEAN_DIFF = 0.05 if NATIVE_BF16 else 0.15


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    d = (a - b).abs()
    return d.max().item() <= MAX_DIFF and d.mean().item() <= MEAN_DIFF


@pytest.fixture(scope="module")
def model(make_tiny: Any) -> Llama:
    _, ours = make_tiny(seed=3, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=64, num_hidden_layers=3)
    model = Llama.from_state_dict(ours.config, state_of(ours), torch.bfloat16)
    assert model.vllm_attention is not None
    return model


def runner(model: Llama, kernel: bool, mirror_bytes: int | None = 1 << 30) -> ModelRunner:
    c = model.config
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BS, 64, model.dtype)
    return ModelRunner(model, pool, 1000, mirror_bytes=mirror_bytes, vllm_attention=kernel)


def test_ragged_batch_follows_changes_and_matches_sdpa(model: Llama, monkeypatch: Any) -> None:
    """Three sequences of different lengths on scattered blocks decode as a batch; one leaves,
    another joins after a prefill, contexts outgrow the copy: every step's logits agree with the
    padded SDPA mirror's, the new tokens' layer-0 K/V land in the pool exactly, and the copy is
    rebuilt exactly when it must be."""
    monkeypatch.setattr(paged_mirror, "HEADROOM", 1)
    gen = torch.Generator().manual_seed(0)
    seqs = {x: torch.randint(0, 256, (120,), generator=gen).tolist() for x in "abc"}
    blocks = torch.randperm(64, generator=gen).tolist()
    tables = {"a": blocks[:8], "b": blocks[8:16], "c": blocks[16:24]}
    fast, ref = runner(model, True), runner(model, False)
    length = {"a": 7, "b": 30, "c": 12}
    for r in (fast, ref):
        for x in "ab":
            n = length[x]
            r.forward([SeqInput(seqs[x][:n], range(n), tables[x], n)])
    paged = fast.decoder.paged
    assert paged is not None

    def step(names: str) -> None:
        outs = []
        for r in (fast, ref):
            outs.append(r.forward([SeqInput([seqs[x][length[x]]], [length[x]], tables[x],
                                            length[x] + 1) for x in names]).logits)
        assert fast.decoder.last_source == "paged"
        assert ref.decoder.last_source in ("mirror", "view")  # padded SDPA, or one sequence
        assert close(outs[0], outs[1])  # (argmax may differ: a random model has near-ties)
        slots = torch.tensor([fast.slots(tables[x], [length[x]])[0] for x in names])
        # every layer's new K/V land in the pool as the step computed them; the fused
        # kernels round differently from the primitives, so layer 0's are close to SDPA's
        assert torch.equal(fast.kv_pool.k[:, slots], paged.new_k)
        assert torch.equal(fast.kv_pool.v[:, slots], paged.new_v)
        for a, b in ((fast.kv_pool.k, ref.kv_pool.k), (fast.kv_pool.v, ref.kv_pool.v)):
            assert close(a[0, slots].float(), b[0, slots].float())
        for x in names:
            length[x] += 1

    step("ab")  # b's context: 31 positions; the copy holds 32
    assert paged.rebuilds == 1 and paged.cap == 32
    step("ab")
    assert paged.rebuilds == 1  # kept: the context grew within the copy
    step("ab")
    assert paged.rebuilds == 2 and paged.cap == 64  # outgrown: copied again, larger
    step("a")  # b left the batch
    assert paged.rebuilds == 3
    for r in (fast, ref):  # c joins after a prefill, which drops the copy
        r.forward([SeqInput(seqs["c"][:12], range(12), tables["c"], 12)])
    assert paged.nbytes == 0
    for _ in range(20):
        step("acb")
    assert paged.rebuilds == 4


def test_pool_writes_between_steps_reach_the_next_step(model: Llama) -> None:
    """K/V written into a sequence's blocks from outside (segment reuse's ``write_all``) are
    seen by the next step: the copy is rebuilt from the pool."""
    c = model.config
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (40,), generator=gen).tolist()
    table = [5, 9, 2]
    fast, ref = runner(model, True), runner(model, False)
    k = torch.randn(c.num_layers, 3, c.num_kv_heads, c.head_dim, generator=gen)
    v = torch.randn(c.num_layers, 3, c.num_kv_heads, c.head_dim, generator=gen)
    outs = []
    for r in (fast, ref):
        r.forward([SeqInput(ids[:20], range(20), table, 20)])
        for p in range(20, 24):
            r.forward([SeqInput([ids[p]], [p], table, p + 1)])
        r.kv_pool.write_all(torch.tensor(r.slots(table, [2, 3, 4])), k, v)
        outs.append(torch.cat([r.forward([SeqInput([ids[p]], [p], table, p + 1)]).logits
                               for p in range(24, 28)]))
    assert fast.decoder.paged is not None and fast.decoder.paged.rebuilds == 2
    assert close(outs[0], outs[1])


def test_over_its_budget_or_in_exact_mode_the_padded_sources_serve(model: Llama) -> None:
    c = model.config
    per_position = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 2
    small = runner(model, True, mirror_bytes=per_position * 40)  # < one 64-position copy
    ids = list(range(1, 40))
    small.forward([SeqInput(ids[:20], range(20), [3, 4], 20)])
    small.forward([SeqInput([ids[20]], [20], [3, 4], 21)])
    assert small.decoder.last_source == "view"  # one sequence on consecutive blocks
    assert small.decoder.paged is not None and small.decoder.paged.nbytes == 0
    exact = ModelRunner(model, KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BS, 8,
                                      model.dtype), 100, exact_decode=True)
    assert exact.decoder.paged is None and not exact.vllm_attention


def test_fused_kernels_serve_the_paged_steps_close_to_the_primitives(model: Llama,
                                                                    monkeypatch: Any) -> None:
    """The paged steps run the layers' elementwise work through vLLM's fused kernels; the same
    steps through the primitives (``fused`` off) give logits and K/V within bf16 rounding.
    Exact decode and fp32 models never get them, and a build that disagrees with the probe is
    not used."""
    from suffixmem.engine.torch import fused

    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 256, (60,), generator=gen).tolist() for _ in range(2)]
    tables = [[7, 3, 11, 1], [2, 9, 5, 14]]  # scattered: neither is a view of the pool
    pairs = list(zip(seqs, tables, strict=True))
    fast, plain = runner(model, True), runner(model, True)
    assert isinstance(fast.decoder.fused, fused.FusedOps)
    plain.decoder.fused = None
    for r in (fast, plain):
        r.forward([SeqInput(s[:20], range(20), t, 20) for s, t in pairs])
    for p in range(20, 40):
        outs = [r.forward([SeqInput([s[p]], [p], t, p + 1) for s, t in pairs])
                .logits for r in (fast, plain)]
        assert fast.decoder.last_source == plain.decoder.last_source == "paged"
        assert close(outs[0], outs[1])
    slots = torch.tensor(fast.slots(tables[0], list(range(20, 40))))
    for a, b in ((fast.kv_pool.k, plain.kv_pool.k), (fast.kv_pool.v, plain.kv_pool.v)):
        assert close(a[:, slots].float(), b[:, slots].float())
    c = model.config
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BS, 8, model.dtype)
    assert ModelRunner(model, pool, 100, exact_decode=True).decoder.fused is None
    assert fused.FusedOps.load(Llama.from_state_dict(c, state_of(model), torch.float32),
                               fast.rope) is None
    monkeypatch.setattr(fused, "PROBE_TOLERANCE", 0.0)  # the probe measures a real difference
    assert fused.FusedOps.load(model, fast.rope) is None


def test_a_position_past_the_rope_table_is_an_error_not_a_read_past_it(model: Llama) -> None:
    """The fused RoPE kernel does not bound-check its table: a decode step past the runner's
    ``max_positions`` raises ``IndexError`` as the primitives' table lookup does."""
    c = model.config
    for fused_on in (True, False):
        r = ModelRunner(model, KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BS, 8,
                                      model.dtype), 40)
        if not fused_on:
            r.decoder.fused = None
        r.forward([SeqInput(list(range(1, 21)), range(20), [0, 1, 2], 20)])
        with pytest.raises(IndexError):
            r.forward([SeqInput([5], [44], [0, 1, 2], 45)])
