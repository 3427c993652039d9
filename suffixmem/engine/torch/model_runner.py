"""The model runner: one forward step over paged KV for one or more sequences.

``forward(inputs)`` is generic. Each ``SeqInput`` says which tokens to compute (``token_ids`` at
``positions``, not necessarily contiguous), which blocks hold the sequence (``block_table``) and
how long its context is (``context_len``: keys at positions ``0 .. context_len - 1``). Per layer
the runner writes the new tokens' K/V into their slots, then each sequence's tokens attend over
the whole context gathered from its blocks, causally by position. Every context position must
already hold K/V (cached prefix, reused segment) or be computed in this call.

Decode steps (one token per sequence, at the end of its context) run in ``decode.Decoder``: one
batched forward whose attention reads each sequence's context from a view of the pool, from a
contiguous copy kept across steps, or from per-layer gathers (see ``decode.py``). That call packs
the query heads that share a KV head as rows (an MQA-shaped call): on CPU it is ~8x faster than
``enable_gqa`` with one query row, but its bf16 rounding differs from transformers' decode in
the last bit. Where vLLM's CPU attention kernel is installed (``vllm_attention``: 2.6x SDPA's
speed for a prefill, ~4x for a ragged decode batch; another summation order), prefill and decode
attention run it unless ``vllm_attention=False``. ``exact_decode=True`` makes the same
per-sequence ``enable_gqa`` call as transformers and keeps SDPA everywhere (bit-identical bf16
greedy decoding, slower attention).

``measure_decode`` times decode steps at batch 1 and 4 against the weight-reading limit (the
figures ``bench engines`` reports).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from suffixmem.config import resolve_dtype
from suffixmem.engine.torch.decode import Decoder
from suffixmem.engine.torch.kv_pool import KVPool, torch_dtype
from suffixmem.engine.torch.llama import Llama
from suffixmem.engine.torch.rope import RopeTable


@dataclass(slots=True)
class SeqInput:
    """What to compute for one sequence in one forward step.

    ``token_ids[j]`` sits at ``positions[j]``; ``block_table`` covers at least ``context_len``
    positions. ``want_logits`` asks for the logits of the last token given.
    """

    token_ids: Sequence[int]
    positions: Sequence[int]
    block_table: Sequence[int]
    context_len: int
    want_logits: bool = True


@dataclass(slots=True)
class RunOutput:
    """``logits [S, V]`` (fp32) for the inputs that asked for them, in input order;
    ``entropy[layer]`` = ``[N_total]`` normalised attention entropy of every computed token (in
    input order) for each layer asked for."""

    logits: torch.Tensor
    entropy: dict[int, torch.Tensor] = field(default_factory=dict)


class ModelRunner:
    """Runs ``Llama`` over a ``KVPool``. Owned by one thread (the engine's driver)."""

    def __init__(self, model: Llama, kv_pool: KVPool, max_positions: int,
                 exact_decode: bool = False, mirror_bytes: int | None = None,
                 vllm_attention: bool = True) -> None:
        self.model = model
        self.exact_decode = exact_decode
        # whether attention may use vLLM's kernel (never in transformers-exact mode)
        self.vllm_attention = (vllm_attention and not exact_decode
                               and model.vllm_attention is not None)
        self.kv_pool = kv_pool
        self.block_size = kv_pool.block_size
        self.rope = RopeTable(model.config.head_dim, model.config.rope_theta, max_positions,
                              model.dtype)
        self.decoder = Decoder(model, kv_pool, self.rope, exact_decode, mirror_bytes,
                               max_positions, paged=self.vllm_attention)

    def slots(self, block_table: Sequence[int], positions: Sequence[int]) -> list[int]:
        """KV slot of each position of a sequence that owns ``block_table``."""
        return KVPool.slots_for(block_table, positions, self.block_size)

    @torch.inference_mode()
    def forward(self, inputs: Sequence[SeqInput],
                entropy_layers: Sequence[int] = ()) -> RunOutput:
        """Compute the given tokens, store their K/V, return logits (and entropies)."""
        if not inputs:
            raise ValueError("forward needs at least one input")
        for s in inputs:
            if len(s.token_ids) != len(s.positions) or not s.token_ids:
                raise ValueError("each input needs as many positions as tokens (>= 1)")
            if max(s.positions) >= s.context_len:
                raise ValueError("a computed position lies beyond the context length")
            if len(s.block_table) * self.block_size < s.context_len:
                raise ValueError("the block table is shorter than the context")
        decode = not entropy_layers and all(
            len(s.token_ids) == 1 and s.positions[0] == s.context_len - 1 for s in inputs)
        if decode:
            return RunOutput(self.decoder.step([s.token_ids[0] for s in inputs],
                                               [s.block_table for s in inputs],
                                               [s.context_len for s in inputs]))
        # a prefill writes the pool: the decode mirror would have to re-check it anyway, and
        # the batch is about to change
        self.decoder.invalidate()
        return self._prefill(inputs, entropy_layers)

    # -- generic (prefill) path -----------------------------------------------------------------
    def _prefill(self, inputs: Sequence[SeqInput], entropy_layers: Sequence[int]) -> RunOutput:
        m, pool = self.model, self.kv_pool
        ids = torch.tensor([t for s in inputs for t in s.token_ids], dtype=torch.long)
        positions = torch.tensor([p for s in inputs for p in s.positions], dtype=torch.long)
        slots = torch.tensor([x for s in inputs for x in self.slots(s.block_table, s.positions)],
                             dtype=torch.long)
        bounds = []  # (start, end) of each input's rows
        start = 0
        for s in inputs:
            bounds.append((start, start + len(s.token_ids)))
            start += len(s.token_ids)
        # per input: are the computed tokens exactly the whole context in order (cold prefill)?
        # then the fresh K/V serve directly, without a round trip through the pool
        whole = [list(s.positions) == list(range(s.context_len)) for s in inputs]
        blocks = [torch.tensor(s.block_table[:-(-s.context_len // self.block_size)],
                               dtype=torch.long) for s in inputs]
        k_pos = [torch.arange(s.context_len) for s in inputs]
        rope = self.rope.lookup(positions)
        entropy: dict[int, list[torch.Tensor]] = {i: [] for i in entropy_layers}
        h = m.embed(ids)
        for layer in range(m.config.num_layers):
            q, k, v = m.qkv(layer, h, rope=rope)
            pool.write(layer, slots, k, v)
            outs = []
            for j, s in enumerate(inputs):
                a, b = bounds[j]
                if whole[j]:
                    kc, vc = k[a:b], v[a:b]
                else:
                    kc, vc = pool.gather(layer, blocks[j])
                    kc, vc = kc[:s.context_len], vc[:s.context_len]
                res = m.attend(q[a:b], kc, vc, positions[a:b], k_pos[j],
                               entropy=layer in entropy, kernel=self.vllm_attention)
                if isinstance(res, tuple):
                    outs.append(res[0])
                    entropy[layer].append(res[1])
                else:
                    outs.append(res)
            h = m.finish(layer, h, outs[0] if len(outs) == 1 else torch.cat(outs))
        rows = [b - 1 for (_, b), s in zip(bounds, inputs, strict=True) if s.want_logits]
        logits = m.logits(h[rows]).float() if rows else h.new_zeros((0, m.config.vocab_size))
        return RunOutput(logits, {i: torch.cat(e) for i, e in entropy.items()})

# -- decode speed against the memory-bandwidth limit -----------------------------------------------
def copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Best-of-``repeats`` memory-copy rate in bytes/s, bytes read plus bytes written (the figure
    ``bench engines`` reports as ``copy_bytes_per_s``), with torch's current thread count."""
    src = torch.ones(mib << 18, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * src.element_size() / best


def measure_decode(model: Llama | str | Path, *, batch_sizes: Sequence[int] = (1, 4),
                   context: int = 256, steps: int = 32, repeats: int = 3,
                   mem_bytes_per_s: float | None = None, block_size: int = 16,
                   seed: int = 0) -> dict[str, float]:
    """Decode speed of ``ModelRunner`` against the weight-reading limit.

    For each batch size ``B``: ``B`` sequences of ``context`` random tokens are prefilled, then
    ``steps`` decode steps (one token per sequence each) are timed, ``repeats`` times over the
    same positions; the figure is the best repeat's mean step time. Returns
    ``decode_ms_per_token_b{B}`` (ms per step: each sequence gets one token per step),
    ``decode_tokens_per_s_b{B}``, ``weights_bytes`` (read once per step), ``mem_gbps`` (copy
    rate, read + written, ``mem_bytes_per_s`` or measured here), ``bandwidth_limit_ms``
    (``weights_bytes / mem_gbps``: no step can be faster) and ``ratio_b{B}`` (step / limit).
    A model given by path is loaded in the engines' dtype on this device (``EngineConfig``'s
    ``auto``). Uses torch's current thread count; the timings are wall clock, so noisy on a
    busy machine.
    """
    if not batch_sizes or min(batch_sizes) < 1 or context < 1 or steps < 1 or repeats < 1:
        raise ValueError("measure_decode needs batch sizes >= 1 and positive context, steps, "
                         "repeats")
    if not isinstance(model, Llama):  # in the engines' dtype here (EngineConfig's "auto")
        model = Llama.from_pretrained(model, torch_dtype(resolve_dtype("auto")))
    c = model.config
    if context + steps > c.max_position_embeddings:
        raise ValueError("context + steps exceeds the model's max_position_embeddings")
    per_seq = -(-(context + steps) // block_size)
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, block_size,
                  per_seq * max(batch_sizes), model.dtype)
    runner = ModelRunner(model, pool, context + steps)
    gen = torch.Generator().manual_seed(seed)
    mem = mem_bytes_per_s if mem_bytes_per_s is not None else copy_bandwidth()
    limit_s = model.weight_bytes / mem
    out: dict[str, float] = {"weights_bytes": float(model.weight_bytes),
                             "mem_gbps": mem / 1e9, "bandwidth_limit_ms": limit_s * 1e3,
                             "context": float(context), "threads": float(torch.get_num_threads())}
    for b in batch_sizes:
        tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(b)]
        ids = torch.randint(0, c.vocab_size, (b, context + steps), generator=gen).tolist()
        runner.forward([SeqInput(ids[i][:context], range(context), tables[i], context)
                        for i in range(b)])
        best = math.inf
        for _ in range(repeats + 1):  # the first round warms oneDNN's primitive caches
            t = time.perf_counter()
            for p in range(context, context + steps):
                runner.forward([SeqInput([ids[i][p]], [p], tables[i], p + 1) for i in range(b)])
            best = min(best, (time.perf_counter() - t) / steps)
        out[f"decode_ms_per_token_b{b}"] = best * 1e3
        out[f"decode_tokens_per_s_b{b}"] = b / best
        out[f"ratio_b{b}"] = best / limit_s
    return out
