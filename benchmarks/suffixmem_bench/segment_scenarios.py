"""Segment-reuse quality per construction, in the serving dtype: ``bench segments`` scenarios.

Three ways the cached segments came to be, the same evaluated prompt
``[system + dialogue][Document 1][Document 2][question]``:

- ``same_context``: the documents were computed once behind the same system prompt and another
  dialogue, in the same order (the favourable case);
- ``independent``: each document was computed alone right after the system prompt (the way a
  RAG chunk cache fills);
- ``reordered``: both documents were computed behind another dialogue in the swapped order.

Every recompute method of ``METHODS`` (``BlendConfig``: first k, top r at check layers, fresh
lower layers, top q by the question's attention) is measured on the primitives
(``methods_quality``); ``choose_method`` picks the cheapest one that passes ``GATE`` on the
independent construction (else the most accurate), and that one also runs through the serving
engine. Per scenario, against full recomputation of the evaluated prompt:

- ``mean_kl`` / ``top1_agreement``: teacher-forced over the reference's greedy continuation, on
  the engine's own primitives (``Llama`` + ``place_segments``) in the serving dtype (bf16 where
  it is native);
- ``free_running_agreement``: share of the reference's greedy continuation (``continuation``
  tokens) the reuse run reproduces before its first divergence, both through ``TorchEngine``;
- ``task_agreement``: each document holds a code sentence (``The code of Document 2 is 4821.``)
  and the question asks for one document's code (``segment_task``: a question the model can
  answer, so agreement is not bf16 noise between invented answers); the share of prompts where
  the reuse run's answer (the first number in its reply) equals the exact run's.
  ``task_exact_accuracy`` / ``task_reuse_accuracy``: how often each gives the planted code;
- ``ttft_speedup``: the engine's TTFT in exact mode over that with reuse, medians over prompts.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from suffixmem_bench.corpus import reference_text, stdlib_paragraphs
from suffixmem_bench.segment_prompts import SYSTEM, chatml, dialogue_pairs
from suffixmem_bench.segment_task import (
    CODE,
    QUESTION,
    TAIL,
    answer_end,
    answer_of,
    first_line_end,
    new_code,
)

SCENARIOS: tuple[str, ...] = ("same_context", "independent", "reordered")

Encode = Callable[[str], list[int]]


@dataclass(slots=True, frozen=True)
class ScenarioPrompt:
    """``ids`` with segment ``spans``; ``fills`` are the prompts that computed the segments
    first, and ``origin[i] = (fill index, start in that fill)`` says where segment ``i`` was.
    ``answer``: the code the prompt's question asks for (``segment_task``), if it asks one."""

    ids: list[int]
    spans: tuple[tuple[int, int], ...]
    fills: tuple[tuple[list[int], tuple[tuple[int, int], ...]], ...]
    origin: tuple[tuple[int, int], ...]
    answer: str | None = None


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
    tokens = lambda text: len(encode(text))  # noqa: E731
    out = []
    for _ in range(count):
        docs, codes = [], []
        for j in range(2):
            body = reference_text(segment_tokens, tokens, skip=rng.randrange(n_paras))
            codes.append(new_code(rng))
            body = _with_code(body, CODE.format(name=f"Document {j + 1}", code=codes[-1]),
                              tokens, segment_tokens, rng)
            docs.append(encode(f"Document {j + 1}:\n{body}\n\n")[:segment_tokens + 40])
        j = rng.randrange(2) + 1
        eval_dialogue = [pairs[rng.randrange(len(pairs))] for _ in range(2)]
        fill_dialogue = [pairs[rng.randrange(len(pairs))] for _ in range(2)]
        ids = _head(encode, eval_dialogue)
        spans = []
        for d in docs:
            spans.append((len(ids), len(ids) + len(d)))
            ids = ids + d
        ids = ids + encode(QUESTION.format(name=f"Document {j}") + TAIL)
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
        out.append(ScenarioPrompt(ids, tuple(spans), tuple(fills), tuple(origin),
                                  answer=str(codes[j - 1])))
    return out


def _with_code(body: str, sentence: str, count: Callable[[str], int], limit: int,
               rng: random.Random) -> str:
    """``body`` with ``sentence`` as a paragraph of its own at a random paragraph boundary
    that lies within its first ``limit`` tokens less the sentence's (the document is cut at
    about ``limit`` tokens, and the code must stay in it)."""
    paras = body.split("\n\n")
    room = limit - count(sentence) - 8
    bounds, seen = [0], 0
    for i, para in enumerate(paras[:-1]):
        seen += count(para) + 1
        if seen > room:
            break
        bounds.append(i + 1)
    at = rng.choice(bounds)
    return "\n\n".join([*paras[:at], sentence, *paras[at:]])


METHODS: tuple[tuple[int, float, tuple[int, ...], int, float], ...] = (
    (0, 0.0, (1,), 0, 0.0),     # re-rotation only
    (16, 0.0, (1,), 0, 0.0),    # boundary: the first tokens of each segment (EPIC, sinks)
    (32, 0.0, (1,), 0, 0.0),
    (0, 0.15, (1,), 0, 0.0),    # CacheBlend: the 15% most deviating tokens at layer 1
    (16, 0.15, (1,), 0, 0.0),   # both
    (16, 0.3, (1,), 0, 0.0),
    (16, 0.5, (1,), 0, 0.0),
    (16, 0.3, (4,), 0, 0.0),    # per-layer: deviation measured deeper
    (16, 0.0, (1,), 4, 0.0),    # per-layer: the lowest 4 layers fresh for every token
    (16, 0.3, (1,), 8, 0.0),
    (16, 0.0, (1,), 0, 0.2),    # query-aware: the 20% of reused tokens the question reads most
    (16, 0.0, (1,), 0, 0.4),
    (0, 1.0, (1,), 0, 0.0),     # control: everything recomputed through the reuse path
)
"""``(first_k, ratio, check_layers, full_layers, query_ratio)`` of every recompute method
measured, cheapest families first. The control shows the harness's own numerical floor."""


def blends(methods: Sequence[tuple[int, float, tuple[int, ...], int, float]] = METHODS
           ) -> list[Any]:
    """``BlendConfig``s of ``methods``."""
    from suffixmem.engine.reuse.blend import BlendConfig

    return [BlendConfig(first_k=k, ratio=r, check_layers=c, full_layers=f, query_ratio=q)
            for k, r, c, f, q in methods]


def parse_method(label: str) -> Any:
    """The ``BlendConfig`` a ``label()`` names (``BlendConfig.parse``), or
    ``InvalidRequestError`` naming the label."""
    from suffixmem.engine.reuse.blend import BlendConfig
    from suffixmem.errors import ConfigError, InvalidRequestError

    try:
        return BlendConfig.parse(label)
    except ConfigError as e:
        raise InvalidRequestError(str(e)) from None


def methods_quality(llama: Any, prompts: Sequence[ScenarioPrompt], methods: Sequence[Any],
                    continuation: int = 64, decode: Callable[[list[int]], str] | None = None,
                    ) -> dict[str, dict[str, float]]:
    """Per ``BlendConfig`` (keyed by ``label()``), against full recomputation of each prompt,
    teacher-forced over the reference's greedy continuation on the engine's primitives in
    ``llama``'s dtype: ``mean_kl``, ``top1_agreement``, ``free_running_agreement`` (the first
    disagreement's step over the continuation: up to there both greedy runs feed the same
    tokens, so it is what a greedy reuse run reproduces), ``task_agreement`` (the share of
    prompts whose reference answer is reproduced token for token: through its number
    (``segment_task.answer_end``) when the prompt has an ``answer``, else its first line),
    ``first_line_agreement`` (the reference's first line reproduced, the task check of runs
    before the planted codes), ``task_exact_accuracy`` (prompts with an ``answer``: the share
    the exact run answers right, with ``decode``), ``task_agreement_exact_right`` /
    ``_exact_wrong`` (``by_exact``) and ``compute_share`` (the work of the reuse
    prefill, layers times tokens, over that of a full prefill). The fills and the reference
    are computed once per prompt for every method."""
    import torch

    from suffixmem.engine.reuse.placement import SegmentSource, forward_layers, place_segments
    from suffixmem_bench.segment_quality import compare, greedy_reference, make_rig

    longest = max(max(len(p.ids), *(len(f) for f, _ in p.fills)) for p in prompts)
    rig = make_rig(llama, longest + continuation, runs=max(len(p.fills) for p in prompts) + 2)
    runner = rig.runner
    layers = llama.config.num_layers
    acc: dict[str, dict[str, list[float]]] = {m.label(): {} for m in methods}
    for p in prompts:
        n = len(p.ids)
        fill_bts = []
        for f, _ in p.fills:
            bt = rig.alloc(len(f))
            forward_layers(runner, bt, f, range(len(f)), len(f))
            fill_bts.append(bt)
        ref_bt, ref, cont = greedy_reference(rig, p.ids, continuation)
        line_end = first_line_end(decode, cont)
        task_end = answer_end(decode, cont) if p.answer is not None else line_end
        scores = [] if p.answer is None or decode is None else [
            ("task_exact_accuracy", float(answer_of(decode(list(cont))) == p.answer))]
        rig.blocks.decref(ref_bt)
        for blend in methods:
            bt = rig.alloc(n + continuation)
            sources = [SegmentSource(a, tuple(runner.slots(fill_bts[fi], range(fs, fs + b - a))),
                                     fs)
                       for (a, b), (fi, fs) in zip(p.spans, p.origin, strict=True)]
            pl = place_segments(runner, bt, p.ids, 0, sources, blend)
            first = forward_layers(runner, bt, [p.ids[i] for i in pl.compute_positions],
                                   pl.compute_positions, n, want_logits=True)[-1:]
            rest = forward_layers(runner, bt, cont[:-1], range(n, n + continuation - 1),
                                  n + continuation - 1, want_logits=True)
            kl, top1, free = compare(ref, torch.cat([first, rest]))
            work = (len(pl.compute_positions) + pl.drafted) * layers + pl.checked_layers * n
            row = acc[blend.label()]
            same = round(free * continuation)  # the first disagreeing step
            for key, value in (("mean_kl", kl), ("top1_agreement", top1),
                               ("free_running_agreement", free),
                               ("task_agreement", float(same >= task_end)),
                               ("first_line_agreement", float(same >= line_end)),
                               *scores, ("compute_share", work / (n * layers))):
                row.setdefault(key, []).append(value)
            rig.blocks.decref(bt)
        for b in fill_bts:
            rig.blocks.decref(b)
    return {label: {**{k: statistics.fmean(v) for k, v in row.items()}, **by_exact(row)}
            for label, row in acc.items()}


def by_exact(row: dict[str, list[float]]) -> dict[str, float]:
    """``task_agreement`` split by whether the exact run answered right: the share of prompts
    whose answer the reuse run reproduces among those the exact run gets right
    (``task_agreement_exact_right``; losing a right answer is what costs users) and among those
    it gets wrong (``..._exact_wrong``: two runs of a model unsure of the answer, where bf16
    noise alone can flip it). Empty without per-prompt ``task_exact_accuracy``."""
    agree, right = row.get("task_agreement", []), row.get("task_exact_accuracy", [])
    if not right or len(right) != len(agree):
        return {}
    out = {}
    for key, want in (("task_agreement_exact_right", 1.0), ("task_agreement_exact_wrong", 0.0)):
        picked = [a for a, r in zip(agree, right, strict=True) if r == want]
        if picked:
            out[key] = statistics.fmean(picked)
    return out


def scenario_quality(llama: Any, prompts: Sequence[ScenarioPrompt], blend: Any,
                     continuation: int = 64) -> dict[str, float]:
    """Teacher-forced ``mean_kl`` and ``top1_agreement`` of reuse under ``blend`` (one method
    of ``methods_quality``)."""
    row = methods_quality(llama, prompts, [blend], continuation)[blend.label()]
    return {"mean_kl": row["mean_kl"], "top1_agreement": row["top1_agreement"]}


def scenario_engine(engine: Any, prompts: Sequence[ScenarioPrompt], blend: Any, tag: str,
                    continuation: int = 64) -> dict[str, float]:
    """``free_running_agreement``, ``task_agreement`` (``segment_task.answer_of`` of both
    replies equal), ``task_exact_accuracy`` / ``task_reuse_accuracy`` (prompts with an
    ``answer``: the share each run answers right) and ``ttft_speedup`` through ``engine`` (a
    ``TorchEngine``) with a segment-reuse hook using ``blend``."""
    from suffixmem.engine.protocol import Request, SamplingParams, Segment
    from suffixmem.engine.reuse.hook import SegmentReuseHook

    greedy = SamplingParams(max_tokens=continuation, ignore_eos=True)
    hook = SegmentReuseHook.install(engine, blend, context_shift=False)
    free, task, exact_t, reuse_t = [], [], [], []
    right: dict[str, list[float]] = {"task_exact_accuracy": [], "task_reuse_accuracy": []}
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
            task.append(float(answer_of(ref.text) == answer_of(got.text)))
            if p.answer is not None:
                right["task_exact_accuracy"].append(float(answer_of(ref.text) == p.answer))
                right["task_reuse_accuracy"].append(float(answer_of(got.text) == p.answer))
            exact_t.append(ref.ttft_s)
            reuse_t.append(got.ttft_s)
            # each prompt reuses its own fills only, whatever the cache's budget and policy
            engine.run_in_driver(lambda _e: hook.cache.clear())
    finally:
        engine.run_in_driver(lambda _e: hook.cache.clear())
        engine.reuse = None
    reuse_med = statistics.median(reuse_t)
    return {
        "free_running_agreement": statistics.fmean(free),
        "task_agreement": statistics.fmean(task),
        **{k: statistics.fmean(v) for k, v in right.items() if v},
        "ttft_speedup": statistics.median(exact_t) / reuse_med if reuse_med > 0 else 0.0,
    }


GATE: dict[str, float] = {"top1_min": 0.97, "kl_max": 0.02, "free_min": 0.5, "task_min": 0.9}
"""Issue 14's gate (the serving dtype, against full recomputation)."""


def gate_passed(row: dict[str, float]) -> bool:
    """Whether ``row`` (``mean_kl``, ``top1_agreement``, ``free_running_agreement``,
    ``task_agreement``) passes ``GATE``."""
    return (row["top1_agreement"] >= GATE["top1_min"] and row["mean_kl"] <= GATE["kl_max"]
            and row["free_running_agreement"] >= GATE["free_min"]
            and row["task_agreement"] >= GATE["task_min"])


def choose_method(rows: dict[str, dict[str, float]], control: str = "k0-r1@1"
                  ) -> tuple[str, bool]:
    """The method to serve with and whether it passes the gate: the cheapest passing one
    (``compute_share``, then the most accurate); when none passes, the most accurate one
    (free-running, then top-1) except the full-recompute control."""
    passing = [k for k, r in rows.items() if k != control and gate_passed(r)]
    if passing:
        return min(passing, key=lambda k: (rows[k]["compute_share"],
                                           -rows[k]["top1_agreement"])), True
    rest = [k for k in rows if k != control] or list(rows)
    return max(rest, key=lambda k: (rows[k]["free_running_agreement"],
                                    rows[k]["top1_agreement"], -rows[k]["mean_kl"])), False


def run_scenarios(llama: Any, engine: Any, encode: Encode, methods: Sequence[Any],
                  count: int = 6, segment_tokens: int = 200, continuation: int = 64,
                  seed: int = 0, scenarios: Sequence[str] = SCENARIOS,
                  decode: Callable[[list[int]], str] | None = None,
                  method_scenarios: Sequence[str] = SCENARIOS) -> dict[str, Any]:
    """Every method on the primitives over ``method_scenarios`` (``"methods"``), the one chosen
    on the independent construction (``choose_method``), and that one through ``engine`` on
    ``scenarios``: ``{"methods": {scenario: {label: row}}, "chosen": label,
    "chosen_passed_on_primitives": bool, "scenarios": {scenario: {mean_kl, top1_agreement,
    free_running_agreement, task_agreement, ttft_speedup, ...}}}``. In ``scenarios`` KL and top-1
    come from the primitives (the serving dtype), free-running, task and TTFT from the engine."""
    by_label = {m.label(): m for m in methods}
    prompts = {name: build_scenario(encode, name, count, segment_tokens, seed)
               for name in dict.fromkeys([*method_scenarios, *scenarios])}
    table = {name: methods_quality(llama, prompts[name], methods, continuation, decode)
             for name in method_scenarios}
    basis = table.get("independent") or next(iter(table.values()))
    chosen, passed = choose_method(basis)
    blend = by_label[chosen]
    out: dict[str, dict[str, float]] = {}
    for name in scenarios:
        prim = table[name][chosen] if name in table else methods_quality(
            llama, prompts[name], [blend], continuation, decode)[chosen]
        eng = scenario_engine(engine, prompts[name], blend, f"sc-{name}-{seed}", continuation)
        out[name] = {"mean_kl": prim["mean_kl"], "top1_agreement": prim["top1_agreement"],
                     **eng, "primitives_free_running_agreement": prim["free_running_agreement"],
                     "primitives_task_agreement": prim["task_agreement"],
                     "compute_share": prim["compute_share"]}
    return {"methods": table, "chosen": chosen, "chosen_passed_on_primitives": passed,
            "scenarios": out}
