"""The KV tier in the embedded vLLM engine (our ``SuffixmemTierConnector``), on the real model:
a session whose blocks left vLLM's pool is restored from the tier with bit-identical KV and the
same greedy text; a new process restores it; a flipped byte (in that process, its pool reset) is
detected and recomputed; another session with the same text gets nothing; deleting the session
removes its files; the tier keeps its byte budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from suffixmem.engine import create_engine
from suffixmem.engine.protocol import Request, Result, SamplingParams

pytestmark = pytest.mark.slow

BS = 32  # vLLM's CPU block size


def prompt_ids(engine: Any) -> list[int]:
    text = " ".join(f"Sentence {i} of a story about a lighthouse keeper, told slowly."
                    for i in range(18))
    return engine.tokenize(text)


def gen(engine: Any, ids: list[int], session: str) -> Result:
    return engine.generate(Request(session, token_ids=ids,
                                   sampling=SamplingParams(max_tokens=8, temperature=0.0)))


def full_blocks(ids: list[int]) -> int:
    return (len(ids) - 1) // BS * BS


RESTORE = """
import json, sys
from pathlib import Path
from suffixmem.engine import create_engine
from suffixmem.engine.protocol import Request, SamplingParams
tier_dir, ids, out, flip = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
e = create_engine("vllm", max_model_len=1024, kv_tier=True, kv_tier_dir=tier_dir)
got, before = [], {"tier_hits": 0, "tier_corrupt": 0}
for run in ("restored", "flipped"):
    if run == "flipped":  # the pool forgets; one byte of the named block's file flips
        e.reset_prefix_cache()
        path = Path(flip)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x04
        path.write_bytes(bytes(data))
    r = e.generate(Request("alice", token_ids=ids, sampling=SamplingParams(max_tokens=8,
                                                                         temperature=0.0)))
    x = e.stats().extra
    got.append({"text": r.text, "cached": r.cached_tokens,
                "hits": x["tier_hits"] - before["tier_hits"],
                "corrupt": x["tier_corrupt"] - before["tier_corrupt"]})
    before = dict(x)
json.dump(got, open(out, "w"))
e.close()
"""


def restore_in_new_process(tier_dir: Path, ids: list[int], out: Path, flip: Path
                           ) -> list[dict[str, Any]]:
    """A new process restores alice's session from the tier, then, its pool reset, again with
    one byte of ``flip`` changed first: each run's text, cached tokens and tier counts."""
    subprocess.run([sys.executable, "-c", RESTORE, str(tier_dir), json.dumps(ids), str(out),
                    str(flip)], check=True, timeout=400)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_vllm_tier_restore_isolation_restart_corruption_delete(tmp_path: Path) -> None:
    from suffixmem.engine.vllm_tier_connector import read_block, shared_tier

    tier_dir = tmp_path / "kv"
    engine = create_engine("vllm", max_model_len=1024, kv_tier=True, kv_tier_dir=str(tier_dir))
    try:
        ids = prompt_ids(engine)
        first = gen(engine, ids, "alice")
        assert first.cached_tokens == 0
        tier = engine.kv_tier
        assert len(tier.session_files("alice")) == len(ids) // BS  # written when it finished
        # vLLM's pool forgets the session (as eviction would); the tier brings it back
        assert engine.reset_prefix_cache() == 1
        again = gen(engine, ids, "alice")
        assert again.cached_tokens == full_blocks(ids)
        assert again.text == first.text and again.token_ids == first.token_ids
        shared = shared_tier(engine._tier_extra)
        assert len(shared.last_loads) == full_blocks(ids) // BS
        for j, (block_id, h) in enumerate(shared.last_loads):
            parent = shared.last_loads[j - 1][1] if j else None
            stored = tier.get("alice", h, parent, ids[j * BS:(j + 1) * BS])
            # the pool's KV after the load is bit for bit what the first run computed
            assert engine.run_in_driver(lambda e, b=block_id: read_block(shared, b)) == stored

        hits = engine.stats().extra["tier_hits"]
        other = gen(engine, ids, "mallory")  # same text, another session: no tier hit
        assert other.cached_tokens == 0 and engine.stats().extra["tier_hits"] == hits
        assert engine.delete_session_kv("mallory") > 0
        assert tier.session_files("mallory") == [] and tier.session_files("alice")
    finally:
        engine.close()

    # alice's third block, whose file the new process damages after its first restore
    files = {f.name: f for f in (tier_dir).rglob("*.kv")}
    from suffixmem.engine.kv_tier import KVTier

    probe = KVTier(tier_dir, next(tier_dir.iterdir()).name, 1 << 30)
    third = None
    for f in files.values():
        data = f.read_bytes()
        header = json.loads(data[14:14 + int.from_bytes(data[10:14], "big")])
        if header["tokens"] == ids[2 * BS:3 * BS]:
            third = f
    assert third is not None and len(probe) == len(files)
    original = third.read_bytes()
    restored, flipped = restore_in_new_process(tier_dir, ids, tmp_path / "runs.json", third)
    assert restored == {"text": first.text, "cached": full_blocks(ids),
                        "hits": full_blocks(ids) // BS, "corrupt": 0}
    # one flipped byte in alice's third block: two blocks load, the rest is recomputed
    assert flipped == {"text": first.text, "cached": 2 * BS, "hits": 2, "corrupt": 1}
    # the damaged file was deleted, the block recomputed and written again: bit-identical,
    # except on a CPU with AMX, where oneDNN picks its bf16 kernels by the batch's shape (the
    # restart computes from the third block on) and the last bits may differ
    rewritten = third.read_bytes()
    if _header(rewritten)["tokens"] != ids[2 * BS:3 * BS] or len(rewritten) != len(original):
        pytest.fail("the recomputed third block was not written again")
    if not torch.cpu._is_amx_tile_supported():
        assert rewritten == original


def _header(data: bytes) -> dict[str, Any]:
    return json.loads(data[14:14 + int.from_bytes(data[10:14], "big")])
