"""Fixtures for segment-reuse tests: one fp32 copy of the default model, shared by the session,
and a small paged KV pool over it (fp32 so that "same logits" can be checked tightly)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Rig:
    """A model runner over a private KV pool, and the block pool that hands out its blocks."""

    runner: object
    blocks: object

    def alloc(self, num_tokens: int) -> list[int]:
        bs = self.blocks.block_size  # type: ignore[attr-defined]
        return self.blocks.allocate(-(-num_tokens // bs))  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def fp32_llama(model_path: Path):  # type: ignore[no-untyped-def]
    import torch

    from suffixmem.engine.torch.llama import Llama

    return Llama.from_pretrained(model_path, dtype=torch.float32)


@pytest.fixture(scope="session")
def rig(fp32_llama) -> Rig:  # type: ignore[no-untyped-def]
    import torch

    from suffixmem.engine.torch.block_pool import BlockPool
    from suffixmem.engine.torch.kv_pool import KVPool
    from suffixmem.engine.torch.model_runner import ModelRunner

    c = fp32_llama.config
    kv = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, 16, 160, torch.float32)
    return Rig(ModelRunner(fp32_llama, kv, 2048), BlockPool(160, 16))
