"""Segment-reuse quality per construction, in the serving dtype: ``bench segments`` scenarios.

Three ways the cached segments came to be, the same evaluated prompt
``[system + dialogue][Document 1][Document 2][question]``:

- ``same_context``: the documents were computed once behind the same system prompt and another
  dialogue, in the same order (the favourable case);
- ``independent``: each document was computed alone right after the system prompt (the way a
  RAG chunk cache fills);
- ``reordered``: both documents were computed behind another dialogue in the swapped order.

Per scenario, against full recomputation of the evaluated prompt:

- ``mean_kl`` / ``top1_agreement``: teacher-forced over the reference's greedy continuation, on
  the engine's own primitives (``Llama`` + ``place_segments``) in the serving dtype (bf16);
- ``free_running_agreement``: share of the reference's greedy continuation (``continuation``
  tokens) the reuse run reproduces before its first divergence, both through ``TorchEngine``;
- ``task_agreement``: the question asks which module a document describes; the share of prompts
  where the reuse run's answer (its first line, lower-cased, whitespace-normalised) equals the
  exact run's;
- ``ttft_speedup``: the engine's TTFT in exact mode over that with reuse, medians over prompts.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from suffixmem_bench.corpus import reference_text, stdlib_paragraphs
from suffixmem_bench.segments import SYSTEM, _compare, chatml, dialogue_pairs

SCENARIOS: tuple[str, ...] = ("same_context", "independent", "reordered")
TASK = ("Which Python module does Document {j} describe? Answer with the module name only.")

Encode = Callable[[str], list[int]]


@dataclass(slots=True, frozen=True)
class ScenarioPrompt:
    """``ids`` with segment ``spans``; ``fills`` are the prompts that computed the segments
    first, and ``origin[i] = (fill index, start in that fill)`` says where segment ``i`` was."""

    ids: list[int]
    spans: tuple[tuple[int, int], ...]
    fills: tuple[tuple[list[int], tuple[tuple[int, int], ...]], ...]
    origin: tuple[tuple[int, int], ...]


def _head(encode: Encode, dialogue: Sequence[tuple[str, str]]) -> list[int]:
    text = chatml("system", SYSTEM)
    for q, a in dialogue:
        text += chatml("user", q) + chatml("assistant", a)
    return encode(text + "<|im_start|>user\n")


def build_scenario(encode: Encode, scenario: str, count: int = 6, segment_tokens: int = 200,
                   seed: int = 0) -> list[ScenarioPrompt]:
    """``count`` prompts of ``scenario`` (see the module docstring); the evaluated prompts are
    the same for every scenario with the same seed."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {list(SCENARIOS)}")
    rng = random.Random(seed)
    pairs = dialogue_pairs()
    n_paras = len(stdlib_paragraphs())
    out = []
    for _ in range(count):
        docs = []
        for j in range(2):
            body = reference_text(segment_tokens, lambda t: len(encode(t)),
                                  skip=rng.randrange(n_paras))
            docs.append(encode(f"Document {j + 1}:\n{body}\n\n")[:segment_tokens + 40])
        j = rng.randrange(2) + 1
        eval_dialogue = [pairs[rng.randrange(len(pairs))] for _ in range(2)]
        fill_dialogue = [pairs[rng.randrange(len(pairs))] for _ in range(2)]
        ids = _head(encode, eval_dialogue)
        spans = []
        for d in docs:
            spans.append((len(ids), len(ids) + len(d)))
            ids = ids + d
        ids = ids + encode(TASK.format(j=j) + "<|im_end|>\n<|im_start|>assistant\n")
        fills: list[tuple[list[int], tuple[tuple[int, int], ...]]] = []
        origin: list[tuple[int, int]] = []
        if scenario == "independent":
            head = encode(chatml("system", SYSTEM) + "<|im_start|>user\n")
            for i, d in enumerate(docs):
                fills.append((head + d, ((len(head), len(head) + len(d)),)))
                origin.append((i, len(head)))
        else:
            order = [0, 1] if scenario == "same_context" else [1, 0]
            fill = _head(encode, fill_dialogue)
            starts = {}
            for i in order:
                starts[i] = len(fill)
                fill = fill + docs[i]
            fill_spans = tuple((starts[i], starts[i] + len(docs[i])) for i in order)
            fills.append((fill, fill_spans))
            origin = [(0, starts[0]), (0, starts[1])]
        out.append(ScenarioPrompt(ids, tuple(spans), tuple(fills), tuple(origin)))
    return out


def scenario_quality(llama: Any, prompts: Sequence[ScenarioPrompt], blend: Any,
                     continuation: int = 64) -> dict[str, float]:
    """Teacher-forced ``mean_kl`` and ``top1_agreement`` of reuse under ``blend``, on the
    engine's primitives in ``llama``'s dtype (see the module docstring)."""
    import torch

    from suffixmem.engine.reuse.placement import SegmentSource, forward_layers, place_segments
    from suffixmem_bench.segments import _rig

    longest = max(max(len(p.ids), *(len(f) for f, _ in p.fills)) for p in prompts)
    rig = _rig(llama, longest + continuation)
    runner = rig.runner
    kls, tops = [], []
    for p in prompts:
        n = len(p.ids)
        fill_bts = []
        for f, _ in p.fills:
            bt = rig.alloc(len(f))
            forward_layers(runner, bt, f, range(len(f)), len(f))
            fill_bts.append(bt)
        ref_bt = rig.alloc(n + continuation)
        steps = [forward_layers(runner, ref_bt, p.ids, range(n), n, want_logits=True)[-1:]]
        cont = [int(steps[-1][-1].argmax())]
        for t in range(continuation - 1):
            steps.append(forward_layers(runner, ref_bt, [cont[-1]], [n + t], n + t + 1,
                                        want_logits=True))
            cont.append(int(steps[-1][-1].argmax()))
        bt = rig.alloc(n + continuation)
        sources = [SegmentSource(a, tuple(runner.slots(fill_bts[fi], range(fs, fs + b - a))), fs)
                   for (a, b), (fi, fs) in zip(p.spans, p.origin, strict=True)]
        pl = place_segments(runner, bt, p.ids, 0, sources, blend)
        first = forward_layers(runner, bt, [p.ids[i] for i in pl.compute_positions],
                               pl.compute_positions, n, want_logits=True)[-1:]
        rest = forward_layers(runner, bt, cont[:-1], range(n, n + continuation - 1),
                              n + continuation - 1, want_logits=True)
        kl, top1, _ = _compare(torch.cat(steps), torch.cat([first, rest]))
        kls.append(kl)
        tops.append(top1)
        for b in (bt, ref_bt, *fill_bts):
            rig.blocks.decref(b)
    return {"mean_kl": statistics.fmean(kls), "top1_agreement": statistics.fmean(tops)}


def _answer(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return " ".join(line.lower().split())


def scenario_engine(engine: Any, prompts: Sequence[ScenarioPrompt], blend: Any, tag: str,
                    continuation: int = 64) -> dict[str, float]:
    """``free_running_agreement``, ``task_agreement`` and ``ttft_speedup`` through
    ``engine`` (a ``TorchEngine``) with a segment-reuse hook using ``blend``."""
    from suffixmem.engine.protocol import Request, SamplingParams, Segment
    from suffixmem.engine.reuse.hook import SegmentReuseHook

    greedy = SamplingParams(max_tokens=continuation, ignore_eos=True)
    hook = SegmentReuseHook.install(engine, blend, context_shift=False)
    free, task, exact_t, reuse_t = [], [], [], []
    try:
        for i, p in enumerate(prompts):
            for fi, (f, spans) in enumerate(p.fills):
                segs = tuple(Segment(a, b, "document", shared=True) for a, b in spans)
                engine.generate(Request(f"{tag}-fill-{i}-{fi}", token_ids=f, segments=segs,
                                        exact=False, sampling=SamplingParams(max_tokens=1)))
            segs = tuple(Segment(a, b, "document", shared=True) for a, b in p.spans)
            ref = engine.generate(Request(f"{tag}-ref-{i}", token_ids=p.ids, segments=segs,
                                          exact=True, sampling=greedy))
            got = engine.generate(Request(f"{tag}-reuse-{i}", token_ids=p.ids, segments=segs,
                                          exact=False, sampling=greedy))
            if got.reused_segment_tokens == 0:
                raise RuntimeError(f"no segment was reused for prompt {i} ({tag})")
            same = 0
            for a, b in zip(ref.token_ids, got.token_ids, strict=False):
                if a != b:
                    break
                same += 1
            free.append(same / max(1, len(ref.token_ids)))
            task.append(float(_answer(ref.text) == _answer(got.text)))
            exact_t.append(ref.ttft_s)
            reuse_t.append(got.ttft_s)
    finally:
        engine.run_in_driver(lambda _e: hook.cache.clear())
        engine.reuse = None
    reuse_med = statistics.median(reuse_t)
    return {
        "free_running_agreement": statistics.fmean(free),
        "task_agreement": statistics.fmean(task),
        "ttft_speedup": statistics.median(exact_t) / reuse_med if reuse_med > 0 else 0.0,
    }


def run_scenarios(llama: Any, engine: Any, encode: Encode, blend: Any, count: int = 6,
                  segment_tokens: int = 200, continuation: int = 64, seed: int = 0,
                  scenarios: Sequence[str] = SCENARIOS) -> dict[str, dict[str, float]]:
    """``{scenario: {mean_kl, top1_agreement, free_running_agreement, task_agreement,
    ttft_speedup}}`` for ``blend`` (see the module docstring)."""
    out: dict[str, dict[str, float]] = {}
    for name in scenarios:
        prompts = build_scenario(encode, name, count, segment_tokens, seed)
        out[name] = {**scenario_quality(llama, prompts, blend, continuation),
                     **scenario_engine(engine, prompts, blend, f"sc-{name}-{seed}", continuation)}
    return out
