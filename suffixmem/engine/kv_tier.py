"""The KV tier: full KV blocks kept on disk after they leave an engine's pool.

Pure Python (no torch): a block's KV comes in and goes out as ``bytes``; the engine glue
(``engine/torch/tier_hook.py``) turns tensors into bytes and back.

Contract:
- A block is stored under the engine's own salted chained block hash *and* the model
  fingerprint (``model_fingerprint``): the file's key is BLAKE2b(fingerprint, block hash), and
  the file sits in ``<root>/<fingerprint>/<session digest>/``. A block can never be read for
  another session (the hash chains the salt, and ``get`` re-checks the stored parent hash,
  token ids and salt digest) nor another model, dtype or block size (another fingerprint).
- Writes are atomic: a temp file (created mode 0600 by ``mkstemp``) in the same folder, then
  ``os.replace``. A crash leaves at most a ``*.tmp`` file, removed at the next start.
- Every file ends in a BLAKE2b-256 checksum of everything before it; ``get`` returns the
  payload only after the checksum and the stored key match. A corrupt or truncated file is
  deleted and ``get`` returns ``None`` (its tokens are recomputed, never used).
- ``delete_session(salt)`` removes the session's folder: deleting a session deletes its KV.
- The tier holds at most ``budget_bytes``: over budget, ``put`` evicts least recently used
  files first; the retention policy (``suffixmem.retention``) decides per block whether it is
  kept at all (``Tier.NONE``) or pinned (evicted only when nothing else is left).
- A new process on the same root rebuilds the index from the files (LRU order from their
  mtimes, which ``get`` refreshes), so a restarted engine restores sessions.

Not thread-safe: the engine's driver thread owns it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixmem.retention import RetentionPolicy, SegmentFeatures, Tier, make_policy

log = logging.getLogger(__name__)

FORMAT = 1
MAGIC = b"SMKVTIER"
_SUM = 32  # bytes of the trailing BLAKE2b-256 checksum
_HEAD = struct.Struct(">8sHI")  # magic, format, header length


def model_fingerprint(model_dir: Path, *parts: object) -> str:
    """Hex digest naming a model's KV layout: its ``config.json``, the names and sizes of its
    weight files, and ``parts`` (dtype, block size...). Any change gives another tier folder."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"suffixmem-kv-tier/{FORMAT}".encode())
    config = model_dir / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    for p in parts:
        h.update(b"\x00" + str(p).encode())
    return h.hexdigest()


def salt_digest(salt: str) -> str:
    """The session folder's name: a digest, so that session keys never appear in paths."""
    return hashlib.blake2b(salt.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass(slots=True)
class _Entry:
    path: Path
    size: int
    pinned: bool = False


@dataclass(slots=True)
class TierStats:
    writes: int = 0  # block files written
    hits: int = 0  # blocks loaded instead of recomputed
    misses: int = 0  # blocks looked up and not found
    corrupt: int = 0  # files whose checksum or header did not match (deleted, recomputed)
    evictions: int = 0  # files deleted to keep the byte budget
    load_ms: list[float] | None = None

    def __post_init__(self) -> None:
        self.load_ms = [] if self.load_ms is None else self.load_ms


class KVTier:
    """Index + files of one model's KV blocks under ``root`` (see the module docstring)."""

    def __init__(self, root: Path | str, fingerprint: str, budget_bytes: int,
                 policy: RetentionPolicy | str | None = None) -> None:
        if budget_bytes < 1:
            from suffixmem.errors import ConfigError

            raise ConfigError(f"kv_tier_gib must be > 0, got a budget of {budget_bytes} bytes")
        self.fingerprint = fingerprint
        self.dir = Path(root) / fingerprint
        self.budget_bytes = int(budget_bytes)
        if policy is None or isinstance(policy, str):
            policy = make_policy(policy or "pinned-lru")
        self.policy = policy
        self.stats = TierStats()
        self._index: OrderedDict[str, _Entry] = OrderedDict()  # LRU first
        self.num_bytes = 0
        self._failures_told: set[int | None] = set()  # errnos of write failures logged
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._scan()

    def write_failed(self, error: OSError) -> None:
        """Say once per kind (errno) that blocks cannot be written: a full disk fails every
        block of every turn, and a traceback per block buried the one fact that matters. The
        turn goes on without its tier copy."""
        if error.errno in self._failures_told:
            log.debug("KV tier write failed again: %s", error)
            return
        self._failures_told.add(error.errno)
        log.warning("KV tier: cannot write blocks to %s (%s); turns go on without their tier "
                    "copy, and further failures like this one are not logged",
                    self.dir, error.strerror or error)

    # -- keys -----------------------------------------------------------------------------------
    def key(self, block_hash: bytes) -> str:
        return hashlib.blake2b(self.fingerprint.encode() + bytes(block_hash),
                               digest_size=16).hexdigest()

    def session_dir(self, salt: str) -> Path:
        return self.dir / salt_digest(salt)

    # -- read-only views ------------------------------------------------------------------------
    def __contains__(self, block_hash: bytes) -> bool:
        return self.key(block_hash) in self._index

    def __len__(self) -> int:
        return len(self._index)

    def count_run(self, block_hashes: Iterable[bytes]) -> int:
        """How many of ``block_hashes`` (a chain, in order) the index holds, from the first
        until the first miss. No file is read."""
        n = 0
        for h in block_hashes:
            if h not in self:
                break
            n += 1
        return n

    def session_files(self, salt: str) -> list[Path]:
        d = self.session_dir(salt)
        return sorted(d.glob("*.kv")) if d.is_dir() else []

    # -- writing --------------------------------------------------------------------------------
    def put(self, salt: str, block_hash: bytes, parent: bytes | None, token_ids: Sequence[int],
            payload: bytes) -> bool:
        """Store one block (atomically, mode 0600). False if already stored (its LRU position
        is refreshed) or the retention policy keeps it out."""
        key = self.key(block_hash)
        if key in self._index:
            self._index.move_to_end(key)
            return False
        decision = self.policy.decide(SegmentFeatures(num_tokens=len(token_ids),
                                                      kind="document"))
        if decision.tier is Tier.NONE or len(payload) > self.budget_bytes:
            return False
        header = json.dumps({
            "fingerprint": self.fingerprint, "hash": bytes(block_hash).hex(),
            "parent": parent.hex() if parent is not None else None,
            "salt": salt_digest(salt), "tokens": list(token_ids), "payload": len(payload),
        }).encode()
        body = _HEAD.pack(MAGIC, FORMAT, len(header)) + header + payload
        data = body + hashlib.blake2b(body, digest_size=_SUM).digest()
        d = self.session_dir(salt)
        d.mkdir(exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            path = d / f"{key}.kv"
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._index[key] = _Entry(path, len(data), decision.tier is Tier.PINNED)
        self.num_bytes += len(data)
        self.stats.writes += 1
        self._evict_over_budget()
        return True

    def _evict_over_budget(self) -> None:
        while self.num_bytes > self.budget_bytes and self._index:
            victim = next((k for k, e in self._index.items() if not e.pinned), None)
            if victim is None:  # only pinned blocks left: they go too, oldest first
                victim = next(iter(self._index))
            self._drop(victim)
            self.stats.evictions += 1

    def _drop(self, key: str) -> None:
        entry = self._index.pop(key, None)
        if entry is not None:
            self.num_bytes -= entry.size
            entry.path.unlink(missing_ok=True)

    def record_misses(self, n: int) -> None:
        """Count ``n`` blocks looked for and not held (for ``tier_hit_rate``)."""
        self.stats.misses += n

    # -- reading --------------------------------------------------------------------------------
    def get(self, salt: str, block_hash: bytes, parent: bytes | None,
            token_ids: Sequence[int]) -> bytes | None:
        """The block's payload, or ``None`` (not stored, or corrupt: then deleted)."""
        key = self.key(block_hash)
        entry = self._index.get(key)
        if entry is None:
            self.stats.misses += 1
            return None
        t0 = time.perf_counter()
        payload = self._read(entry.path, {
            "fingerprint": self.fingerprint, "hash": bytes(block_hash).hex(),
            "parent": parent.hex() if parent is not None else None,
            "salt": salt_digest(salt), "tokens": list(token_ids)})
        if payload is None:
            log.warning("KV tier file %s is corrupt or foreign: deleted, its tokens are "
                        "recomputed", entry.path.name)
            self._drop(key)
            self.stats.corrupt += 1
            return None
        self._index.move_to_end(key)
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # the LRU order survives a restart
        self.stats.hits += 1
        assert self.stats.load_ms is not None
        self.stats.load_ms.append((time.perf_counter() - t0) * 1e3)
        return payload

    @staticmethod
    def _read(path: Path, expect: dict[str, Any]) -> bytes | None:
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if len(data) < _HEAD.size + _SUM:
            return None
        body, checksum = data[:-_SUM], data[-_SUM:]
        if hashlib.blake2b(body, digest_size=_SUM).digest() != checksum:
            return None
        magic, fmt, hlen = _HEAD.unpack_from(body)
        if magic != MAGIC or fmt != FORMAT or _HEAD.size + hlen > len(body):
            return None
        try:
            header = json.loads(body[_HEAD.size:_HEAD.size + hlen])
        except ValueError:
            return None
        payload = body[_HEAD.size + hlen:]
        # the re-check: a file must hold exactly this block of this session and model
        if any(header.get(k) != v for k, v in expect.items()) or \
                header.get("payload") != len(payload):
            return None
        return payload

    # -- sessions and housekeeping --------------------------------------------------------------
    def delete_session(self, salt: str) -> int:
        """Delete every block stored for ``salt``; returns how many files."""
        d = self.session_dir(salt)
        gone = [k for k, e in self._index.items() if e.path.parent == d]
        for k in gone:
            self._drop(k)
        shutil.rmtree(d, ignore_errors=True)
        return len(gone)

    def clear(self) -> None:
        for k in list(self._index):
            self._drop(k)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _scan(self) -> None:
        """Rebuild the index from the files (a new process on the same root)."""
        found: list[tuple[float, str, _Entry]] = []
        for d in self.dir.iterdir():
            if not d.is_dir():
                continue
            for f in d.iterdir():
                if f.suffix == ".tmp":  # an interrupted write
                    f.unlink(missing_ok=True)
                elif f.suffix == ".kv":
                    st = f.stat()
                    found.append((st.st_mtime, f.stem, _Entry(f, st.st_size)))
        for _, key, entry in sorted(found, key=lambda t: t[0]):
            self._index[key] = entry
            self.num_bytes += entry.size
        self._evict_over_budget()

    def summary(self) -> dict[str, Any]:
        """Figures for ``Engine.stats().extra`` and the benchmark."""
        s = self.stats
        loads = sorted(s.load_ms or [])
        looked = s.hits + s.misses
        return {
            "tier_bytes": self.num_bytes, "tier_files": len(self._index),
            "tier_writes": s.writes, "tier_hits": s.hits, "tier_misses": s.misses,
            "tier_corrupt": s.corrupt, "tier_evictions": s.evictions,
            "tier_hit_rate": s.hits / looked if looked else 0.0,
            "tier_load_ms_p50": loads[len(loads) // 2] if loads else None,
        }
