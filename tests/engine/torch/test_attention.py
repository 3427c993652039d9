"""``attention.one_query``: the block-diagonal products against SDPA (the reference), with and
without a mask, in fp32 (to rounding) and bf16 (to bf16's precision), on K/V laid out as the
pool lays them out (rows of ``[KV, D]``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from suffixmem.engine.torch import attention


def pool_views(b: int, kvh: int, t: int, d: int, dtype: torch.dtype,
               g: torch.Generator) -> torch.Tensor:
    """``[B, KV, T, D]`` views of ``[B, T, KV, D]`` rows, as the decode step's K/V sources."""
    return torch.randn(b, t, kvh, d, generator=g).to(dtype).transpose(1, 2)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("masked", [False, True])
def test_block_diagonal_products_equal_sdpa(monkeypatch: Any, dtype: torch.dtype, tol: float,
                                            masked: bool) -> None:
    g = torch.Generator().manual_seed(0)
    b, kvh, r, t, d = 3, 3, 3, 300, 64
    q = (2 * torch.randn(b, kvh, r, d, generator=g)).to(dtype)  # peaked: far from uniform
    k, v = pool_views(b, kvh, t, d, dtype, g), pool_views(b, kvh, t, d, dtype, g)
    mask = None
    if masked:  # uneven lengths: sequence i sees its first t - 50 i positions
        lens = torch.tensor([t - 50 * i for i in range(b)])
        mask = (torch.arange(t)[None, :] < lens[:, None])[:, None, None, :]
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                         attn_mask=mask).reshape(b, -1)
    monkeypatch.setattr(attention, "LONG_CONTEXT", 10**9)
    short = attention.one_query(q, k, v, mask)
    long = attention.block_diagonal(q, k, v, mask)
    assert long.dtype == dtype and long.shape == (b, kvh * r * d)
    assert (long.float() - ref).abs().max().item() <= tol
    assert (short.float() - ref).abs().max().item() <= tol
    if masked:  # what a shorter sequence may not see changes nothing
        k2 = k.clone()
        k2[2, :, t - 100:] = 100.0
        assert torch.equal(attention.block_diagonal(q, k2, v, mask)[2], long[2])


def test_the_switch_is_the_context_length_of_one_sequence(monkeypatch: Any) -> None:
    """One sequence: below ``LONG_CONTEXT`` the packed SDPA call, from it on the products
    (different last bits in bf16, so the path taken is visible); a batch: SDPA at any length."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 3, 3, 64, generator=g).to(torch.bfloat16)
    k = pool_views(1, 3, 64, 64, torch.bfloat16, g)
    v = pool_views(1, 3, 64, 64, torch.bfloat16, g)
    sdpa = F.scaled_dot_product_attention(q, k, v).reshape(1, -1)
    monkeypatch.setattr(attention, "LONG_CONTEXT", 65)
    assert torch.equal(attention.one_query(q, k, v), sdpa)
    monkeypatch.setattr(attention, "LONG_CONTEXT", 64)
    assert torch.equal(attention.one_query(q, k, v), attention.block_diagonal(q, k, v))
    assert not torch.equal(attention.one_query(q, k, v), sdpa)
    qb, kb, vb = (torch.cat([x, x]) for x in (q, k, v))
    assert torch.equal(attention.one_query(qb, kb, vb),
                       F.scaled_dot_product_attention(qb, kb, vb).reshape(2, -1))


def test_real_model_long_context_decode_agrees_with_fp32_on_both_paths(
        monkeypatch: Any, model_path: Any, tokenizer: Any, real_fp32: Any) -> None:
    """The default model in the dtype it serves (``auto``: bf16 where bf16 is native; fp32 on
    a CPU without AVX-512 BF16, where a bf16 run is emulated and ~8x slower), 64 teacher-forced
    decode steps after ~1,700 tokens of real dialogue (beyond the switch): the block-diagonal
    path picks the fp32 model's top token as often as the packed SDPA path does (within 2 of
    64), and their logits stay close."""
    from suffixmem.config import resolve_dtype
    from suffixmem.conversation.topic_corpus import corpus_texts
    from suffixmem.engine.torch.kv_pool import KVPool, torch_dtype
    from suffixmem.engine.torch.llama import Llama
    from suffixmem.engine.torch.model_runner import ModelRunner, SeqInput

    text = " ".join(corpus_texts(["english"]))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:1764]
    start = len(ids) - 64
    assert start > attention.LONG_CONTEXT
    model = Llama.from_pretrained(model_path, torch_dtype(resolve_dtype("auto")))
    c = model.config
    with torch.inference_mode():
        ref = real_fp32.forward(torch.tensor(ids))[start:].argmax(-1)
    logits = {}
    for name, switch in (("packed_sdpa", 10**9), ("block_diagonal", 0)):
        monkeypatch.setattr(attention, "LONG_CONTEXT", switch)
        pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, 32, 56, model.dtype)
        runner = ModelRunner(model, pool, 2048)
        table = list(range(56))
        runner.forward([SeqInput(ids[:start], list(range(start)), table, start)])
        logits[name] = torch.cat([runner.forward([SeqInput([ids[p]], [p], table, p + 1)]).logits
                                  for p in range(start, len(ids))])
    hits = {n: int((x.argmax(-1) == ref).sum()) for n, x in logits.items()}
    assert hits["packed_sdpa"] >= 56  # the reference path itself tracks fp32
    assert hits["block_diagonal"] >= hits["packed_sdpa"] - 2
    kl = F.kl_div(logits["block_diagonal"].log_softmax(-1), logits["packed_sdpa"].log_softmax(-1),
                  log_target=True, reduction="batchmean")
    assert kl.item() < 0.01
