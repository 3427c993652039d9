"""The decode batch's context in vLLM's paged layout, kept across steps: decode attention
through vLLM's CPU kernel (``vllm_attention``).

``decode.DecodeMirror`` keeps the batch's context as one contiguous row per sequence, padded to
the longest, and attends with SDPA under a padding mask: at batch 4 with contexts of 300 to
2,000 tokens that is 0.47 ms a layer on the AMD EPYC host, about half of the step. vLLM's kernel
reads a paged cache with one block table and length per sequence (no padding) and does the same
in 0.09 ms. ``PagedMirror`` is that cache, with ``DecodeMirror``'s bookkeeping unchanged: it is
rebuilt (the pool's K/V of every held position copied, then written in the kernel's layout) when
the batch changes, a context outgrows the capacity or anything else wrote the pool
(``KVPool.version``), and dropped at every prefill.

Layout: keys and values ``[L, B * nbc, KV, BLOCK, D]`` (``vllm_attention.BLOCK``-token blocks);
row ``b`` owns blocks ``b * nbc .. (b + 1) * nbc - 1``, position ``p`` in slot
``b * cap + p``. A step, per layer: the new tokens' K/V go into the copy (the kernel's
``reshape_and_cache``) and into a ``[L, B, KV, D]`` buffer; the kernel attends, each sequence
over its own length. After the last layer the buffer goes into the pool at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from suffixmem.engine.torch.decode import HEADROOM, DecodeMirror
from suffixmem.engine.torch.kv_pool import KVPool
from suffixmem.engine.torch.vllm_attention import BLOCK, VllmAttention


class PagedMirror(DecodeMirror):
    """``DecodeMirror``'s contract (``prepare``, ``done``, ``invalidate``, ``rebuilds``) over a
    copy in vLLM's paged layout; the step's attention is ``attend`` (module docstring)."""

    def __init__(self, pool: KVPool, kernel: VllmAttention, scale: float, max_bytes: int,
                 max_positions: int) -> None:
        super().__init__(pool, max_bytes, max_positions)
        self.kernel, self.scale = kernel, scale
        self.max_cap = -(-max_positions // BLOCK) * BLOCK
        self.key_cache = self.value_cache = torch.empty(0, dtype=pool.dtype)
        self.table = torch.empty(0, dtype=torch.int32)
        self.new_k = self.new_v = torch.empty(0, dtype=pool.dtype)
        self.query_start = self.seq_lens = self.meta = torch.empty(0, dtype=torch.int32)
        self._buffer = kernel.new_cache(0, pool.num_layers, pool.dtype)

    @property
    def nbytes(self) -> int:
        return 2 * self.key_cache.numel() * self.key_cache.element_size()

    def invalidate(self) -> None:
        # the copy is forgotten, its memory kept for the next one (``_cache``)
        self.key_cache = self.value_cache = torch.empty(0, dtype=self.pool.dtype)
        self.tables, self.held, self.version = [], [], -1

    def _cache(self, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value caches of ``num_blocks`` blocks per layer, views of one buffer kept
        across rebuilds: allocating (and faulting in) ~100 MB for every rebuild cost more than
        the copy itself. The buffer starts zeroed and only ever holds K/V after that, so the
        unused slots the kernel reads (weight 0) are finite."""
        p = self.pool
        if self._buffer[0].shape[1] < num_blocks:
            self._buffer = (torch.empty(0), torch.empty(0))  # free before allocating
            self._buffer = self.kernel.new_cache(num_blocks, p.num_layers, p.dtype)
        k, v = self._buffer
        return k[:, :num_blocks], v[:, :num_blocks]

    def prepare(self, tables: Sequence[Sequence[int]], lengths: Sequence[int],
                slots: torch.Tensor) -> bool:
        if not super().prepare(tables, lengths, slots):
            return False
        batch, p = len(lengths), self.pool
        self.query_start = torch.arange(batch + 1, dtype=torch.int32)
        self.seq_lens = torch.tensor(lengths, dtype=torch.int32)
        self.meta = self.kernel.metadata(self.query_start, self.seq_lens, p.dtype)
        shape = (p.num_layers, batch, p.num_kv_heads, p.head_dim)
        self.new_k = torch.empty(shape, dtype=p.dtype)
        self.new_v = torch.empty(shape, dtype=p.dtype)
        return True

    def _rebuild(self, tables: Sequence[Sequence[int]], lengths: Sequence[int]) -> bool:
        p, pbs = self.pool, self.pool.block_size
        cap = self._fit(lengths, BLOCK, HEADROOM)
        if not cap:
            return False
        batch, kvh, d = len(lengths), p.num_kv_heads, p.head_dim
        nbc = cap // BLOCK
        held = [n - 1 for n in lengths]
        src, dst = [], []
        for b, (t, h) in enumerate(zip(tables, held, strict=True)):
            nb = -(-h // pbs)
            rows = (torch.tensor(list(t[:nb]), dtype=torch.long)[:, None] * pbs
                    + torch.arange(pbs)).flatten()[:h]
            src.append(rows)
            dst.append(torch.arange(b * cap, b * cap + h))
        src_slots, dst_slots = torch.cat(src), torch.cat(dst)
        self.key_cache, self.value_cache = self._cache(batch * nbc)
        if src_slots.numel():
            # layer by layer through two scratch rows, allocated once per rebuild
            k = torch.empty(len(src_slots), kvh, d, dtype=p.dtype)
            v = torch.empty_like(k)
            for i in range(p.num_layers):
                torch.index_select(p.k_layers[i], 0, src_slots, out=k)
                torch.index_select(p.v_layers[i], 0, src_slots, out=v)
                self.kernel.write(k, v, self.key_cache[i], self.value_cache[i], dst_slots)
        self.table = (torch.arange(batch, dtype=torch.int32)[:, None] * nbc
                      + torch.arange(nbc, dtype=torch.int32))
        self.cap, self.held, self.tables = cap, held, self._snapshot(tables, held)
        self.rebuilds += 1
        return True

    def layer(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
        raise TypeError("a PagedMirror serves attend(), not K/V views")

    def attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """Layer ``i``: store the new tokens' ``k, v [B, KV, D]`` and return the attention of
        ``q [B, H, D]`` over each sequence's context, ``[B, H * D]`` (``mask`` unused: every
        sequence has its own length)."""
        self.new_k[i].copy_(k)
        self.new_v[i].copy_(v)
        kc, vc = self.key_cache[i], self.value_cache[i]
        self.kernel.write(k, v, kc, vc, self.rows)
        return self.kernel.attend(q, kc, vc, self.query_start, self.seq_lens, self.table,
                                  self.meta, self.scale)

    def done(self) -> None:
        self.pool.write_all(self.slots, self.new_k, self.new_v)
        self._advance()
