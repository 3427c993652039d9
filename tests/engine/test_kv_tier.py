"""The KV tier's index and files (pure Python, no model): keys, atomic 0600 files, checksums,
isolation, deletion, the byte budget and a restart."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from suffixmem.engine.kv_tier import KVTier, salt_digest
from suffixmem.engine.torch.block_pool import hash_block
from suffixmem.errors import ConfigError
from suffixmem.retention import SecondHit

FP = "f" * 32
TOKENS = tuple(range(16))


def block(salt: str, tokens: tuple[int, ...] = TOKENS, parent: bytes | None = None,
          fill: int = 7, size: int = 1000) -> tuple[str, bytes, bytes | None, tuple[int, ...],
                                                    bytes]:
    return salt, hash_block(parent, tokens, salt), parent, tokens, bytes([fill]) * size


def test_put_get_round_trip_with_mode_0600(tmp_path: Path) -> None:
    tier = KVTier(tmp_path, FP, 1 << 20)
    salt, h, parent, toks, payload = block("alice")
    assert tier.put(salt, h, parent, toks, payload)
    assert not tier.put(salt, h, parent, toks, payload)  # already stored
    assert tier.get(salt, h, parent, toks) == payload
    (f,) = tier.session_files("alice")
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert f.parent.name == salt_digest("alice")  # the session key never appears in a path
    assert "alice" not in str(f)
    assert not list(f.parent.glob("*.tmp"))
    assert tier.summary()["tier_hits"] == 1


def test_another_session_with_the_same_text_gets_nothing(tmp_path: Path) -> None:
    tier = KVTier(tmp_path, FP, 1 << 20)
    tier.put(*block("alice"))
    _, h_bob, _, toks, _ = block("bob")
    assert h_bob not in tier
    assert tier.get("bob", h_bob, None, toks) is None
    # a file planted under bob's key but holding alice's block fails the re-check
    _, h_alice, _, _, _ = block("alice")
    (f,) = tier.session_files("alice")
    forged = tier.session_dir("bob")
    forged.mkdir()
    os.link(f, forged / f"{tier.key(h_bob)}.kv")
    tier2 = KVTier(tmp_path, FP, 1 << 20)  # a restart indexes the planted file
    assert h_bob in tier2
    assert tier2.get("bob", h_bob, None, toks) is None
    assert tier2.summary()["tier_corrupt"] == 1
    assert tier2.get("alice", h_alice, None, toks) == bytes([7]) * 1000


def test_another_model_gets_nothing(tmp_path: Path) -> None:
    KVTier(tmp_path, FP, 1 << 20).put(*block("alice"))
    other = KVTier(tmp_path, "0" * 32, 1 << 20)
    _, h, _, toks, _ = block("alice")
    assert h not in other and other.get("alice", h, None, toks) is None


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_file_is_detected_and_deleted(tmp_path: Path, damage: str) -> None:
    tier = KVTier(tmp_path, FP, 1 << 20)
    salt, h, parent, toks, payload = block("alice")
    tier.put(salt, h, parent, toks, payload)
    (f,) = tier.session_files("alice")
    data = bytearray(f.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[:-100]
    f.write_bytes(bytes(data))
    assert tier.get(salt, h, parent, toks) is None
    assert not f.exists() and h not in tier
    assert tier.summary()["tier_corrupt"] == 1 and tier.num_bytes == 0


def test_delete_session_removes_its_files_only(tmp_path: Path) -> None:
    tier = KVTier(tmp_path, FP, 1 << 20)
    for i in range(3):
        tier.put(*block("alice", tokens=tuple(range(i, i + 16))))
    tier.put(*block("bob"))
    assert tier.delete_session("alice") == 3
    assert tier.session_files("alice") == [] and not tier.session_dir("alice").exists()
    assert len(tier.session_files("bob")) == 1 and len(tier) == 1


def test_over_budget_evicts_least_recently_used_and_keeps_the_budget(tmp_path: Path) -> None:
    blocks = [block(f"s{i}") for i in range(6)]
    one = None
    tier = KVTier(tmp_path, FP, 10 ** 9)
    tier.put(*blocks[0])
    one = tier.num_bytes
    tier.clear()
    tier = KVTier(tmp_path, FP, 3 * one + 10)  # room for three files
    for b in blocks[:3]:
        tier.put(*b)
    salt, h, parent, toks, _ = blocks[0]
    assert tier.get(salt, h, parent, toks) is not None  # s0 is now the most recent
    for b in blocks[3:]:
        tier.put(*b)
        assert tier.num_bytes <= tier.budget_bytes
    held = {b[0] for b in blocks if b[1] in tier}
    assert held == {"s3", "s4", "s5"}
    assert sum(f.stat().st_size for f in tmp_path.rglob("*.kv")) == tier.num_bytes
    assert tier.summary()["tier_evictions"] == 3


def test_restart_rebuilds_the_index_and_removes_interrupted_writes(tmp_path: Path) -> None:
    tier = KVTier(tmp_path, FP, 1 << 20)
    salt, h, parent, toks, payload = block("alice")
    tier.put(salt, h, parent, toks, payload)
    (tier.session_dir("alice") / "x.tmp").write_bytes(b"half")
    again = KVTier(tmp_path, FP, 1 << 20)
    assert again.num_bytes == tier.num_bytes
    assert again.get(salt, h, parent, toks) == payload
    assert not (tier.session_dir("alice") / "x.tmp").exists()


def test_policy_can_keep_blocks_out_and_budget_is_validated(tmp_path: Path) -> None:
    tier = KVTier(tmp_path, FP, 1 << 20, policy=SecondHit())  # first sightings: not admitted
    assert not tier.put(*block("alice")) and len(tier) == 0
    with pytest.raises(ConfigError, match="kv_tier_gib"):
        KVTier(tmp_path, FP, 0)
    with pytest.raises(ConfigError, match="retention policy"):
        KVTier(tmp_path, FP, 1 << 20, policy="nope")


def test_write_failures_are_told_once_per_kind(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A full disk fails every block of every turn: the engines' hooks say it once, in one
    line naming the folder and the cause, instead of a traceback per block."""
    tier = KVTier(tmp_path, FP, 1 << 20)
    tier.session_dir("alice").write_bytes(b"")  # a file where the session's folder belongs
    caplog.set_level("DEBUG", logger="suffixmem.engine.kv_tier")
    for fill in range(3):
        salt, h, parent, toks, payload = block("alice", fill=fill, tokens=(fill, *TOKENS[1:]))
        with pytest.raises(OSError) as e:
            tier.put(salt, h, parent, toks, payload)
        tier.write_failed(e.value)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(tier.dir) in warnings[0].getMessage()
    assert warnings[0].exc_info is None and "\n" not in warnings[0].getMessage()
    assert len(caplog.records) == 3  # the others at debug level
