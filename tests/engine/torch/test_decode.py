"""The decode step (``decode.Decoder``) against the layer primitives and the dense forward, and
its three sources of context K/V (pool view, mirror, gather) against each other, bit for bit.

Tiny random Llama built in the test: fp32 for exactness against the dense forward, bf16 for the
prepacked oneDNN products and bit-identity between paths.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from suffixmem.engine.torch import attention, decode
from suffixmem.engine.torch.kv_pool import KVPool
from suffixmem.engine.torch.linear import PackedLinears
from suffixmem.engine.torch.llama import Llama
from suffixmem.engine.torch.model_runner import ModelRunner, SeqInput
from suffixmem.engine.torch.prefill import chunk_prefill
from tests.engine.torch.conftest import state_of

BS = 4
# fp32 logits of magnitude ~3: a few units in the last place (AVX2's and AVX-512's kernels
# sum in other orders: 1.02e-5 on an AVX2 host)
TOL = 3e-5


@pytest.fixture(params=["packed_sdpa", "block_diagonal"])
def attention_path(request: Any, monkeypatch: Any) -> str:
    """Run a test over both ways of ``attention.one_query`` (the switch set below and above
    the tests' short contexts)."""
    monkeypatch.setattr(attention, "LONG_CONTEXT", 10**9 if request.param == "packed_sdpa" else 0)
    return str(request.param)


def runner_for(model: Llama, mirror_bytes: int | None = 1 << 30,
               exact: bool = False) -> ModelRunner:
    c = model.config
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BS, 96, model.dtype)
    return ModelRunner(model, pool, 512, exact_decode=exact, mirror_bytes=mirror_bytes)


def bf16(model: Llama) -> Llama:
    return Llama.from_state_dict(model.config, state_of(model), torch.bfloat16)


def scattered(n_blocks: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(96, generator=g)[:n_blocks].tolist()


def decode_run(runner: ModelRunner, ids: list[int], table: list[int], start: int,
               end: int) -> torch.Tensor:
    """Prefill ``ids[:start]``, then decode positions ``start .. end - 1`` one at a time;
    the logits of every decode step ``[end - start, V]``."""
    runner.forward([SeqInput(ids[:start], list(range(start)), table, start)])
    return torch.cat([runner.forward([SeqInput([ids[p]], [p], table, p + 1)]).logits
                      for p in range(start, end)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_view_mirror_and_gather_give_the_same_logits(tiny: Any, dtype: torch.dtype,
                                                     attention_path: str) -> None:
    _, model = tiny
    if dtype == torch.bfloat16:
        model = bf16(model)
        if torch.cpu._is_avx512_bf16_supported():  # elsewhere oneDNN's bf16 rounds otherwise
            assert len(model.linear) == 4 * model.config.num_layers + 1  # all packed
    ids = torch.randint(0, 256, (40,)).tolist()
    runs, sources = {}, {}
    for name, table, budget in (("view", list(range(3, 13)), None),
                                ("mirror", scattered(10, 1), 1 << 30),
                                ("gather", scattered(10, 2), 0)):
        runner = runner_for(model, budget)
        runs[name] = decode_run(runner, ids, table, 13, 40)  # crosses block boundaries
        sources[name] = runner.decoder.last_source
    assert sources == {"view": "view", "mirror": "mirror", "gather": "gather"}
    assert torch.equal(runs["view"], runs["mirror"])
    assert torch.equal(runs["view"], runs["gather"])
    if dtype == torch.float32:
        dense = model.forward(torch.tensor(ids))[13:40]
        assert (runs["mirror"] - dense).abs().max().item() <= TOL


@pytest.mark.parametrize("exact", [False, True])
def test_decode_step_equals_the_layer_primitives_bit_for_bit(tiny: Any, exact: bool,
                                                             attention_path: str) -> None:
    """bf16: the fused decode loop runs the same operations as ``qkv`` / ``attend`` /
    ``finish`` / ``logits`` (the reference primitives), so the logits are identical."""
    model = bf16(tiny[1])
    c = model.config
    ids = torch.randint(0, 256, (25,)).tolist()
    runner = runner_for(model, exact=exact)
    table = scattered(7, 3)
    got = decode_run(runner, ids, table, 24, 25)[0]
    # the reference: K/V of the first 24 tokens from the pool, then one query through the
    # primitives (attend's one-query path is the MQA-shaped call; exact: enable_gqa per head)
    pos = torch.tensor([24])
    rope = runner.rope.lookup(pos)
    h = model.embed(torch.tensor(ids[24:]))
    blocks = torch.tensor(table)
    for layer in range(c.num_layers):
        q, k, v = model.qkv(layer, h, rope=rope)
        kc, vc = runner.kv_pool.gather(layer, blocks)
        kc, vc = kc[:25], vc[:25]
        assert torch.equal(kc[24], k[0]) and torch.equal(vc[24], v[0])  # stored by the step
        if exact:
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1)[None], kc.transpose(0, 1)[None], vc.transpose(0, 1)[None],
                enable_gqa=True)[0].transpose(0, 1).reshape(1, -1)
        else:
            out = model.attend(q, kc, vc, pos, torch.arange(25))
        h = model.finish(layer, h, out)
    assert torch.equal(got, model.logits(h)[0].float())


def test_mirror_follows_batch_changes_prefills_and_growth(tiny: Any, monkeypatch: Any,
                                                          attention_path: str) -> None:
    """A batch of uneven sequences decodes over the mirror; one leaves, another joins after a
    prefill, the context outgrows the mirror: every step equals the dense forward (fp32), and
    the mirror is rebuilt exactly when it must be."""
    monkeypatch.setattr(decode, "HEADROOM", 1)  # outgrow the copy within a few steps
    _, model = tiny
    runner = runner_for(model)
    mirror = runner.decoder.mirror
    seqs = {name: torch.randint(0, 256, (60,)).tolist() for name in "abc"}
    tables = {"a": scattered(15, 4)[:15], "b": list(range(80, 95)), "c": scattered(15, 5)}
    tables["c"] = [b for b in tables["c"] if b not in tables["a"] + tables["b"]]
    tables["a"] = [b for b in tables["a"] if b not in tables["b"]]
    length = {"a": 9, "b": 22}
    for name in "ab":
        n = length[name]
        runner.forward([SeqInput(seqs[name][:n], list(range(n)), tables[name], n)])

    def step(names: str) -> None:
        inputs = [SeqInput([seqs[x][length[x]]], [length[x]], tables[x], length[x] + 1)
                  for x in names]
        logits = runner.forward(inputs).logits
        assert runner.decoder.last_source == "mirror"
        for i, x in enumerate(names):
            length[x] += 1
            dense = model.forward(torch.tensor(seqs[x][:length[x]]))[-1]
            assert (logits[i] - dense).abs().max().item() <= TOL

    step("ab")  # b's context: 23 positions, the copy holds 24
    assert mirror.rebuilds == 1 and mirror.cap == 24
    step("ab")
    assert mirror.rebuilds == 1  # kept: the context grew within the copy
    step("ab")
    assert mirror.rebuilds == 2 and mirror.cap == 28  # outgrown: copied again, larger
    step("a")  # b left the batch
    assert mirror.rebuilds == 3
    runner.forward([SeqInput(seqs["c"][:5], list(range(5)), tables["c"], 5)])  # c joins
    length["c"] = 5
    assert mirror.nbytes == 0  # a prefill drops the copy
    step("ac")
    step("ac")
    assert mirror.rebuilds == 4
    step("ca")  # another order: another batch
    assert mirror.rebuilds == 5


def test_mirror_sees_writes_made_to_the_pool_between_steps(tiny: Any) -> None:
    """K/V written into a sequence's blocks from outside (``KVPool.write_all``, as segment
    reuse does through ``TorchEngine.write_kv``) reach the next mirrored step exactly as they
    reach a gathering runner."""
    model = bf16(tiny[1])
    c = model.config
    ids = torch.randint(0, 256, (30,)).tolist()
    table = scattered(8, 6)
    runners = [runner_for(model), runner_for(model, mirror_bytes=0)]
    for r in runners:
        decode_run(r, ids, table, 12, 16)
    g = torch.Generator().manual_seed(7)
    k = torch.randn(c.num_layers, 3, c.num_kv_heads, c.head_dim, generator=g)
    v = torch.randn(c.num_layers, 3, c.num_kv_heads, c.head_dim, generator=g)
    slots = torch.tensor(runners[0].slots(table, [2, 3, 4]))
    outs = []
    for r in runners:
        r.kv_pool.write_all(slots, k, v)
        outs.append(torch.cat([r.forward([SeqInput([ids[p]], [p], table, p + 1)]).logits
                               for p in range(16, 20)]))
    assert [r.decoder.last_source for r in runners] == ["mirror", "gather"]
    assert runners[0].decoder.mirror.rebuilds == 2  # once at the start, once after the write
    assert torch.equal(outs[0], outs[1])


def test_a_mirror_over_its_budget_falls_back_to_gathering(tiny: Any) -> None:
    _, model = tiny
    c = model.config
    per_position = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4
    runner = runner_for(model, mirror_bytes=per_position * 100)  # < 13 + HEADROOM positions
    ids = torch.randint(0, 256, (16,)).tolist()
    got = decode_run(runner, ids, scattered(4, 8), 13, 16)
    assert runner.decoder.last_source == "gather"
    assert runner.decoder.mirror.nbytes == 0
    assert (got - model.forward(torch.tensor(ids))[13:16]).abs().max().item() <= TOL


def test_bound_linears_equal_f_linear(tiny: Any) -> None:
    model = bf16(tiny[1])
    x = torch.randn(5, model.config.hidden_size).to(torch.bfloat16)
    w = model.layers[1].w_gate_up
    assert torch.equal(model.bound[1].gate_up(x), torch.nn.functional.linear(x, w))
    fp32 = PackedLinears()
    w32 = w.float()
    fp32.pack(w32)  # fp32 stays on F.linear (the reference mode)
    assert len(fp32) == 0
    assert torch.equal(fp32.bind(w32)(x.float()), torch.nn.functional.linear(x.float(), w32))


def test_chunk_prefill_cuts_pending_positions_into_calls() -> None:
    from suffixmem.engine.protocol import Request
    from suffixmem.engine.torch.sequence import Sequence

    def seq(name: str, n: int, pending: list[int]) -> Sequence:
        s = Sequence(Request(name, token_ids=list(range(100, 100 + n)), request_id=name),
                     list(range(100, 100 + n)), n, name, 0.0)
        s.pending, s.block_table = pending, list(range(8))
        return s

    a, b = seq("a", 10, list(range(3, 10))), seq("b", 5, [0, 1, 2, 3, 4])
    calls = chunk_prefill([a, b], 4)
    shape = [[(s.seq_id, list(i.positions), i.want_logits, i.context_len) for s, i in call]
             for call in calls]
    assert shape == [[("a", [3, 4, 5, 6], False, 7)],
                     [("a", [7, 8, 9], True, 10), ("b", [0], False, 1)],
                     [("b", [1, 2, 3, 4], True, 5)]]
    assert calls[0][0][1].token_ids == [103, 104, 105, 106]
    assert [len(c) for c in chunk_prefill([a, b], 100)] == [2]
    with pytest.raises(ValueError, match="prefill chunk"):
        chunk_prefill([a], 0)
