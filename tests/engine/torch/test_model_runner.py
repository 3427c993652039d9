"""The paged model runner against the dense forward (tiny random Llama, fp32, exact)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from suffixmem.engine.torch.kv_pool import KVPool, torch_dtype
from suffixmem.engine.torch.llama import Llama
from suffixmem.engine.torch.model_runner import ModelRunner, SeqInput, measure_decode
from suffixmem.errors import ConfigError
from tests.engine.torch.conftest import state_of

BS = 4
TOL = 1e-5


def make_runner(model: Llama, num_blocks: int = 64, exact_decode: bool = False) -> ModelRunner:
    c = model.config
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BS, num_blocks, torch.float32)
    return ModelRunner(model, pool, 512, exact_decode=exact_decode)


def scattered_table(n_blocks: int, seed: int) -> list[int]:
    """Blocks in a shuffled order: paging must not depend on contiguity."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(64, generator=g)[:n_blocks].tolist()


def test_prefill_in_chunks_matches_dense(tiny: Any) -> None:
    _, model = tiny
    ids = torch.randint(0, 256, (45,)).tolist()
    dense = model.forward(torch.tensor(ids))
    runner = make_runner(model)
    table = scattered_table(12, 0)
    at = 0
    for end in (13, 14, 31, 45):  # uneven chunks, across block boundaries
        out = runner.forward([SeqInput(ids[at:end], list(range(at, end)), table, end)])
        assert (out.logits[0] - dense[end - 1]).abs().max().item() <= TOL
        at = end


def test_cached_continuation_equals_uncached_prefill(tiny: Any) -> None:
    _, model = tiny
    ids = torch.randint(0, 256, (61,)).tolist()
    runner = make_runner(model)
    table = scattered_table(16, 1)
    runner.forward([SeqInput(ids[:37], list(range(37)), table, 37)])
    cont = runner.forward([SeqInput(ids[37:], list(range(37, 61)), table, 61)]).logits[0]
    fresh = make_runner(model)
    full = fresh.forward([SeqInput(ids, list(range(61)), scattered_table(16, 2), 61)]).logits[0]
    assert (cont - full).abs().max().item() <= TOL


@pytest.mark.parametrize("exact", [False, True])
def test_batched_decode_of_uneven_sequences(tiny: Any, exact: bool) -> None:
    _, model = tiny
    runner = make_runner(model, exact_decode=exact)
    lengths = [9, 30, 17]
    seqs = [torch.randint(0, 256, (n + 3,)).tolist() for n in lengths]
    tables = [list(range(i * 10, i * 10 + 10)) for i in range(3)]
    for s, n, t in zip(seqs, lengths, tables, strict=True):
        runner.forward([SeqInput(s[:n], list(range(n)), t, n)])
    for step in range(3):  # three decode steps, all three sequences in one batch each
        inputs = [SeqInput([s[n + step]], [n + step], t, n + step + 1)
                  for s, n, t in zip(seqs, lengths, tables, strict=True)]
        logits = runner.forward(inputs).logits
        assert logits.shape == (3, 256)
        for i, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
            dense = model.forward(torch.tensor(s[:n + step + 1]))[-1]
            assert (logits[i] - dense).abs().max().item() <= TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_sequence_decode_over_pool_view_equals_gathered(tiny: Any,
                                                               dtype: torch.dtype) -> None:
    """One sequence on consecutive blocks attends over a view of the pool, on scattered blocks
    over a gathered copy: the same logits bit for bit, and (fp32) the dense forward's."""
    _, model = tiny
    if dtype != torch.float32:  # bf16 weights: the oneDNN-packed linears are used
        model = Llama.from_state_dict(model.config, state_of(model), dtype)
    ids = torch.randint(0, 256, (30,)).tolist()
    runs = {}
    for name, table in (("view", list(range(5, 13))), ("gather", scattered_table(8, 3))):
        c = model.config
        pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BS, 64, dtype)
        runner = ModelRunner(model, pool, 512)
        runner.forward([SeqInput(ids[:17], list(range(17)), table, 17)])
        runs[name] = torch.cat([runner.forward([SeqInput([ids[p]], [p], table, p + 1)]).logits
                                for p in range(17, 30)])  # crosses block boundaries
    assert torch.equal(runs["view"], runs["gather"])
    if dtype == torch.float32:
        dense = model.forward(torch.tensor(ids))[17:30]
        assert (runs["view"] - dense).abs().max().item() <= TOL


def test_measure_decode_reports_against_the_limit(tiny: Any) -> None:
    _, model = tiny
    out = measure_decode(model, batch_sizes=(1, 4), context=20, steps=3, repeats=1,
                         mem_bytes_per_s=1e9)
    assert out["weights_bytes"] == model.weight_bytes
    assert out["bandwidth_limit_ms"] == pytest.approx(model.weight_bytes / 1e9 * 1e3)
    for b in (1, 4):
        ms = out[f"decode_ms_per_token_b{b}"]
        assert ms > 0
        assert out[f"decode_tokens_per_s_b{b}"] == pytest.approx(b * 1e3 / ms)
        assert out[f"ratio_b{b}"] == pytest.approx(ms / out["bandwidth_limit_ms"])
    assert measure_decode(model, batch_sizes=(1,), context=4, steps=1, repeats=1)["mem_gbps"] > 0
    with pytest.raises(ValueError, match="batch sizes"):
        measure_decode(model, batch_sizes=(0,))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        measure_decode(model, context=1000, steps=100)


def test_prefill_of_non_contiguous_positions(tiny: Any) -> None:
    """The reuse pattern: K/V of positions 8..27 copied in from elsewhere, only the rest
    computed; the result equals the dense forward (the copied K/V are exact here)."""
    _, model = tiny
    ids = torch.randint(0, 256, (40,)).tolist()
    runner = make_runner(model)
    donor = list(range(0, 10))
    runner.forward([SeqInput(ids, list(range(40)), donor, 40)])
    target = list(range(20, 30))
    reused = list(range(8, 28))
    k, v = runner.kv_pool.read(torch.tensor(runner.slots(donor, reused)))
    assert k.shape == (3, 20, 2, 16)
    runner.kv_pool.write_all(torch.tensor(runner.slots(target, reused)), k, v)
    pending = [p for p in range(40) if p not in reused]
    out = runner.forward([SeqInput([ids[p] for p in pending], pending, target, 40)],
                         entropy_layers=[0, 2])
    dense = model.forward(torch.tensor(ids), entropy_layers=[])
    assert (out.logits[0] - dense[-1]).abs().max().item() <= TOL
    assert set(out.entropy) == {0, 2} and out.entropy[0].shape == (len(pending),)


def test_two_sequences_prefill_together(tiny: Any) -> None:
    _, model = tiny
    a = torch.randint(0, 256, (23,)).tolist()
    b = torch.randint(0, 256, (11,)).tolist()
    runner = make_runner(model)
    out = runner.forward([SeqInput(a, list(range(23)), list(range(6)), 23),
                          SeqInput(b, list(range(11)), list(range(6, 9)), 11, want_logits=False),
                          SeqInput(a[:5], list(range(5)), list(range(9, 11)), 5)])
    assert out.logits.shape == (2, 256)
    assert (out.logits[0] - model.forward(torch.tensor(a))[-1]).abs().max().item() <= TOL
    assert (out.logits[1] - model.forward(torch.tensor(a[:5]))[-1]).abs().max().item() <= TOL


def test_runner_rejects_inconsistent_inputs(tiny: Any) -> None:
    _, model = tiny
    runner = make_runner(model)
    with pytest.raises(ValueError, match="beyond the context"):
        runner.forward([SeqInput([1, 2], [0, 5], [0, 1], 3)])
    with pytest.raises(ValueError, match="block table"):
        runner.forward([SeqInput([1], [8], [0], 9)])


def test_kv_pool_budget_and_dtypes() -> None:
    per_block = KVPool.bytes_per_block(30, 3, 64, 16, torch.bfloat16)
    assert per_block == 2 * 30 * 16 * 3 * 64 * 2
    pool = KVPool.from_budget(per_block * 5 + 7, 30, 3, 64, 16, torch.bfloat16)
    assert pool.num_blocks == 5 and pool.capacity_bytes == per_block * 5
    assert pool.k.shape == (30, 80, 3, 64) and pool.k.dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="holds no block"):
        KVPool.from_budget(per_block - 1, 30, 3, 64, 16)
    assert torch_dtype("float32") is torch.float32
    with pytest.raises(ConfigError, match="unknown dtype 'int4'"):
        torch_dtype("int4")
