"""The KV tier in the torch engine, on the real model: a session evicted from the pool comes back
from disk with bit-identical KV and the same greedy text; a new process restores it; a flipped
byte is detected and recomputed; another session with the same text gets nothing; deleting the
session removes its files; the tier keeps its byte budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from suffixmem.engine import create_engine
from suffixmem.engine.protocol import Request, Result, SamplingParams
from suffixmem.engine.torch.kv_pool import KVPool

pytestmark = pytest.mark.slow

BS = 16
POOL_BLOCKS = 34  # one 512-token request (32 blocks) and a little more
TOPICS = ("a lighthouse keeper on a stormy coast", "a baker who opens before dawn",
          "a glacier guide in the high mountains")


def engine_options(tier_dir: Path, **extra: Any) -> dict[str, Any]:
    per_block = KVPool.bytes_per_block(30, 3, 64, BS, torch.float32)
    return dict(max_model_len=512, kv_cache_gib=(POOL_BLOCKS * per_block + 64) / (1 << 30),
                dtype="float32", block_size=BS, kv_tier=True, kv_tier_dir=str(tier_dir),
                **extra)


def prompt_ids(engine: Any, topic: str) -> list[int]:
    text = " ".join(f"Sentence {i} of a story about {topic}, told slowly." for i in range(18))
    ids = engine.tokenize(text)
    assert 250 < len(ids) < 400
    return ids


def gen(engine: Any, ids: list[int], session: str) -> Result:
    return engine.generate(Request(session, token_ids=ids,
                                   sampling=SamplingParams(max_tokens=8, temperature=0.0)))


def prompt_kv(engine: Any, ids: list[int], session: str) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the prompt's cached full blocks (all layers), read from the pool."""
    def read(e: Any) -> tuple[torch.Tensor, torch.Tensor]:
        m = e.block_pool.match(ids, session)
        slots = [b * BS + s for b in m.block_ids for s in range(BS)]
        return e.kv_pool.read(torch.tensor(slots, dtype=torch.long))
    return engine.run_in_driver(read)


def pool_hit(engine: Any, ids: list[int], session: str) -> int:
    return engine.run_in_driver(lambda e: e.block_pool.match(ids, session).num_cached_tokens)


def full_blocks(ids: list[int]) -> int:
    return (len(ids) - 1) // BS * BS


def test_evicted_session_is_restored_from_the_tier(tmp_path: Path) -> None:
    engine = create_engine("torch", **engine_options(tmp_path))
    try:
        a, b, c = (prompt_ids(engine, t) for t in TOPICS)
        first = gen(engine, a, "alice")
        k0, v0 = prompt_kv(engine, a, "alice")
        assert k0.shape[1] == full_blocks(a)
        gen(engine, b, "bob")
        gen(engine, c, "carol")  # the pool cannot hold alice's blocks any more
        assert pool_hit(engine, a, "alice") < full_blocks(a)
        assert engine.kv_tier.session_files("alice")

        again = gen(engine, a, "alice")
        assert again.text == first.text and again.token_ids == first.token_ids
        assert again.cached_tokens == full_blocks(a)
        stats = engine.stats().extra
        assert stats["tier_hits"] > 0 and stats["tier_loaded_tokens"] > 0
        k1, v1 = prompt_kv(engine, a, "alice")
        assert torch.equal(k0, k1) and torch.equal(v0, v1)  # bit-identical

        # another session with the very same text gets no tier hit
        hits = engine.stats().extra["tier_hits"]
        other = gen(engine, a, "mallory")
        assert other.cached_tokens == 0 and other.text == first.text
        assert engine.stats().extra["tier_hits"] == hits

        # deleting the session removes its files and its cached blocks
        assert engine.delete_session_kv("alice") > 0
        assert engine.kv_tier.session_files("alice") == []
        assert not engine.kv_tier.session_dir("alice").exists()
        assert gen(engine, a, "alice").cached_tokens == 0
    finally:
        engine.close()


RESTORE = """
import json, sys, torch
from suffixmem.engine import create_engine
from suffixmem.engine.protocol import Request, SamplingParams
opts, ids, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
e = create_engine("torch", **opts)
r = e.generate(Request("alice", token_ids=ids, sampling=SamplingParams(max_tokens=8,
                                                                     temperature=0.0)))
def read(e):
    m = e.block_pool.match(ids, "alice")
    slots = [b * 16 + s for b in m.block_ids for s in range(16)]
    return e.kv_pool.read(torch.tensor(slots, dtype=torch.long))
k, v = e.run_in_driver(read)
torch.save({"k": k, "v": v}, out + ".pt")
json.dump({"text": r.text, "cached": r.cached_tokens,
           "hits": e.stats().extra["tier_hits"]}, open(out, "w"))
e.close()
"""


def test_new_process_restores_and_a_flipped_byte_is_recomputed(tmp_path: Path) -> None:
    opts = engine_options(tmp_path / "kv")
    engine = create_engine("torch", **opts)
    try:
        a = prompt_ids(engine, TOPICS[0])
        first = gen(engine, a, "alice")
        k0, v0 = prompt_kv(engine, a, "alice")
        hashes = engine.block_pool.block_hashes(a, "alice")
    finally:
        engine.close()  # writes the pool's cached blocks to the tier
    tier_files = sorted((tmp_path / "kv").rglob("*.kv"))
    assert len(tier_files) >= full_blocks(a) // BS

    out = tmp_path / "restored.json"
    subprocess.run([sys.executable, "-c", RESTORE, json.dumps(opts), json.dumps(a), str(out)],
                   check=True, timeout=300)
    got = json.loads(out.read_text())
    assert got["text"] == first.text
    assert got["cached"] == full_blocks(a) and got["hits"] == full_blocks(a) // BS
    kv = torch.load(str(out) + ".pt")
    assert torch.equal(kv["k"], k0) and torch.equal(kv["v"], v0)

    # flip one byte in the file of alice's third block: blocks 0-1 load, the rest recomputes
    engine = create_engine("torch", **opts)
    try:
        third = engine.kv_tier.session_dir("alice") / f"{engine.kv_tier.key(hashes[2])}.kv"
        data = bytearray(third.read_bytes())
        data[len(data) // 3] ^= 0x10
        third.write_bytes(bytes(data))
        again = gen(engine, a, "alice")
        assert again.text == first.text
        assert again.cached_tokens == 2 * BS
        assert engine.stats().extra["tier_corrupt"] == 1
        assert not third.exists()
        k1, v1 = prompt_kv(engine, a, "alice")  # recomputed: the same KV as the first run
        assert torch.equal(k1, k0) and torch.equal(v1, v0)
    finally:
        engine.close()


def test_tier_keeps_its_byte_budget(tmp_path: Path) -> None:
    per_block = KVPool.bytes_per_block(30, 3, 64, BS, torch.float32)
    budget_gib = 12 * per_block / (1 << 30)  # about 11 block files (headers take a little)
    engine = create_engine("torch", **engine_options(tmp_path, kv_tier_gib=budget_gib))
    try:
        for topic, session in zip(TOPICS, ("alice", "bob", "carol"), strict=True):
            gen(engine, prompt_ids(engine, topic), session)
        tier = engine.kv_tier
        budget = int(budget_gib * (1 << 30))
        assert tier.stats.writes > 11 and tier.stats.evictions > 0
        assert 0 < tier.num_bytes <= budget
        assert sum(f.stat().st_size for f in tmp_path.rglob("*.kv")) == tier.num_bytes
    finally:
        engine.close()
    assert sum(f.stat().st_size for f in tmp_path.rglob("*.kv")) <= budget
