"""Segment-reuse quality per construction, in the serving dtype: ``bench segments`` scenarios.

Three ways the cached segments came to be, the same evaluated prompt
``[system + dialogue][Document 1][Document 2][question]``:

- ``same_context``: the documents were computed once behind the same system prompt and another
  dialogue, in the same order (the favourable case);
- ``independent``: each document was computed alone right after the system prompt (the way a
  RAG chunk cache fills);
- ``reordered``: both documents were computed behind another dialogue in the swapped order.

Every recompute method of ``METHODS`` (``BlendConfig``: first k, top r at check layers, fresh
lower layers) is measured on the primitives (``methods_quality``); ``choose_method`` picks the
cheapest one that passes ``GATE`` on the independent construction (else the most accurate), and
that one also runs through the serving engine. Per scenario, against full recomputation of the
evaluated prompt:

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
from suffixmem_bench.segment_prompts import SYSTEM, chatml, dialogue_pairs

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


METHODS: tuple[tuple[int, float, tuple[int, ...], int], ...] = (
    (0, 0.0, (1,), 0),     # re-rotation only
    (16, 0.0, (1,), 0),    # boundary: the first tokens of each segment (EPIC, attention sink)
    (32, 0.0, (1,), 0),
    (0, 0.15, (1,), 0),    # CacheBlend: the 15% most deviating tokens at layer 1
    (16, 0.15, (1,), 0),   # both
    (16, 0.3, (1,), 0),
    (16, 0.5, (1,), 0),
    (16, 0.3, (4,), 0),    # per-layer: deviation measured deeper
    (16, 0.0, (1,), 4),    # per-layer: the lowest 4 layers fresh for every token
    (16, 0.3, (1,), 8),
    (0, 1.0, (1,), 0),     # control: everything recomputed through the reuse path
)
"""``(first_k, ratio, check_layers, full_layers)`` of every recompute method measured, cheapest
families first. The control shows the harness's own numerical floor."""


def blends(methods: Sequence[tuple[int, float, tuple[int, ...], int]] = METHODS) -> list[Any]:
    """``BlendConfig``s of ``methods``."""
    from suffixmem.engine.reuse.blend import BlendConfig

    return [BlendConfig(first_k=k, ratio=r, check_layers=c, full_layers=f)
            for k, r, c, f in methods]


def parse_method(label: str) -> Any:
    """The ``BlendConfig`` a ``label()`` names: ``k16``, ``k16-r0.3@1``, ``k16-r0.3@1,4-L8``
    (``InvalidRequestError`` naming the label otherwise)."""
    import re

    from suffixmem.engine.reuse.blend import BlendConfig
    from suffixmem.errors import InvalidRequestError

    m = re.fullmatch(r"k(\d+)(?:-r([0-9.]+)@([0-9,]+))?(?:-L(\d+))?", label.strip())
    if m is None:
        raise InvalidRequestError(f"method {label!r}: expected a label such as k16, "
                                  "k16-r0.3@1 or k16-L4")
    k, r, layers, full = m.groups()
    return BlendConfig(first_k=int(k), ratio=float(r or 0.0),
                       check_layers=tuple(int(x) for x in (layers or "1").split(",") if x),
                       full_layers=int(full or 0))


def first_line_end(decode: Callable[[list[int]], str] | None, cont: Sequence[int]) -> int:
    """How many tokens of ``cont`` it takes to finish its first non-empty line (all of it when
    the line never ends, or without ``decode``)."""
    if decode is None:
        return len(cont)
    for j in range(1, len(cont) + 1):
        text = decode(list(cont[:j])).lstrip()
        if text and "\n" in text:
            return j
    return len(cont)


def methods_quality(llama: Any, prompts: Sequence[ScenarioPrompt], methods: Sequence[Any],
                    continuation: int = 64, decode: Callable[[list[int]], str] | None = None,
                    ) -> dict[str, dict[str, float]]:
    """Per ``BlendConfig`` (keyed by ``label()``), against full recomputation of each prompt,
    teacher-forced over the reference's greedy continuation on the engine's primitives in
    ``llama``'s dtype: ``mean_kl``, ``top1_agreement``, ``free_running_agreement`` (the first
    disagreement's step over the continuation: up to there both greedy runs feed the same
    tokens, so it is what a greedy reuse run reproduces), ``task_agreement`` (the share of
    prompts whose reference first line is reproduced token for token) and ``compute_share``
    (the work of the reuse prefill, layers times tokens, over that of a full prefill). The
    fills and the reference are computed once per prompt for every method."""
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
            work = len(pl.compute_positions) * layers + pl.checked_layers * n
            row = acc[blend.label()]
            for key, value in (("mean_kl", kl), ("top1_agreement", top1),
                               ("free_running_agreement", free),
                               ("task_agreement", float(round(free * continuation) >= line_end)),
                               ("compute_share", work / (n * layers))):
                row.setdefault(key, []).append(value)
            rig.blocks.decref(bt)
        for b in fill_bts:
            rig.blocks.decref(b)
    return {label: {k: statistics.fmean(v) for k, v in row.items()}
            for label, row in acc.items()}


def scenario_quality(llama: Any, prompts: Sequence[ScenarioPrompt], blend: Any,
                     continuation: int = 64) -> dict[str, float]:
    """Teacher-forced ``mean_kl`` and ``top1_agreement`` of reuse under ``blend`` (one method
    of ``methods_quality``)."""
    row = methods_quality(llama, prompts, [blend], continuation)[blend.label()]
    return {"mean_kl": row["mean_kl"], "top1_agreement": row["top1_agreement"]}


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


GATE: dict[str, float] = {"top1_min": 0.97, "kl_max": 0.02, "free_min": 0.5, "task_min": 0.9}
"""Issue 14's gate (bf16, against full recomputation)."""


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
    come from the primitives (bf16), free-running, task and TTFT from the engine."""
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
