"""The plug-in point for segment reuse in the torch engine.

An object set as ``TorchEngine.reuse`` is called in the engine's driver thread, for requests with
``request.segments and not request.exact``, after the sequence got its blocks (prefix-cache hit
revived, the rest freshly allocated) and before its prefill:

    outcome = hook.apply(engine, seq, request)

At that point ``seq.token_ids`` is the prompt, ``seq.block_table`` covers every prompt position,
``seq.num_computed`` (== ``seq.num_cached_tokens``) leading positions hold prefix-cache K/V and
``seq.pending`` is ``[num_computed, ..., len(prompt) - 1]``. The hook may write K/V into any of the
pending positions' slots (``engine.write_kv(seq, positions, k, v)``, keys already rotated to
those positions, e.g. with ``rope.rerotate``) and returns which positions still need computing.
The engine then prefills exactly ``outcome.pending``: each computed token attends, by position,
to every position before it, reused or not.

If the hook also has ``after_prefill(engine, seq, request) -> None``, it is called right after
that prefill (all prompt K/V now in ``seq``'s blocks; read them with ``engine.read_kv``), before
the first token is sampled: the place to store a segment's fresh K/V.

A hook must not keep references to ``seq``'s blocks without ``engine.block_pool.incref``.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from suffixmem.engine.isolation import IsolationPolicy
    from suffixmem.engine.protocol import Request
    from suffixmem.engine.torch.block_pool import BlockPool
    from suffixmem.engine.torch.model_runner import ModelRunner
    from suffixmem.engine.torch.sequence import Sequence

T = TypeVar("T")


class ReuseEngine(Protocol):
    """What a hook may use of the engine (``TorchEngine`` implements it). Declared here so that
    hooks never import the engine module: the engine imports this one."""

    block_size: int
    block_pool: BlockPool
    runner: ModelRunner
    model: Any
    reuse: Any
    isolation: IsolationPolicy

    def run_in_driver(self, fn: Callable[[Any], T]) -> T: ...

    def write_kv(self, seq: Sequence, positions: Seq[int], k: Any, v: Any) -> None: ...

    def read_kv(self, seq: Sequence, positions: Seq[int]) -> tuple[Any, Any]: ...


@dataclass(slots=True, frozen=True)
class ReuseOutcome:
    """What segment reuse did for one sequence.

    - ``pending``: prompt positions still to compute, ascending, a subset of ``seq.pending`` that
      must contain the last prompt position (its logits give the first token). Positions of
      ``seq.pending`` left out must have had their K/V written by the hook.
    - ``reused_tokens``: prompt tokens whose K/V was reused (goes to
      ``Result.reused_segment_tokens`` and counts in ``Result.cached_tokens``).
    - ``recomputed_tokens``: tokens inside reused segments that were recomputed anyway (first k,
      top-r deviating); ``Result.recomputed_tokens``.
    - ``reused_spans``: the prompt spans ``[start, end)`` taken from the segment cache
      (``Result.reused_segments``).
    """

    pending: tuple[int, ...]
    reused_tokens: int = 0
    recomputed_tokens: int = 0
    reused_spans: tuple[tuple[int, int], ...] = ()


@runtime_checkable
class ReuseHook(Protocol):
    """Segment reuse, as the torch engine calls it (see the module docstring)."""

    def apply(self, engine: ReuseEngine, seq: Sequence, request: Request) -> ReuseOutcome:
        ...
