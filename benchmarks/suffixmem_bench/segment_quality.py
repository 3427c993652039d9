"""Measuring segment reuse against full recomputation: teacher-forced quality on the engine's
primitives (``Llama`` + ``place_segments`` over a private pool), and time to first token through
``TorchEngine``. Used by ``bench segments`` (``segments.py``) and its scenarios.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from suffixmem_bench.segment_prompts import BenchPrompt


# -- quality on the primitives -----------------------------------------------------------------
@dataclass(slots=True)
class _Rig:
    runner: Any
    blocks: Any

    def alloc(self, n: int) -> list[int]:
        return self.blocks.allocate(-(-n // self.blocks.block_size))


def make_rig(llama: Any, max_tokens: int, runs: int = 4) -> _Rig:
    """A private paged pool and runner over ``llama`` for ``runs`` sequences of at most
    ``max_tokens`` tokens alive at once."""
    from suffixmem.engine.torch.block_pool import BlockPool
    from suffixmem.engine.torch.kv_pool import KVPool
    from suffixmem.engine.torch.model_runner import ModelRunner

    c, bs = llama.config, 16
    num_blocks = runs * (-(-max_tokens // bs)) + 8  # e.g. fill + reference + one reuse run
    kv = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, bs, num_blocks, llama.dtype)
    return _Rig(ModelRunner(llama, kv, max_tokens + 8), BlockPool(num_blocks, bs))


@dataclass(slots=True)
class _Quality:
    kl: list[float] = field(default_factory=list)
    top1: list[float] = field(default_factory=list)
    free: list[float] = field(default_factory=list)


def compare(ref: Any, got: Any) -> tuple[float, float, float]:
    """(mean KL(ref || got), top-1 agreement, free-running agreement) of ``[T, V]`` logits."""
    import torch

    lp, lq = torch.log_softmax(ref.float(), -1), torch.log_softmax(got.float(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0)
    agree = ref.argmax(-1) == got.argmax(-1)
    miss = (~agree).nonzero()
    first = int(miss[0]) if len(miss) else len(agree)
    return float(kl.mean()), float(agree.float().mean()), first / len(agree)


def greedy_reference(rig: Any, ids: Sequence[int], continuation: int
                     ) -> tuple[Any, Any, list[int]]:
    """Full recomputation of ``ids`` and its greedy continuation: ``(block_table, [T, V] step
    logits, continuation tokens)``. Feeding a run its own greedy tokens is teacher forcing with
    them, so its step logits are the reference's. The caller ``decref``s the block table."""
    import torch

    from suffixmem.engine.reuse.placement import forward_layers

    n = len(ids)
    bt = rig.alloc(n + continuation)
    steps = [forward_layers(rig.runner, bt, ids, range(n), n, want_logits=True)[-1:]]
    cont = [int(steps[-1][-1].argmax())]
    for t in range(continuation - 1):
        steps.append(forward_layers(rig.runner, bt, [cont[-1]], [n + t], n + t + 1,
                                    want_logits=True))
        cont.append(int(steps[-1][-1].argmax()))
    return bt, torch.cat(steps), cont


def measure_quality(
    llama: Any, prompts: Sequence[BenchPrompt], grid: Sequence[tuple[int, float]],
    continuation: int = 64, check_layers: tuple[int, ...] = (1,),
) -> dict[tuple[int, float], _Quality]:
    """Quality of every grid setting on every prompt against full recomputation."""
    import torch

    from suffixmem.engine.reuse.blend import BlendConfig
    from suffixmem.engine.reuse.placement import SegmentSource, forward_layers, place_segments

    longest = max(max(len(p.ids), len(p.fill_ids)) for p in prompts) + continuation
    rig = make_rig(llama, longest)
    runner = rig.runner
    results = {g: _Quality() for g in grid}
    for p in prompts:
        n = len(p.ids)
        fill_bt = rig.alloc(len(p.fill_ids))
        forward_layers(runner, fill_bt, p.fill_ids, range(len(p.fill_ids)), len(p.fill_ids))
        ref_bt, ref, cont = greedy_reference(rig, p.ids, continuation)
        for k, r in grid:
            bt = rig.alloc(n + continuation)
            sources = [
                SegmentSource(a, tuple(runner.slots(fill_bt, range(fa, fb))), fa)
                for (a, _), (fa, fb) in zip(p.segments, p.fill_segments, strict=True)
            ]
            pl = place_segments(runner, bt, p.ids, 0, sources,
                                BlendConfig(first_k=k, ratio=r, check_layers=check_layers))
            first = forward_layers(runner, bt, [p.ids[i] for i in pl.compute_positions],
                                   pl.compute_positions, n, want_logits=True)[-1:]
            rest = forward_layers(runner, bt, cont[:-1], range(n, n + continuation - 1),
                                  n + continuation - 1, want_logits=True)
            kl, top1, free = compare(ref, torch.cat([first, rest]))
            q = results[(k, r)]
            q.kl.append(kl)
            q.top1.append(top1)
            q.free.append(free)
            rig.blocks.decref(bt)
        rig.blocks.decref(ref_bt)
        rig.blocks.decref(fill_bt)
    return results


# -- time to first token through the engine ---------------------------------------------------
def measure_ttft(
    engine: Any, prompts: Sequence[BenchPrompt], grid: Sequence[tuple[int, float]],
    repeats: int = 2, check_layers: tuple[int, ...] = (1,),
) -> tuple[dict[tuple[int, float], float], float]:
    """Median TTFT (s) of each grid setting and of exact mode, over prompts (each prompt's
    figure is the best of ``repeats``). Every request runs in a fresh session; the segments are
    shared so that the fill run's entries serve every later session."""
    from suffixmem.engine.protocol import Request, SamplingParams, Segment
    from suffixmem.engine.reuse.blend import BlendConfig
    from suffixmem.engine.reuse.hook import SegmentReuseHook

    one = SamplingParams(max_tokens=1)
    tag = f"{time.monotonic_ns():x}"
    hook = SegmentReuseHook.install(engine)
    try:
        engine.generate(Request(f"warm-{tag}", token_ids=prompts[0].ids[:64], sampling=one))
        per: dict[tuple[int, float] | None, list[float]] = {g: [] for g in grid}
        per[None] = []
        for i, p in enumerate(prompts):
            fill = tuple(Segment(a, b, kind="document", shared=True) for a, b in p.fill_segments)
            engine.generate(Request(f"fill-{tag}-{i}", token_ids=p.fill_ids, segments=fill,
                                    exact=False, sampling=one))
            segs = tuple(Segment(a, b, kind="document", shared=True) for a, b in p.segments)
            best: dict[tuple[int, float] | None, float] = {}
            for rep in range(repeats):
                for g in [None, *grid]:  # interleaved, so that load spikes hit all alike
                    if g is not None:
                        hook.blend = BlendConfig(first_k=g[0], ratio=g[1],
                                                 check_layers=check_layers)
                    res = engine.generate(Request(
                        f"q-{tag}-{i}-{rep}-{g}", token_ids=p.ids, segments=segs,
                        exact=g is None, sampling=one))
                    if g is not None and res.reused_segment_tokens == 0:
                        raise RuntimeError("segment reuse did not happen in the TTFT run")
                    best[g] = min(best.get(g, float("inf")), res.ttft_s)
            for g, t in best.items():
                per[g].append(t)
        exact = statistics.median(per.pop(None))
        return {g: statistics.median(ts) for g, ts in per.items()}, exact  # type: ignore[misc]
    finally:
        engine.run_in_driver(lambda _e: hook.cache.clear())
        engine.reuse = None
