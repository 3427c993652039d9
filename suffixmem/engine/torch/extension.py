"""The torch engine's extension API: what segment reuse, the KV tier and tests call on a
``TorchEngine`` besides the ``Engine`` protocol.

Everything here runs in the engine's driver thread (from a ``ReuseHook`` method, or from any
thread through ``engine.run_in_driver(fn)``), except the calls that say they hop there
themselves (``reset_prefix_cache``, ``delete_session_kv``).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from suffixmem.engine.torch.model_runner import RunOutput, SeqInput
from suffixmem.engine.torch.sequence import APPROX_MARK, Sequence

if TYPE_CHECKING:
    from suffixmem.config import EngineConfig
    from suffixmem.engine.kv_tier import KVTier
    from suffixmem.engine.torch.block_pool import BlockPool
    from suffixmem.engine.torch.kv_pool import KVPool
    from suffixmem.engine.torch.model_runner import ModelRunner
    from suffixmem.engine.torch.reuse_hook import ReuseHook
    from suffixmem.engine.torch.tier_hook import TorchTier

T = TypeVar("T")


class TorchExtensionAPI:
    """Mixed into ``TorchEngine`` (which owns the attributes declared here)."""

    runner: ModelRunner
    kv_pool: KVPool
    block_pool: BlockPool
    reuse: ReuseHook | None
    tier: TorchTier | None
    config: EngineConfig

    if TYPE_CHECKING:  # provided by BaseEngine, which follows this class in the MRO
        def run_in_driver(self, fn: Callable[[Any], T]) -> T: ...

    def slots(self, seq: Sequence, positions: Seq[int]) -> list[int]:
        """KV slots of ``positions`` of ``seq`` (which must own blocks covering them)."""
        return self.runner.slots(seq.block_table, positions)

    def read_kv(self, seq: Sequence, positions: Seq[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq``'s K and V at ``positions``: two ``[L, N, KV, D]`` copies (keys rotated to
        their positions)."""
        return self.kv_pool.read(torch.tensor(self.slots(seq, positions), dtype=torch.long))

    def write_kv(self, seq: Sequence, positions: Seq[int], k: torch.Tensor,
                 v: torch.Tensor) -> None:
        """Store ``k, v [L, N, KV, D]`` (keys already rotated to ``positions``) in ``seq``."""
        self.kv_pool.write_all(torch.tensor(self.slots(seq, positions), dtype=torch.long), k, v)

    def run_forward(self, inputs: Seq[SeqInput], entropy_layers: Seq[int] = ()) -> RunOutput:
        """The runner's generic forward (see ``ModelRunner.forward``)."""
        return self.runner.forward(inputs, entropy_layers)

    @property
    def kv_tier(self) -> KVTier | None:
        """The engine's ``KVTier`` (None without ``EngineConfig.kv_tier``)."""
        return self.tier.tier if self.tier is not None else None

    def reset_prefix_cache(self) -> int:
        """Forget every cached block not in use; returns how many (hops to the driver)."""
        return int(self.run_in_driver(lambda e: e.block_pool.reset()))

    def release_session(self, session_key: str) -> int:
        """Drop the session's cached segments (a topic jump, the end of a session); returns how
        many. Prefix blocks stay: they are salted by session and simply age out of the LRU."""
        release = getattr(self.reuse, "release_session", None)
        return int(release(session_key)) if release is not None else 0

    def reuse_passes_gate(self, workload: str) -> bool:
        """Whether segment reuse, with its method (``EngineConfig.segment_method``) in the
        dtype this engine serves, passed the quality gate for ``workload``
        (``blend.GATE_PASSED``); False without segment reuse."""
        from suffixmem.engine.reuse.blend import gate_passed

        blend = getattr(self.reuse, "blend", None)  # a hook of our own names its method
        return blend is not None and gate_passed(workload, blend, self.config.dtype)

    def delete_session_kv(self, session_key: str) -> int:
        """Forget everything the engine keeps of a deleted session: its cached segments, its
        prefix blocks in the pool (exact and approximate) and its KV tier files (hops to the
        driver), so a session re-created under that id starts cold. In ``app`` scope its
        blocks are the tenant's, shared with its other sessions, and stay. Returns the tier
        files removed."""
        self.release_session(session_key)
        tier = self.tier

        def forget(e: Any) -> int:
            if tier is not None:  # the pool's blocks too, without spilling them
                return int(tier.delete_session(session_key))
            e.block_pool.forget((session_key, session_key + APPROX_MARK))
            return 0

        return int(self.run_in_driver(forget))
