"""The report of a paired run (``paired.run_paired``: stock vLLM's chat path against
suffixmem's on one engine, turn by turn), computed from its per-turn records.

Report (JSON): per arm ``ttft_p50_ms`` and ``ttft_p50_from_turn8_ms`` (median with min-max over
rounds), ``output_tok_s`` (the same), ``pre_engine_ms_p50`` (the call to the moment the engine
gets the request: the stock arm's template rendering and tokenization, the manager's read, plan
and checks), ``engine_ttft_ms_p50`` (the engine's own clock, from its stream's start to the
first token), ``latency_p50_ms``, ``prompt_tokens``, ``cached_tokens`` and ``output_tokens``;
for suffixmem also ``manager_overhead_ms`` p50/p99. ``paired``: over turns from turn 8, the
median of suffixmem's TTFT over stock's on the same turn (``ttft_ratio_p50``) and of their
difference, each also by which arm went first (``unit``: ``turn``; ``wave`` when concurrent,
each wave by its turns' median TTFT, since one session's TTFT there mostly says which place it
drew in the wave's queue), and the ratio of the two arms' TTFT p50 per round;
``throughput_ratio``: suffixmem's output tokens/s over stock's, all rounds pooled, with
``throughput_round_ratios``; ``round_ratio``: both per-round ratios as spreads (median, min,
max: what ``bench compare`` checks a rerun against). ``target``: issue 19's 1.03x on
``ttft_ratio_p50``; ``throughput_target``: its 0.97x on ``throughput_ratio``.
``same_prompts``: the share of turns whose prompts had the same length in both arms (the
layouts agree on a plain chat). Plus ``RunContext``'s fields.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from suffixmem_bench.chat.metrics import percentile
from suffixmem_bench.chat.workload import Workload
from suffixmem_bench.measure import spread

ARMS: tuple[str, ...] = ("stock", "suffixmem")
LATE_TURN = 8  # issue 19's figure: TTFT from turn 8 on (1-based), once histories are long
TARGET = 1.03
THROUGHPUT_TARGET = 0.97


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)  # NaN for no values, as bench chat's figures


def _tok_s(records: Sequence[dict[str, Any]]) -> float:
    """Output tokens over busy time (module docstring), per second; NaN without time."""
    busy = sum(x["busy_ms"] for x in records)
    return sum(x["output_tokens"] for x in records) * 1000 / busy if busy > 0 else float("nan")


def _pairs(records: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(stock, suffixmem) records of the same round, session and turn."""
    key = {(x["arm"], x["round"], x["session"], x["turn"]): x for x in records}
    return [(key[("stock", r, s, t)], x) for (a, r, s, t), x in key.items()
            if a == "suffixmem" and ("stock", r, s, t) in key]


def _wave_medians(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per arm, round and turn (session -1): its turns' median TTFT."""
    waves: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for x in records:
        waves.setdefault((x["arm"], x["round"], x["turn"]), []).append(x)
    return [{"arm": a, "round": r, "session": -1, "turn": t, "first": xs[0]["first"],
             "ttft_ms": median([x["ttft_ms"] for x in xs])}
            for (a, r, t), xs in waves.items()]


def summarize(records: Sequence[dict[str, Any]], workload: Workload, repeats: int,
              late_turn: int = LATE_TURN, concurrent: bool = False) -> dict[str, Any]:
    """The report of ``run_paired`` from its records (module docstring); the late figures
    count turns from ``late_turn`` (1-based) on, still named ``..._from_turn8_...``."""
    arms: dict[str, Any] = {}
    tok_s: dict[str, float] = {}  # per arm, all rounds pooled
    round_tok_s: dict[str, list[float]] = {}
    for name in ARMS:
        mine = [x for x in records if x["arm"] == name]
        per_round = [[x for x in mine if x["round"] == r] for r in range(repeats)]
        tok_s[name] = _tok_s(mine)
        round_tok_s[name] = [_tok_s(rr) for rr in per_round]
        row: dict[str, Any] = {
            "ttft_p50_ms": spread([median([x["ttft_ms"] for x in rr]) for rr in per_round]),
            "ttft_p50_from_turn8_ms": spread([
                median([x["ttft_ms"] for x in rr if x["turn"] >= late_turn])
                for rr in per_round]),
            "output_tok_s": spread(round_tok_s[name]),
            "output_tokens": sum(x["output_tokens"] for x in mine),
            "pre_engine_ms_p50": median([x["pre_engine_ms"] for x in mine]),
            "engine_ttft_ms_p50": median([x["engine_ttft_ms"] for x in mine]),
            "latency_p50_ms": median([x["latency_ms"] for x in mine]),
            "prompt_tokens": sum(x["prompt_tokens"] for x in mine),
            "cached_tokens": sum(x["cached_tokens"] for x in mine),
        }
        overheads = [x["manager_overhead_ms"] for x in mine
                     if x["manager_overhead_ms"] is not None]
        if overheads:
            row["manager_overhead_ms_p50"] = median(overheads)
            row["manager_overhead_ms_p99"] = percentile(overheads, 99)
        arms[name] = row
    pairs = _pairs(records)
    # concurrent: a wave's turns reach the engine in a random order and the first runs a step
    # alone while the rest queue behind it, so one session's TTFT is mostly its place in the
    # wave; the unit that pairs is the wave, by its median TTFT
    units = _pairs(_wave_medians(records)) if concurrent else pairs
    late = [(st, ours) for st, ours in units if ours["turn"] >= late_turn]

    def ratio(sel: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> float:
        return median([ours["ttft_ms"] / st["ttft_ms"] for st, ours in sel])

    def diff(sel: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> float:
        return median([ours["ttft_ms"] - st["ttft_ms"] for st, ours in sel])

    ours_first = [p for p in late if p[1]["first"]]
    stock_first = [p for p in late if not p[1]["first"]]
    value = ratio(late)
    per_round = [arms["suffixmem"]["ttft_p50_from_turn8_ms"]["runs"][r]
                 / arms["stock"]["ttft_p50_from_turn8_ms"]["runs"][r]
                 for r in range(len(arms["stock"]["ttft_p50_from_turn8_ms"]["runs"]))]
    throughput = tok_s["suffixmem"] / tok_s["stock"]
    round_tp = [a / b for a, b in zip(round_tok_s["suffixmem"], round_tok_s["stock"],
                                      strict=True)]
    return {
        "workload": {"name": workload.name, "sessions": workload.num_sessions,
                     "turns": workload.num_turns, "max_tokens": workload.max_tokens,
                     "system_tokens": workload.system_tokens, "repeats": repeats,
                     "late_turn": late_turn,
                     "mode": "concurrent" if concurrent else "round_robin"},
        "arms": arms,
        "paired": {
            "unit": "wave" if concurrent else "turn",
            "turns": len(late),
            "ttft_ratio_p50": value, "ttft_diff_ms_p50": diff(late),
            "suffixmem_first": {"turns": len(ours_first), "ttft_ratio_p50": ratio(ours_first),
                                "ttft_diff_ms_p50": diff(ours_first)},
            "stock_first": {"turns": len(stock_first), "ttft_ratio_p50": ratio(stock_first),
                            "ttft_diff_ms_p50": diff(stock_first)},
            "round_ratios": per_round,
            "throughput_ratio": throughput, "throughput_round_ratios": round_tp,
            # the round ratios as spreads, the figures `bench compare` checks a rerun against
            "round_ratio": {"ttft_p50_from_turn8": spread(per_round),
                            "output_tok_s": spread(round_tp)},
        },
        "target": {"what": f"suffixmem TTFT / stock vLLM's on the same turn, p50 from turn "
                           f"{late_turn}, <= {TARGET}x", "limit": TARGET, "value": value,
                   "pass": bool(value <= TARGET)},
        "throughput_target": {
            "what": f"suffixmem output tokens/s / stock vLLM's, >= {THROUGHPUT_TARGET}x",
            "limit": THROUGHPUT_TARGET, "value": throughput,
            "pass": bool(throughput >= THROUGHPUT_TARGET)},
        "same_prompts": statistics.fmean([float(st["prompt_tokens"] == ours["prompt_tokens"])
                                 for st, ours in pairs]) if pairs else float("nan"),
    }
