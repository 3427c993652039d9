"""vLLM's CPU attention kernel as the torch engine's prefill attention: its output against fp32
SDPA, the shapes it takes and refuses, and the engine with and without it on the real model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from suffixmem.engine.torch.vllm_attention import VllmAttention, _reference

pytestmark = pytest.mark.skipif(VllmAttention.load(9, 3, 64) is None,
                                reason="vLLM's CPU kernels are not installed")


@pytest.mark.parametrize(("context", "queries"), [
    (1564, 1564),  # a cold prefill of the default model's benchmark prompt
    (700, 200),  # a chunk: the last 200 of 700, the last block part-filled
    (2000, 40),  # a warm turn's new tokens after a long cached prefix
    (33, 33),  # one token into a second block
])
def test_matches_fp32_sdpa_on_the_default_models_shape(context: int, queries: int) -> None:
    kernel = VllmAttention.load(9, 3, 64)
    assert kernel is not None
    gen = torch.Generator().manual_seed(context)
    q = torch.randn(queries, 9, 64, generator=gen).to(torch.bfloat16)
    k = torch.randn(context, 3, 64, generator=gen).to(torch.bfloat16)
    v = torch.randn(context, 3, 64, generator=gen).to(torch.bfloat16)
    out = kernel.prefill(q, k, v, 0.125)
    assert out.shape == (queries, 9 * 64) and out.dtype == torch.bfloat16
    # bf16 outputs of magnitude <= ~1: one unit in the last place is 2**-7
    assert (out.float() - _reference(q, k, v, 0.125)).abs().max().item() <= 2 ** -6
    assert torch.equal(kernel.prefill(q, k, v, 0.125), out)  # deterministic


@pytest.mark.parametrize("seed", range(4))
def test_scattered_queries_match_fp32_sdpa(seed: int) -> None:
    """Queries at ascending but scattered positions (the tokens recomputed between reused
    spans): one kernel run per stretch, each seeing exactly the keys up to its position."""
    kernel = VllmAttention.load(9, 3, 64)
    assert kernel is not None
    gen = torch.Generator().manual_seed(seed)
    context = 300 + 250 * seed
    picked = torch.rand(context, generator=gen) < 0.2  # single tokens and short stretches
    picked[100:164] = True  # a stretch across block boundaries
    picked[-1] = seed % 2 == 0  # ending at the last position, or before it
    q_pos = torch.nonzero(picked).flatten()
    q = torch.randn(len(q_pos), 9, 64, generator=gen).to(torch.bfloat16)
    k = torch.randn(context, 3, 64, generator=gen).to(torch.bfloat16)
    v = torch.randn(context, 3, 64, generator=gen).to(torch.bfloat16)
    out = kernel.prefill(q, k, v, 0.125, q_pos)
    assert out.shape == (len(q_pos), 9 * 64)
    assert (out.float() - _reference(q, k, v, 0.125, q_pos)).abs().max().item() <= 2 ** -6
    # contiguous positions at the end: the same as the default (last Nq) call, bit for bit
    tail = torch.arange(context - 50, context)
    assert torch.equal(kernel.prefill(q[:50], k, v, 0.125, tail),
                       kernel.prefill(q[:50], k, v, 0.125))


def test_a_head_size_the_kernel_lacks_leaves_sdpa() -> None:
    # head_dim 16 (the tiny test models'): the probe fails, the model keeps SDPA
    assert VllmAttention.load(4, 2, 16) is None


@pytest.mark.skipif(not torch.cpu._is_avx512_bf16_supported(),
                    reason="the AVX2 build tiles keys otherwise: at 700 keys a 2-token call "
                    "already sums in another order (docs/torch-engine.md)")
def test_with_the_kernel_a_prefix_hit_does_not_change_exact_logits(model_path: Any) -> None:
    """Batch invariance on a 700-token prompt: with the kernel a warm turn's logits and K/V
    equal a cold prefill's bit for bit, for a few new tokens (<= SMALL_QUERY, once a separate
    batched-matmul path that rounded differently: a warm 20-token turn diverged from the cold
    run after 17 tokens) and for many. (Not everywhere: the kernel's key tiling depends on the
    query count, docs/torch-engine.md.)"""
    from suffixmem.engine.torch.kv_pool import KVPool
    from suffixmem.engine.torch.llama import SMALL_QUERY, Llama
    from suffixmem.engine.torch.model_runner import ModelRunner, SeqInput

    model = Llama.from_pretrained(model_path, torch.bfloat16)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(100, 40000, (700,), generator=gen).tolist()
    table = list(range(48))
    # (one new token is a decode step: another path, see docs/torch-engine.md's limits)
    for cached in (700 - 2, 700 - 5, 700 - SMALL_QUERY, 700 - SMALL_QUERY - 1, 350):
        cold_pool = KVPool(30, 3, 64, 16, 48, torch.bfloat16)
        cold = ModelRunner(model, cold_pool, 768).forward(
            [SeqInput(ids, range(700), table, 700)]).logits[-1]
        pool = KVPool(30, 3, 64, 16, 48, torch.bfloat16)
        runner = ModelRunner(model, pool, 768)
        runner.forward([SeqInput(ids[:cached], range(cached), table, cached,
                                 want_logits=False)])
        warm = runner.forward([SeqInput(ids[cached:], range(cached, 700), table,
                                        700)]).logits[-1]
        assert torch.equal(warm, cold), f"{700 - cached} new tokens"
        assert torch.equal(pool.k[:, :700], cold_pool.k[:, :700])  # the same K/V stored


@pytest.mark.slow
def test_runner_prefill_with_the_kernel_matches_sdpa_cold_and_warm(model_path: Any) -> None:
    """The real model in bf16 through ``ModelRunner``: the last-token logits of a cold prefill,
    of a warm turn (half the prompt cached, the rest computed over it) and of stretches
    recomputed between cached spans, with the kernel, agree with SDPA's to bf16 rounding, with
    the same argmax up to a near-tie."""
    from suffixmem.engine.torch.kv_pool import KVPool
    from suffixmem.engine.torch.llama import Llama
    from suffixmem.engine.torch.model_runner import ModelRunner, SeqInput

    model = Llama.from_pretrained(model_path, torch.bfloat16)
    assert model.vllm_attention is not None
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(100, 40000, (600,), generator=gen).tolist()
    table = list(range(40))
    logits = {}
    for kernel in (True, False):
        pool = KVPool(30, 3, 64, 16, 40, torch.bfloat16)
        runner = ModelRunner(model, pool, 640, vllm_attention=kernel)
        assert runner.vllm_attention is kernel
        cold = runner.forward([SeqInput(ids, range(600), table, 600)]).logits[-1]
        runner.forward([SeqInput(ids[:300], range(300), table, 300, want_logits=False)])
        warm = runner.forward([SeqInput(ids[300:], range(300, 600), table, 600)]).logits[-1]
        # a prefill after segment reuse: stretches recomputed between reused (cached) spans
        picked = [*range(100, 140), *range(200, 203), *range(350, 420), *range(560, 600)]
        spans = runner.forward([SeqInput([ids[p] for p in picked], picked, table,
                                         600)]).logits[-1]
        logits[kernel] = (cold, warm, spans)
    for a, b in zip(logits[True], logits[False], strict=True):
        assert (a - b).abs().max().item() <= 0.5  # bf16 logits of magnitude ~20
        # the same argmax up to a near-tie (random ids: flat distributions; the AVX2 build
        # picked SDPA's runner-up, 0.125 below its top)
        assert b[int(a.argmax())].item() >= b.max().item() - 0.25
    assert (logits[True][0] - logits[True][1]).abs().max().item() <= 0.5


@pytest.mark.slow
def test_engine_option_and_stats() -> None:
    """(bf16 named: the kernel is bf16-only, and ``auto`` is fp32 on a CPU without AVX-512
    BF16.)"""
    from suffixmem.engine import create_engine
    from suffixmem.engine.protocol import Message, Request, SamplingParams
    from suffixmem.errors import ConfigError

    with pytest.raises(ConfigError, match="attention"):
        create_engine("torch", max_model_len=512, kv_cache_gib=0.05,
                      extra={"attention": "flash"})
    answers = {}
    for choice in ("vllm", "sdpa"):
        engine = create_engine("torch", max_model_len=512, kv_cache_gib=0.05,
                               dtype="bfloat16", extra={"attention": choice})
        try:
            assert engine.stats().extra["attention"] == choice
            assert engine.stats().extra["dtype"] == "bfloat16"
            answers[choice] = engine.generate(Request(
                "s", messages=[Message("user", "What is the capital of Japan?")],
                sampling=SamplingParams(max_tokens=8))).text
        finally:
            engine.close()
    assert "Tokyo" in answers["vllm"] and "Tokyo" in answers["sdpa"]
    exact = create_engine("torch", max_model_len=512, kv_cache_gib=0.05, dtype="bfloat16",
                          extra={"exact_decode": True})
    try:  # transformers-exact mode keeps SDPA
        assert exact.stats().extra["attention"] == "sdpa"
    finally:
        exact.close()
