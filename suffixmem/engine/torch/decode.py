"""The decode step: one new token for each of ``B`` sequences through all layers.

At batch 1 a decode step of a small model is memory-bound (every weight read once) plus Python
and dispatcher overhead per tensor op, which at ~60 ops per layer was a third of the step. This
loop runs exactly the operations of ``Llama.qkv`` / ``Llama.finish`` and the runner's decode
attention (bit-identical results, tested) in fewer Python calls per layer: projections bound
to their prepacked weights, RoPE on ``[B, 1, D]`` tables looked up once per step, q/k/v split
in one call, one ``index_copy_`` per K and V into per-layer views, attention
(``attention.one_query``) over ``as_strided`` views (no per-layer select/slice/transpose
chains).

Where the context's K/V come from (``KVSource``), cheapest first:

- ``PoolView``: one sequence whose blocks are consecutive in the pool (a first turn: the block
  pool hands out never-used blocks in order) attends over a view of the pool itself.
- ``DecodeMirror``: a contiguous copy ``[L, B, cap, KV, D]`` of the batch's context, kept from
  step to step. A step writes its new tokens into it and, once, into the pool; the next step
  finds its context already in place. It is rebuilt (one gather over all layers) when the batch
  changes, outgrows ``cap`` or anything else wrote to the pool (``KVPool.version``; the runner
  also drops it on every prefill). Without it, a later turn (cached blocks followed by fresh
  ones, not consecutive) or a batch copied its whole context once per layer per token.
- ``Gather``: that per-layer copy, when the mirror would exceed its byte budget.

Where vLLM's CPU attention kernel is installed (bf16, not ``exact``), ``paged_mirror.PagedMirror``
comes first: the same kind of copy in the kernel's paged layout, attended without padding,
~4x faster than the padded SDPA call for a ragged batch. Its steps also run the layers'
elementwise work through vLLM's fused kernels (``fused.FusedOps``: 4 calls a layer instead of
~27). Both round differently from the layer primitives, so the bit-for-bit agreement above
holds for the other sources.

Shapes: ``B`` sequences, ``L`` layers, ``H`` query heads, ``KV`` key/value heads, ``R = H/KV``,
``D`` head dim, ``E`` hidden size, ``T`` context length of the longest sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from suffixmem.engine.torch.attention import one_query
from suffixmem.engine.torch.fused import FusedOps
from suffixmem.engine.torch.kv_pool import KVPool
from suffixmem.engine.torch.llama import Llama, rms_norm
from suffixmem.engine.torch.rope import RopeTable

HEADROOM = 256  # positions a mirror is built beyond the longest context (rebuilt when outgrown)
KVViews = tuple[torch.Tensor, torch.Tensor]


class KVSource:
    """Where one decode step's attention reads K/V: ``layer`` stores the new tokens' ``k, v
    [B, KV, D]`` of layer ``i`` and returns the context ``[B, KV, T, D]`` (new tokens included);
    ``done`` runs after the last layer."""

    def layer(self, i: int, k: torch.Tensor, v: torch.Tensor) -> KVViews:
        raise NotImplementedError

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """Layer ``i``'s attention of ``q [B, H, D]`` over the context (``layer``'s, the new
        tokens ``k, v`` stored first), query heads grouped by KV head (``one_query``); ``mask``
        ``[B, 1, 1, T]`` hides each sequence's padding. Returns ``[B, H * D]``."""
        kc, vc = self.layer(i, k, v)
        b, kvh, d = k.shape
        return one_query(q.reshape(b, kvh, -1, d), kc, vc, mask)

    def done(self) -> None:
        pass


class PoolView(KVSource):
    """One sequence of ``n`` tokens on consecutive pool slots from ``first_slot``."""

    def __init__(self, pool: KVPool, first_slot: int, n: int) -> None:
        kvh, d = pool.num_kv_heads, pool.head_dim
        self.pool = pool
        self.slot = torch.tensor([first_slot + n - 1])
        self.size = (1, kvh, n, d)
        self.stride = (n * kvh * d, d, kvh * d, 1)
        self.offset = first_slot * kvh * d
        self.per_layer = pool.num_slots * kvh * d

    def layer(self, i: int, k: torch.Tensor, v: torch.Tensor) -> KVViews:
        p = self.pool
        p.k_layers[i].index_copy_(0, self.slot, k)
        p.v_layers[i].index_copy_(0, self.slot, v)
        off = self.offset + i * self.per_layer
        return (p.k.as_strided(self.size, self.stride, off),
                p.v.as_strided(self.size, self.stride, off))

    def done(self) -> None:
        self.pool.touch()


class Gather(KVSource):
    """Per layer, a copy of each sequence's blocks (padded with block 0, masked out)."""

    def __init__(self, pool: KVPool, tables: Sequence[Sequence[int]], lengths: Sequence[int],
                 slots: torch.Tensor) -> None:
        bs, ctx = pool.block_size, max(lengths)
        nb = -(-ctx // bs)
        self.pool, self.ctx, self.slots = pool, ctx, slots
        self.table = torch.tensor([list(t[:nb]) + [0] * (nb - len(t[:nb])) for t in tables],
                                  dtype=torch.long)  # [B, nb]

    def layer(self, i: int, k: torch.Tensor, v: torch.Tensor) -> KVViews:
        self.pool.write(i, self.slots, k, v)
        kc, vc = self.pool.gather(i, self.table)  # [B, nb * bs, KV, D]
        return kc[:, :self.ctx].transpose(1, 2), vc[:, :self.ctx].transpose(1, 2)


class DecodeMirror(KVSource):
    """A decode batch's context, contiguous per sequence, kept across steps (module docstring).

    Row ``b`` holds positions ``0 .. held[b] - 1`` of the sequence whose block table began with
    ``tables[b]`` when they were copied or computed. ``prepare`` makes it serve a step (or says
    it cannot within ``max_bytes``); ``layer`` and ``done`` are the step's writes.
    """

    def __init__(self, pool: KVPool, max_bytes: int, max_positions: int) -> None:
        self.pool = pool
        self.max_bytes = max_bytes
        bs = pool.block_size
        self.max_cap = -(-max_positions // bs) * bs
        self.k = self.v = torch.empty(0, dtype=pool.dtype)  # [L, B * cap, KV, D] when built
        self._kbuf = self._vbuf = torch.empty(0, dtype=pool.dtype)  # kept across rebuilds
        self.k_layers: list[torch.Tensor] = []
        self.v_layers: list[torch.Tensor] = []
        self.cap = 0
        self.tables: list[list[int]] = []  # per row: the blocks its held positions lie in
        self.held: list[int] = []  # per row: positions copied or computed
        self.version = -1  # the pool's version the copy agrees with; -1: invalid
        self.rebuilds = 0  # copies taken from the pool so far (tests, profiling)
        # the step being served (``prepare`` .. ``done``)
        self.slots = self.rows = torch.empty(0, dtype=torch.long)
        self.lengths: Sequence[int] = ()
        self.step_tables: Sequence[Sequence[int]] = ()
        self.size: tuple[int, ...] = ()
        self.stride: tuple[int, ...] = ()
        self.per_layer = 0

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def invalidate(self) -> None:
        """Forget the copy (its buffers stay for the next one, within ``max_bytes``)."""
        self.k = self.v = torch.empty(0, dtype=self.pool.dtype)
        self.k_layers, self.v_layers = [], []
        self.tables, self.held, self.version = [], [], -1

    def _valid_for(self, tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> bool:
        if self.version != self.pool.version or len(tables) != len(self.tables):
            return False
        for t, n, snap, held in zip(tables, lengths, self.tables, self.held, strict=True):
            if n - 1 != held or n > self.cap or list(t[:len(snap)]) != snap:
                return False
        return True

    def prepare(self, tables: Sequence[Sequence[int]], lengths: Sequence[int],
                slots: torch.Tensor) -> bool:
        """Ready to serve a step of sequences with ``tables`` whose new tokens sit at
        ``lengths[b] - 1`` (pool ``slots``); rebuilt if needed. False (and dropped) when a copy
        would exceed ``max_bytes``."""
        if not self._valid_for(tables, lengths) and not self._rebuild(tables, lengths):
            return False
        self.version = -1  # until ``done``: a step that fails halfway leaves no valid copy
        self.slots, self.lengths, self.step_tables = slots, lengths, tables
        self.rows = torch.tensor([b * self.cap + n - 1 for b, n in enumerate(lengths)])
        self.size = (len(lengths), self.pool.num_kv_heads, max(lengths), self.pool.head_dim)
        return True

    def _fit(self, lengths: Sequence[int], granule: int, headroom: int) -> int:
        """Forget the copy; the capacity (positions per row, a multiple of ``granule``,
        ``headroom`` beyond the longest context) of a new one for ``lengths``, or 0 when it
        would exceed ``max_bytes``."""
        p = self.pool
        self.invalidate()
        cap = min(-(-(max(lengths) + headroom) // granule) * granule, self.max_cap)
        per_position = 2 * p.num_layers * p.num_kv_heads * p.head_dim * p.k.element_size()
        return 0 if len(lengths) * cap * per_position > self.max_bytes else cap

    def _rebuild(self, tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> bool:
        p, bs = self.pool, self.pool.block_size
        cap = self._fit(lengths, bs, HEADROOM)
        if not cap:
            return False
        batch, kvh, d = len(lengths), p.num_kv_heads, p.head_dim
        nbc = cap // bs
        held = [n - 1 for n in lengths]
        snaps = self._snapshot(tables, held)
        blocks = torch.tensor([b for s in snaps for b in s + [0] * (nbc - len(s))],
                              dtype=torch.long)  # padding rows (block 0) stay masked out
        shape = (p.num_layers, batch * cap, kvh, d)
        need = p.num_layers * batch * cap * kvh * d
        if self._kbuf.numel() < need:  # grow (the old buffers freed first)
            self._kbuf = self._vbuf = torch.empty(0, dtype=p.dtype)
            self._kbuf, self._vbuf = (torch.empty(need, dtype=p.dtype) for _ in range(2))
        # views of buffers kept across rebuilds, filled layer by layer: a fresh ~100 MB copy
        # per rebuild was faulted in page by page (~40 ms for 4 x 500-800 tokens)
        self.k, self.v = self._kbuf[:need].view(shape), self._vbuf[:need].view(shape)
        for i in range(p.num_layers):
            for src, dst in ((p.k[i], self.k[i]), (p.v[i], self.v[i])):
                torch.index_select(src.view(p.num_blocks, bs * kvh * d), 0, blocks,
                                   out=dst.view(batch * nbc, bs * kvh * d))
        self.k_layers, self.v_layers = list(self.k.unbind(0)), list(self.v.unbind(0))
        self.cap, self.tables, self.held = cap, snaps, held
        self.rebuilds += 1
        self.stride = (cap * kvh * d, d, kvh * d, 1)
        self.per_layer = batch * cap * kvh * d
        return True

    def layer(self, i: int, k: torch.Tensor, v: torch.Tensor) -> KVViews:
        self.k_layers[i].index_copy_(0, self.rows, k)
        self.v_layers[i].index_copy_(0, self.rows, v)
        off = i * self.per_layer
        return (self.k.as_strided(self.size, self.stride, off),
                self.v.as_strided(self.size, self.stride, off))

    def done(self) -> None:
        # the new tokens of every layer into the pool at once: [L, B, KV, D] each
        self.pool.write_all(self.slots, self.k.index_select(1, self.rows),
                            self.v.index_select(1, self.rows))
        self._advance()

    def _snapshot(self, tables: Sequence[Sequence[int]], held: Sequence[int]) -> list[list[int]]:
        """Per row, the pool blocks its ``held`` positions lie in (``_valid_for`` compares)."""
        bs = self.pool.block_size
        return [list(t[:-(-h // bs)]) for t, h in zip(tables, held, strict=True)]

    def _advance(self) -> None:
        """After a step's writes: every row holds its positions up to the new token."""
        self.tables = self._snapshot(self.step_tables, self.lengths)
        self.held = list(self.lengths)
        self.version = self.pool.version


class Decoder:
    """Runs decode steps of ``model`` over ``pool`` (owned by the model runner's thread)."""

    def __init__(self, model: Llama, pool: KVPool, rope: RopeTable, exact: bool = False,
                 mirror_bytes: int | None = None, max_positions: int = 0,
                 paged: bool = True) -> None:
        self.model, self.pool, self.rope, self.exact = model, pool, rope, exact
        budget = pool.capacity_bytes if mirror_bytes is None else mirror_bytes
        positions = max_positions or rope.cos.shape[0]
        self.mirror = DecodeMirror(pool, budget, positions)
        self.paged: DecodeMirror | None = None
        if paged and not exact and model.vllm_attention is not None:
            # a lazy import: paged_mirror builds on this module's DecodeMirror
            from suffixmem.engine.torch.paged_mirror import PagedMirror

            self.paged = PagedMirror(pool, model.vllm_attention, model.scale, budget, positions)
        # vLLM's elementwise kernels, for the steps PagedMirror serves (fused.py)
        self.fused = FusedOps.load(model, rope) if self.paged is not None else None
        self.last_source = ""  # which KVSource served the last step (tests, profiling)

    def invalidate(self) -> None:
        """Forget the mirrors' copies (a prefill writes the pool); their buffers stay."""
        self.mirror.invalidate()
        if self.paged is not None:
            self.paged.invalidate()

    def source(self, tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> KVSource:
        """The cheapest ``KVSource`` for this step (module docstring)."""
        bs = self.pool.block_size
        slots = torch.tensor([t[(n - 1) // bs] * bs + (n - 1) % bs
                              for t, n in zip(tables, lengths, strict=True)], dtype=torch.long)
        if self.paged is not None and self.paged.prepare(tables, lengths, slots):
            self.last_source = "paged"
            return self.paged
        if len(tables) == 1:
            t, nb = tables[0], -(-lengths[0] // bs)
            first = t[0]
            if list(t[:nb]) == list(range(first, first + nb)):
                self.mirror.invalidate()
                self.last_source = "view"
                return PoolView(self.pool, first * bs, lengths[0])
        if self.mirror.prepare(tables, lengths, slots):
            self.last_source = "mirror"
            return self.mirror
        self.last_source = "gather"
        return Gather(self.pool, tables, lengths, slots)

    def step(self, token_ids: Sequence[int], tables: Sequence[Sequence[int]],
             lengths: Sequence[int]) -> torch.Tensor:
        """Logits ``[B, V]`` (fp32) of ``token_ids[b]``, the newest token of sequence ``b`` at
        position ``lengths[b] - 1``, whose blocks are ``tables[b]``; its K/V are stored."""
        m, c = self.model, self.model.config
        batch, ctx = len(token_ids), max(lengths)
        kv = self.source(tables, lengths)
        pos = torch.tensor([n - 1 for n in lengths], dtype=torch.long)
        if self.fused is not None and kv is self.paged:
            if ctx > self.rope.cos.shape[0]:  # the kernel would read past the table's end
                raise IndexError(f"position {ctx - 1} is past the RoPE table "
                                 f"({self.rope.cos.shape[0]} positions)")
            return self.fused.step(kv, token_ids, pos)
        cos = self.rope.cos[pos].unsqueeze(1)  # [B, 1, D]: broadcast over heads
        ssin = self.rope.ssin[pos].unsqueeze(1)
        mask = None
        if any(n != ctx for n in lengths):
            lens = torch.tensor(lengths)
            mask = (torch.arange(ctx)[None, :] < lens[:, None])[:, None, None, :]  # [B,1,1,T]
        nh, kvh, d = c.num_heads, c.num_kv_heads, c.head_dim
        split_qkv, split_qk, half = [nh + kvh, kvh], [nh, kvh], d // 2
        eps = c.rms_norm_eps
        x = m.embed_tokens[torch.tensor(token_ids, dtype=torch.long)]  # [B, E]
        for i, (w, f) in enumerate(zip(m.layers, m.bound, strict=True)):
            # Llama.qkv: RMSNorm, fused projection, RoPE on q and k together
            y = rms_norm(x, w.input_norm, eps)
            qk, v = f.qkv(y).view(batch, nh + 2 * kvh, d).split(split_qkv, 1)
            qk = qk * cos + qk.roll(half, -1) * ssin  # rope.rope_signed
            q, k = qk.split(split_qk, 1)
            if self.exact:  # transformers' own call, per sequence
                kc, vc = kv.layer(i, k, v)  # [B, KV, T, D]
                out = torch.cat([F.scaled_dot_product_attention(
                    q[b][:, None, :][None], kc[b:b + 1, :, :n], vc[b:b + 1, :, :n],
                    enable_gqa=True).reshape(1, -1) for b, n in enumerate(lengths)])
            else:  # the source's attention (one_query, or vLLM's kernel for a PagedMirror)
                out = kv.attend(i, q, k, v, mask)
            # Llama.finish: o_proj and residual, RMSNorm, SwiGLU and residual
            x = x + f.o(out)
            gate, up = f.gate_up(rms_norm(x, w.post_norm, eps)).split(c.intermediate_size, -1)
            x = x + f.down(F.silu(gate) * up)
        kv.done()
        return m.lm_head_linear(rms_norm(x, m.norm, eps)).float()
