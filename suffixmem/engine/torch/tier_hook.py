"""The torch engine's side of the KV tier: block tensors <-> tier bytes.

- ``spill(block)``: the block pool's ``on_evict`` hook. A cached block about to be reused is
  written to the tier (its K and V over all layers) while its KV is still in the pool. Blocks
  under the approximate salt (segment reuse) are never written: their KV is not exact.
- ``extend(seq)``: right after admission, before the prefill runs. The pool's prefix hit ends at
  some block; the tier is asked for the following blocks of the same salted hash chain, and the
  longest run it holds (a checksum failure ends the run) is copied into the blocks the scheduler
  just allocated and registered in the prefix cache, as if they had been computed. The last
  prompt token is always computed (its logits start the answer).
- ``flush()``: at engine close, every cached block goes to the tier (a restart finds it).

Runs in the driver thread only.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from suffixmem.config import EngineConfig, kv_tier_dir
from suffixmem.engine.kv_tier import KVTier, model_fingerprint
from suffixmem.engine.torch.block_pool import Block, BlockHash, BlockPool
from suffixmem.engine.torch.kv_pool import KVPool
from suffixmem.engine.torch.model_config import ModelConfig
from suffixmem.engine.torch.sequence import APPROX_MARK, Sequence

log = logging.getLogger(__name__)


class TorchTier:
    """Connects ``BlockPool``/``KVPool`` to a ``KVTier``."""

    def __init__(self, tier: KVTier, block_pool: BlockPool, kv_pool: KVPool) -> None:
        self.tier = tier
        self.pool = block_pool
        self.kv = kv_pool
        self.bs = kv_pool.block_size
        self.loaded_tokens = 0
        block_pool.on_evict = self.spill

    @classmethod
    def open(cls, config: EngineConfig, model_path: Path, mc: ModelConfig,
             block_pool: BlockPool, kv_pool: KVPool) -> TorchTier:
        """The tier of ``config`` (its folder, budget and policy) for this model, dtype and
        block shape: the fingerprint keeps another model's or layout's blocks out."""
        fp = model_fingerprint(model_path, config.dtype, kv_pool.block_size, mc.num_layers,
                               mc.num_kv_heads, mc.head_dim)
        tier = KVTier(kv_tier_dir(config.kv_tier_dir), fp, int(config.kv_tier_gib * (1 << 30)),
                      config.kv_tier_policy)
        return cls(tier, block_pool, kv_pool)

    # -- tensors <-> bytes ----------------------------------------------------------------------
    def _payload(self, block_id: int) -> bytes:
        rows = slice(block_id * self.bs, (block_id + 1) * self.bs)
        kv = torch.stack([self.kv.k[:, rows], self.kv.v[:, rows]])  # [2, L, bs, KV, D]
        return kv.contiguous().view(torch.uint8).numpy().tobytes()

    def _load(self, block_id: int, payload: bytes) -> bool:
        kv = self.kv
        shape = (2, kv.num_layers, self.bs, kv.num_kv_heads, kv.head_dim)
        flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        if flat.numel() != torch.Size(shape).numel() * kv.k.element_size():
            return False
        t = flat.view(kv.dtype).view(shape)
        rows = slice(block_id * self.bs, (block_id + 1) * self.bs)
        kv.k[:, rows] = t[0]
        kv.v[:, rows] = t[1]
        return True

    # -- hooks ----------------------------------------------------------------------------------
    def spill(self, block: Block) -> None:
        """Write ``block`` (cached, about to be evicted) to the tier."""
        if block.key is None or block.block_hash is None:
            return
        parent, chunk, salt = block.key
        if salt.endswith(APPROX_MARK):
            return
        try:
            self.tier.put(salt, block.block_hash, parent, chunk, self._payload(block.block_id))
        except OSError as e:  # a full disk loses the tier copy, never the request
            self.tier.write_failed(e)

    def extend(self, seq: Sequence) -> int:
        """Load the tier's run of blocks that follows ``seq``'s prefix hit; returns the tokens
        loaded (see the module docstring)."""
        bs = self.bs
        if seq.approx_from is not None or seq.num_computed != seq.num_hashed_blocks * bs:
            return 0
        first = seq.num_hashed_blocks
        last = (seq.num_tokens - 1) // bs  # blocks strictly before the last prompt token
        parent: BlockHash | None = seq.last_hash
        loaded = 0
        for j in range(first, last):
            chunk = tuple(seq.token_ids[j * bs:(j + 1) * bs])
            h = self.pool.hash_fn(parent, chunk, seq.salt)
            if h not in self.tier:
                self.tier.record_misses(last - j)
                break
            payload = self.tier.get(seq.salt, h, parent, chunk)
            if payload is None or not self._load(seq.block_table[j], payload):
                self.tier.record_misses(last - j)
                break  # corrupt: deleted by the tier; from here on the prefill recomputes
            self.pool.cache_block(seq.block_table[j], parent, chunk, seq.salt)
            parent = h
            loaded += 1
        if loaded:
            seq.last_hash = parent
            seq.num_hashed_blocks = first + loaded
            seq.num_computed = (first + loaded) * bs
            seq.pending = list(range(seq.num_computed, seq.num_tokens))
            if seq.num_output_tokens == 0:
                seq.num_cached_tokens = max(seq.num_cached_tokens, seq.num_computed)
            self.loaded_tokens += loaded * bs
        return loaded * bs

    def flush(self) -> int:
        """Write every cached block to the tier (engine shutdown); returns how many written."""
        n = 0
        for block in self.pool.cached_blocks():
            before = self.tier.stats.writes
            self.spill(block)
            n += self.tier.stats.writes - before
        return n

    def delete_session(self, salt: str) -> int:
        """Forget ``salt``'s blocks in the pool (without spilling) and in the tier."""
        self.pool.forget((salt, salt + APPROX_MARK))
        return self.tier.delete_session(salt)
