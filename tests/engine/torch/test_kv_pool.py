"""KVPool row access: reads, writes and moves of all layers' K/V, checked against plain
indexing (the int64-word fast path and the fallback for rows it cannot divide)."""

from __future__ import annotations

import pytest
import torch

from suffixmem.engine.torch.kv_pool import KVPool
from suffixmem.engine.torch.rope import rerotate


def _pool(kv_heads: int, head_dim: int, dtype: torch.dtype) -> KVPool:
    pool = KVPool(num_layers=3, num_kv_heads=kv_heads, head_dim=head_dim, block_size=4,
                  num_blocks=8, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    pool.k.copy_(torch.randn(pool.k.shape, generator=g))
    pool.v.copy_(torch.randn(pool.v.shape, generator=g))
    return pool


# (3, 64) bf16: rows of 384 bytes move as int64 words; (1, 2) bf16: 4-byte rows, native dtype
SHAPES = [(3, 64, torch.bfloat16), (1, 2, torch.bfloat16), (2, 8, torch.float32)]


@pytest.mark.parametrize(("kv_heads", "head_dim", "dtype"), SHAPES)
def test_read_and_write_all_match_plain_indexing(kv_heads: int, head_dim: int,
                                                 dtype: torch.dtype) -> None:
    pool = _pool(kv_heads, head_dim, dtype)
    slots = torch.tensor([9, 2, 30, 3])
    k, v = pool.read(slots)
    assert k.dtype == dtype and k.shape == (3, 4, kv_heads, head_dim)
    assert torch.equal(k, pool.k[:, slots]) and torch.equal(v, pool.v[:, slots])

    before = pool.version
    new_k, new_v = torch.randn_like(k.float()), torch.randn_like(v.float())  # cast on write
    expect_k, expect_v = pool.k.clone(), pool.v.clone()
    expect_k[:, slots], expect_v[:, slots] = new_k.to(dtype), new_v.to(dtype)
    pool.write_all(slots, new_k, new_v)
    assert torch.equal(pool.k, expect_k) and torch.equal(pool.v, expect_v)
    assert pool.version == before + 1


@pytest.mark.parametrize(("kv_heads", "head_dim", "dtype"), SHAPES)
def test_move_equals_read_rotate_write(kv_heads: int, head_dim: int,
                                       dtype: torch.dtype) -> None:
    src, dst = torch.tensor([1, 2, 3, 4, 5, 17]), torch.tensor([20, 21, 22, 8, 9, 31])
    ref = _pool(kv_heads, head_dim, dtype)
    k, v = ref.read(src)
    k = rerotate(k.reshape(-1, kv_heads, head_dim), 7, 10000.0).view(k.shape)
    ref.write_all(dst, k, v)

    pool = _pool(kv_heads, head_dim, dtype)
    untouched = pool.k[:, src].clone()
    pool.move(src, dst, lambda keys: rerotate(keys, 7, 10000.0, out=keys))
    assert torch.equal(pool.k, ref.k) and torch.equal(pool.v, ref.v)
    # the keys were rotated in a scratch copy: the source rows (disjoint from dst) keep theirs
    assert torch.equal(pool.k[:, src], untouched)

    plain = _pool(kv_heads, head_dim, dtype)
    expect_k, expect_v = plain.k.clone(), plain.v.clone()
    expect_k[:, dst], expect_v[:, dst] = plain.k[:, src], plain.v[:, src]
    plain.move(src, dst)
    assert torch.equal(plain.k, expect_k) and torch.equal(plain.v, expect_v)

    none = torch.tensor([], dtype=torch.long)  # nothing to move (a hook that reuses nothing)
    plain.move(none, none)
    k, v = plain.read(none)
    assert k.shape == (3, 0, kv_heads, head_dim) == v.shape
    plain.write_all(none, k, v)
    assert torch.equal(plain.k, expect_k) and torch.equal(plain.v, expect_v)


def test_rerotate_in_place_equals_a_new_tensor() -> None:
    g = torch.Generator().manual_seed(1)
    k = torch.randn(2500, 3, 64, generator=g).to(torch.bfloat16)  # more than one row chunk
    expect = rerotate(k, -41, 100000.0)
    same = k.clone()
    assert rerotate(same, -41, 100000.0, out=same) is same
    assert torch.equal(same, expect)
