"""``suffixmem bench segments``: the quality and speed of segment reuse against recomputation.

Prompts are ``[varying prefix][reused segments][question]`` built from real text: the prefix is
a short chat (chatterbot-corpus dialogues), each segment a passage of Python's standard-library
documentation, the question asks about the passages. For every prompt the segments are computed
once behind one prefix (the *fill* run) and then reused behind a different prefix, at other
positions; the reference is full recomputation of that second prompt.

Per ``(k, r)`` on the grid:

- ``mean_kl``: mean next-token KL(reference || reuse) over the 64 teacher-forced steps (the
  reference's own greedy continuation is fed to both runs), averaged over prompts;
- ``top1_agreement``: the share of those steps where both runs' argmax agree;
- ``free_running_agreement``: the share of the reference continuation the reuse run reproduces
  greedily before its first divergence. Up to that divergence both greedy runs feed the same
  tokens, so it is the first teacher-forced disagreement's step over 64 (reported, not gated);
- ``ttft_speedup``: the torch engine's time to first token for the prompt with exact mode
  (full recomputation) over that with segment reuse at ``(k, r)``, medians over prompts, each
  run in a fresh session so that no prefix-cache hit helps either.

Quality is measured on our own ``Llama`` primitives and ``place_segments`` (the engine's code),
in fp32 by default so that kernel rounding does not blur the comparison; TTFT runs through
``TorchEngine`` in its default dtype (``auto``: bf16 with AVX-512 BF16 or CUDA, else fp32).
The defaults are the fastest setting that passes the gate (top-1 >= 0.95, KL <= 0.05,
speed-up >= 2 with segments >= 75% of the prompt); when none passes the report says so and
exact mode stays the default.

``scenarios`` and ``methods`` (``segment_scenarios.py``) measure every recompute method
(first-k, CacheBlend top-r, check depth, fresh lower layers) on the engine's primitives in the
dtype the engine serves (``setup.dtype``: bf16 where it is native, else fp32) on three
constructions (same context, independent, reordered); the cheapest method that passes
issue 14's gate on the independent construction (else the most accurate) then runs through the
serving engine, with a task check (a code written into a reused segment and asked for:
``segment_task.py``), for ``scenarios``. ``events`` (``segment_events.py``) are the overflow and
rag workloads' real reuse events, measured the same way (the task check on copies of them with a
code planted in their longest reused span), and ``workload_defaults``
says per workload class whether segment reuse is on by default (exactly when its gate passes).

It also runs the attention-entropy detector over multi-turn sessions whose retrieved passages
recur, and reports how often its regions are later met again outside the prefix cache
(``segment_detector.py``). Prompts: ``segment_prompts.py``; measurement: ``segment_quality.py``;
console tables: ``segment_report.py``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import typer

from suffixmem.config import DEFAULT_MODEL
from suffixmem_bench.segment_detector import detector_reuse
from suffixmem_bench.segment_prompts import (  # noqa: F401  (re-exported for callers)
    QUESTIONS,
    SYSTEM,
    BenchPrompt,
    build_prompts,
    chatml,
    dialogue_pairs,
)
from suffixmem_bench.segment_quality import compare as _compare  # noqa: F401
from suffixmem_bench.segment_quality import measure_quality, measure_ttft

GATE_TOP1 = 0.95
GATE_KL = 0.05
GATE_SPEEDUP = 2.0
GATE_SHARE = 0.75

DEFAULT_K = (0, 4, 16, 32)
DEFAULT_R = (0.0, 0.15, 0.3)

# -- the whole bench --------------------------------------------------------------------------
SPEED_MARGIN = 1.25
"""Defaults need this multiple of the speed-up floor when they can get it: TTFT ratios measured
on a shared machine move by ~10-20% between runs, quality figures much less."""


def choose_defaults(grid: Sequence[dict[str, Any]]) -> tuple[dict[str, Any] | None, bool]:
    """The defaults and whether they pass the gate.

    Among settings that pass (top-1, KL and speed-up), the most accurate one (top-1, then KL)
    whose speed-up clears the floor by ``SPEED_MARGIN``; if none clears it, the fastest passing
    one. When nothing passes: the fastest setting that keeps the quality gate, else the most
    accurate overall (reported as a candidate; exact mode stays the default).
    """
    def quality_ok(row: dict[str, Any]) -> bool:
        return row["top1_agreement"] >= GATE_TOP1 and row["mean_kl"] <= GATE_KL

    def accuracy(row: dict[str, Any]) -> tuple[float, float]:
        return row["top1_agreement"], -row["mean_kl"]

    passing = [r for r in grid if quality_ok(r) and r["ttft_speedup"] >= GATE_SPEEDUP]
    if passing:
        roomy = [r for r in passing if r["ttft_speedup"] >= GATE_SPEEDUP * SPEED_MARGIN]
        if roomy:
            return max(roomy, key=accuracy), True
        return max(passing, key=lambda r: r["ttft_speedup"]), True
    good = [r for r in grid if quality_ok(r)]
    if good:
        return max(good, key=lambda r: r["ttft_speedup"]), False
    return (max(grid, key=accuracy) if grid else None), False


def run_segments(
    k_values: Sequence[int] = DEFAULT_K, r_values: Sequence[float] = DEFAULT_R,
    prompts: int = 6, segments: int = 2, segment_tokens: int = 200, continuation: int = 64,
    quality_dtype: str = "float32", check_layers: tuple[int, ...] = (1,), repeats: int = 2,
    detector_sessions: int = 3, model: str = DEFAULT_MODEL, seed: int = 0, threads: int = 1,
    progress: Callable[[str], None] | None = None, scenario_prompts: int | None = None,
    methods: Sequence[str] | None = None, method_scenarios: Sequence[str] | None = None,
    event_sessions: int = 2, event_turns: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The whole bench; returns the JSON object (see the module docstring).

    ``methods`` are recompute-method labels (``BlendConfig.label()``, e.g. ``k16-r0.3@1``;
    default ``segment_scenarios.METHODS``), measured on ``method_scenarios`` (default all three)
    and on the overflow and rag events (``event_sessions`` sessions each; 0 skips them).
    ``threads`` is torch's thread count for every part. One thread is the default because on a
    shared machine each multi-threaded op waits for busy cores at its barrier (ms per op), which
    flattens the difference between computing 100 tokens and 500; ratios are what is reported.
    """
    import torch

    from suffixmem.engine.torch.kv_pool import torch_dtype
    from suffixmem.engine.torch.llama import Llama
    from suffixmem_bench.segment_events import (
        measure_events,
        serving_dtype,
        serving_engine,
        workload_defaults,
    )
    from suffixmem_bench.segment_prompts import model_codec
    from suffixmem_bench.segment_scenarios import (
        GATE,
        SCENARIOS,
        blends,
        gate_passed,
        parse_method,
        run_scenarios,
    )

    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    torch.set_num_threads(threads)
    path, encode, decode = model_codec(model)
    method_list = [parse_method(m) for m in methods] if methods else blends()
    bench = build_prompts(encode, prompts, segments, segment_tokens, seed)
    grid = [(int(k), float(r)) for k in k_values for r in r_values]
    share = statistics.fmean(p.segment_share for p in bench)

    say(f"quality: {len(bench)} prompts x {len(grid)} settings ({quality_dtype})")
    llama = Llama.from_pretrained(path, torch_dtype(quality_dtype))
    quality = measure_quality(llama, bench, grid, continuation, check_layers)
    del llama

    say("time to first token through the torch engine")
    engine = serving_engine(model, threads)
    dtype = serving_dtype(engine)
    served = Llama.from_pretrained(path, torch_dtype(dtype))
    try:
        ttft, exact_ttft = measure_ttft(engine, bench, grid, repeats, check_layers)
        say(f"scenarios: {len(method_list)} methods on the primitives ({dtype}), the chosen "
            "one through the engine")
        sc = run_scenarios(served, engine, encode, method_list, scenario_prompts or prompts,
                           segment_tokens, continuation, seed, decode=decode,
                           method_scenarios=tuple(method_scenarios or SCENARIOS))
        events: dict[str, dict[str, Any]] = {}
        if event_sessions > 0:
            say("overflow and rag: real reuse events (replies generated exactly)")
            events = measure_events(served, engine, encode, method_list,
                                    continuation=48, sessions=event_sessions,
                                    turns=event_turns, decode=decode, progress=say)
    finally:
        engine.close()

    say("detector regions on multi-turn sessions")
    detector = detector_reuse(served, encode, sessions=detector_sessions, seed=seed)

    rows = []
    for g in grid:
        q = quality[g]
        rows.append({
            "k": g[0], "r": g[1],
            "mean_kl": statistics.fmean(q.kl),
            "top1_agreement": statistics.fmean(q.top1),
            "free_running_agreement": statistics.fmean(q.free),
            "ttft_speedup": exact_ttft / ttft[g] if ttft[g] > 0 else 0.0,
            "ttft_s": ttft[g],
        })
    best, passed = choose_defaults(rows)
    gate_applies = share >= GATE_SHARE
    independent = sc["scenarios"].get("independent")
    return {
        "scenarios": sc["scenarios"],
        "scenario_gate": {
            "method": sc["chosen"], **GATE,
            "independent_passed": bool(independent) and gate_passed(independent),
            "chosen_passed_on_primitives": sc["chosen_passed_on_primitives"],
        },
        "methods": sc["methods"],
        "events": events,
        "workload_defaults": workload_defaults(independent, sc["chosen"], events),
        "grid": rows,
        "defaults": {"k": best["k"], "r": best["r"]} if best else None,
        "default_result": {
            "mean_kl": best["mean_kl"], "top1_agreement": best["top1_agreement"],
            "ttft_speedup": best["ttft_speedup"],
        } if best else None,
        "gate": {
            "passed": passed and gate_applies,
            "top1_min": GATE_TOP1, "kl_max": GATE_KL, "speedup_min": GATE_SPEEDUP,
            "segment_share": share, "segment_share_min": GATE_SHARE,
            "exact_mode_default": not (passed and gate_applies),
        },
        "setup": {
            "prompts": len(bench), "segments_per_prompt": segments,
            "prompt_tokens_mean": statistics.fmean(len(p.ids) for p in bench),
            "continuation": continuation, "quality_dtype": quality_dtype,
            "ttft_dtype": engine.config.dtype, "dtype": dtype, "check_layers": list(check_layers),
            "exact_ttft_s": exact_ttft, "event_sessions": event_sessions,
            "threads": torch.get_num_threads(), "seconds": time.perf_counter() - t0,
        },
        "detector": detector,
    }


def register(bench: typer.Typer) -> None:
    @bench.command("segments")
    def segments_cmd(
        k: str = typer.Option(",".join(map(str, DEFAULT_K)), help="First-k values, comma list."),
        r: str = typer.Option(",".join(map(str, DEFAULT_R)), help="Top-r ratios, comma list."),
        prompts: int = typer.Option(6, help="Number of prompts."),
        segments: int = typer.Option(2, help="Reused segments per prompt."),
        segment_tokens: int = typer.Option(200, help="Tokens per segment (about)."),
        continuation: int = typer.Option(64, help="Teacher-forced continuation length."),
        dtype: str = typer.Option("float32", help="Dtype of the grid's quality measurement."),
        check_layers: str = typer.Option("1", help="Check layers for top-r, comma list."),
        detector_sessions: int = typer.Option(3, help="Sessions for the detector report."),
        threads: int = typer.Option(1, help="Torch threads (1 resists a shared machine)."),
        scenario_prompts: int = typer.Option(
            0, help="Prompts per scenario (same_context, independent, reordered); 0: --prompts."),
        methods: str = typer.Option(
            "", help="Recompute methods, space-separated labels such as 'k16 k16-r0.3@1 "
                     "k16-q0.1 k16-L4'; empty: all of segment_scenarios.METHODS."),
        method_scenarios: str = typer.Option(
            "same_context,independent,reordered",
            help="Scenarios every method is measured on (comma list; independent decides)."),
        event_sessions: int = typer.Option(
            2, help="Sessions of overflow and rag replayed for reuse events; 0: none."),
        events: str = typer.Option(
            "", help="Only the reuse events of these workloads (comma list of overflow, rag), "
                     "nothing else: a larger replay (with --event-sessions, --event-turns)."),
        event_turns: int = typer.Option(
            0, min=0, help="Turns per replayed session (0: each workload's pinned count)."),
        chained: int = typer.Option(
            0, min=0, help="With --events rag: also serve this many whole rag sessions with "
                           "the engine's method, reuse chained turn over turn, against exact "
                           "and one-hop reuse on the same prompts."),
        chained_method: str = typer.Option(
            "", help="The method of the --chained sessions (a label such as k16); empty: the "
                     "engine's default for its dtype."),
        serve_dtype: str = typer.Option(
            "auto", help="With --events: the dtype the torch engine serves and the replay "
                         "measures (auto: bf16 with AVX-512 BF16, else fp32; float32 replays "
                         "what a host without AVX-512 BF16 serves)."),
        model: str = typer.Option(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Segment reuse against full recomputation: a (k, r) grid, recompute methods on three
        constructions and on the overflow and rag workloads' reuse events, and the defaults
        per workload class."""
        from rich.console import Console

        from suffixmem.stdio import quiet_stdout
        from suffixmem_bench.measure import RunContext

        console = Console()
        say = None if as_json else lambda m: console.print(f"[dim]{m}[/]")
        if events:
            from suffixmem_bench.segment_events import (
                SERVE_DTYPES,
                check_event_workloads,
                run_events,
            )
            from suffixmem_bench.segment_scenarios import parse_method

            names = [w.strip() for w in events.split(",") if w.strip()]
            try:
                check_event_workloads(names)
            except ValueError as e:
                raise typer.BadParameter(f"--events {events!r}: {e}") from None
            if event_sessions < 1:
                raise typer.BadParameter("--events needs --event-sessions >= 1")
            if serve_dtype not in SERVE_DTYPES:
                raise typer.BadParameter(f"--serve-dtype {serve_dtype!r}: one of "
                                         f"{', '.join(SERVE_DTYPES)}")
            if chained and "rag" not in names:
                raise typer.BadParameter("--chained measures rag sessions: add rag to --events")
            if chained_method:
                try:
                    parse_method(chained_method)
                except ValueError as e:
                    raise typer.BadParameter(f"--chained-method: {e}") from None
            with quiet_stdout(as_json), RunContext(threads) as ctx:
                result = run_events(names, event_sessions, event_turns or None,
                                    methods.split() or None, model, threads, progress=say,
                                    chained=chained, chained_method=chained_method or None,
                                    serve_dtype=serve_dtype)
            result.update(ctx.fields())
            if as_json:
                print(json.dumps(result))
            else:
                from suffixmem_bench.segment_report import print_events_report

                print_events_report(console, result)
            return
        if chained:
            raise typer.BadParameter("--chained goes with --events rag")
        if serve_dtype != "auto":
            raise typer.BadParameter("--serve-dtype goes with --events (the whole bench "
                                     "serves the engine's own dtype; --dtype sets its grid's)")
        with quiet_stdout(as_json), RunContext(threads) as ctx:
            result = run_segments(
                [int(x) for x in k.split(",")], [float(x) for x in r.split(",")], prompts,
                segments, segment_tokens, continuation, dtype,
                tuple(int(x) for x in check_layers.split(",")), model=model,
                detector_sessions=detector_sessions, threads=threads,
                scenario_prompts=scenario_prompts or None, methods=methods.split() or None,
                method_scenarios=[x for x in method_scenarios.split(",") if x],
                event_sessions=event_sessions,
                event_turns={"overflow": event_turns, "rag": event_turns} if event_turns
                else None, progress=say,
            )
        result.update(ctx.fields())
        if as_json:
            print(json.dumps(result))
            return
        from suffixmem_bench.segment_report import print_report

        print_report(console, result)
