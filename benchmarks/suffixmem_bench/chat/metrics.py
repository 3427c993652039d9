"""Per-turn records and the figures computed from them. Pure Python: no torch, no engines.

Definitions (times in seconds, token counts in model tokens):
- ``ttft_s``: from the moment the client calls the configuration's chat API (history
  rendering and tokenization included) to the first generated token, as the client sees it.
- ``latency_s``: from the same moment to the end of the reply.
- ``hit_rate``: cached prompt tokens over prompt tokens, summed over turns.
- ``hit_ceiling``: the share of prompt tokens already seen earlier in the same session: for each
  turn, the longest common prefix of its prompt ids with the session's previous prompt ids
  followed by the previous reply's ids (0 on a session's first turn), summed and divided by the
  summed prompt tokens. No cache restricted to one session's own earlier tokens can beat it.
- ``hit_ceiling_cross_session``: the same against every earlier prompt + reply of *any*
  session (a shared system prompt counts from the second session on). No prefix cache, shared
  or not, can beat it; configurations that share across sessions are judged against this one.
- ``manager_overhead_ms_p50`` / ``_p99``: the conversation manager's own time per turn
  (``TurnResult.manager_overhead_ms``): from the chat call until the request is handed to the
  engine (``Engine.stream``, which queues it for the driver's next scheduling step), plus from
  the engine's ``Result`` (right after the last token) until the call returns its
  ``TurnResult``; the benchmark's own time between streamed events is not counted. suffixmem
  configurations only.
- ``window_turns``: turns whose prompt dropped history to fit the context window (a framework's
  sliding window moving, or the manager's layout evicting: ``dropped_turns`` > 0);
  ``ttft_p50_window_s`` the p50 TTFT over those turns (NaN without any), ``ttft_mean_s`` over all
  turns, ``computed_tokens_mean`` the prompt tokens per turn that were not cached.
- ``output_tok_s`` and ``prompt_tok_s``: tokens over the wall time of the whole workload
  (engine start-up excluded).
- Percentiles interpolate linearly between order statistics (numpy's default method).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from suffixmem_bench.measure import finite_number

# Figures of a configuration that have a ratio to naive; the others are descriptive.
RATIO_KEYS: tuple[str, ...] = (
    "ttft_p50_s", "ttft_p50_from_turn8_s", "ttft_p99_s", "latency_p50_s", "latency_p99_s",
    "output_tok_s", "prompt_tok_s", "hit_rate", "hit_ceiling", "hit_ceiling_cross_session",
    "peak_rss_mb", "kv_pool_mb", "kv_held_mb", "ttft_mean_s", "ttft_p50_window_s",
    "computed_tokens_mean",
)
FROM_TURN = 8  # 1-based turn from which the "steady state" TTFT is taken


@dataclass(slots=True)
class TurnRecord:
    """One measured turn. ``session`` is 0-based, ``turn`` 1-based. ``seen_tokens`` is the
    turn's share of the hit ceiling's numerator (see the module docstring)."""

    session: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    seen_tokens: int
    ttft_s: float
    latency_s: float
    engine_ttft_s: float | None = None
    text: str = ""
    seen_any_tokens: int = 0
    manager_overhead_ms: float | None = None
    dropped_turns: int | None = None  # exchanges this turn's prompt dropped (None: unknown)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TurnRecord:
        return cls(**data)


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; NaN for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token id sequences."""
    a, b = list(a), list(b)
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search on slice equality: the comparisons run in C
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class CeilingTracker:
    """Tracks each session's last prompt + reply ids and scores the next prompt against them."""

    def __init__(self) -> None:
        self._seen: dict[object, list[int]] = {}
        self._all: list[list[int]] = []

    def observe(self, session: object, prompt_ids: Sequence[int], reply_ids: Sequence[int]) -> int:
        """Seen tokens of this prompt (LCP with the session's previous prompt + reply), then
        remember this turn's prompt + reply for the next one."""
        return self.observe_both(session, prompt_ids, reply_ids)[0]

    def observe_both(self, session: object, prompt_ids: Sequence[int],
                     reply_ids: Sequence[int]) -> tuple[int, int]:
        """``(seen in this session, seen in any session)`` of this prompt, then remember it."""
        prompt = list(prompt_ids)
        before = self._seen.get(session)
        seen = common_prefix_len(prompt, before) if before is not None else 0
        seen_any = max((common_prefix_len(prompt, s) for s in self._all), default=0)
        self._seen[session] = [*prompt, *reply_ids]
        self._all.append(self._seen[session])
        return seen, max(seen, seen_any)


def _div(a: float, b: float) -> float:
    return a / b if b else math.nan


def summarize(records: Sequence[TurnRecord], wall_s: float) -> dict[str, float]:
    """The timing, throughput and hit figures of one configuration's run."""
    ttft = [r.ttft_s for r in records]
    late = [r.ttft_s for r in records if r.turn >= FROM_TURN]
    lat = [r.latency_s for r in records]
    overhead = [r.manager_overhead_ms for r in records if r.manager_overhead_ms is not None]
    prompt = sum(r.prompt_tokens for r in records)
    window = [r.ttft_s for r in records if r.dropped_turns]
    return {
        "turns": len(records),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p50_from_turn8_s": percentile(late, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "latency_p50_s": percentile(lat, 50),
        "latency_p99_s": percentile(lat, 99),
        "output_tok_s": _div(sum(r.output_tokens for r in records), wall_s),
        "prompt_tok_s": _div(prompt, wall_s),
        "hit_rate": _div(sum(r.cached_tokens for r in records), prompt),
        "hit_ceiling": _div(sum(r.seen_tokens for r in records), prompt),
        "hit_ceiling_cross_session": _div(sum(r.seen_any_tokens for r in records), prompt),
        "manager_overhead_ms_p50": percentile(overhead, 50),
        "manager_overhead_ms_p99": percentile(overhead, 99),
        "ttft_mean_s": _div(sum(ttft), len(ttft)),
        "window_turns": len(window),
        "ttft_p50_window_s": percentile(window, 50),
        "computed_tokens_mean": _div(sum(r.prompt_tokens - r.cached_tokens for r in records),
                                     len(records)),
        "prompt_tokens": prompt,
        "cached_tokens": sum(r.cached_tokens for r in records),
        "output_tokens": sum(r.output_tokens for r in records),
        "wall_s": wall_s,
    }


def by_turn(records: Sequence[TurnRecord]) -> dict[str, list[float]]:
    """Per 1-based turn index: p50 TTFT across sessions, hit rate and hit ceiling."""
    turns = sorted({r.turn for r in records})
    out: dict[str, list[float]] = {"turn": [], "ttft_p50_s": [], "hit_rate": [],
                                   "hit_ceiling": []}
    for t in turns:
        rs = [r for r in records if r.turn == t]
        prompt = sum(r.prompt_tokens for r in rs)
        out["turn"].append(t)
        out["ttft_p50_s"].append(percentile([r.ttft_s for r in rs], 50))
        out["hit_rate"].append(_div(sum(r.cached_tokens for r in rs), prompt))
        out["hit_ceiling"].append(_div(sum(r.seen_tokens for r in rs), prompt))
    return out


def ratio_name(key: str, baseline: str) -> str:
    """The figure ``add_ratios`` writes for ``key`` over ``baseline``'s (``ttft_p50_s`` ->
    ``ttft_p50_vs_vllm_direct``); its per-round spread sits under the same name in ``spread``."""
    return f"{key.removesuffix('_s')}_vs_{baseline}"


def add_ratios(configs: dict[str, dict[str, Any]], baseline: str = "naive") -> None:
    """Add ``<key>_vs_<baseline>`` (this figure over the baseline's) to every measured
    configuration, and, for merged repeats, ``spread["<key>_vs_<baseline>"] = [min, max]`` of
    the per-round ratios: round i of one configuration over round i of the baseline, which ran
    beside it in the alternation. A ratio's own spread is what a reader compares with a target;
    the two figures' separate spreads overstate it when both move with the machine."""
    base = configs.get(baseline)
    if not base or base.get("status") != "ok":
        return
    for figures in configs.values():
        if figures.get("status") != "ok":
            continue
        for key in RATIO_KEYS:
            a, b = figures.get(key), base.get(key)
            if isinstance(a, int | float) and isinstance(b, int | float):
                name = ratio_name(key, baseline)
                figures[name] = _div(a, b)
                rounds = _round_ratios(figures, base, key)
                if rounds:
                    figures.setdefault("spread", {})[name] = [min(rounds), max(rounds)]


def _round_ratios(figures: dict[str, Any], base: dict[str, Any], key: str) -> list[float]:
    """Per-round ratios of ``key``, or [] where the rounds cannot be paired: a round whose
    figure was not finite is missing from ``runs``, so the lists align only when both kept
    every round."""
    xs, ys = (figures.get("runs") or {}).get(key), (base.get("runs") or {}).get(key)
    n = figures.get("repeats")
    if not xs or not ys or not n or not len(xs) == len(ys) == n == base.get("repeats"):
        return []
    ratios = [_div(x, y) for x, y in zip(xs, ys, strict=True)]
    return ratios if all(math.isfinite(r) for r in ratios) else []


def same_isolation_peer(config: str) -> str:
    """The stock vLLM configuration with ``config``'s isolation: ``vllm_direct`` (one cache
    for all sessions) for the ``app`` scope, else ``vllm_direct_salted`` (a cache a session)."""
    return "vllm_direct" if config.endswith("_app") else "vllm_direct_salted"


def evaluate_targets(configs: dict[str, dict[str, Any]], workload: str) -> dict[str, Any]:
    """Pass/fail of the issue's targets for the workload that ran (``default`` or ``long``).

    Each target is checked for every suffixmem configuration that ran; ``passed`` is ``None``
    when a configuration it needs (naive, vllm_direct) did not run. Issue 19's targets compare
    with stock vLLM at the configuration's own isolation (``same_isolation_peer``), when it
    ran (else ``vllm_direct``).
    """
    ok = {k: v for k, v in configs.items() if v.get("status") == "ok"}
    ours = {k: v for k, v in ok.items() if k.startswith("suffixmem")}
    naive = ok.get("naive")
    direct = ok.get("vllm_direct")
    targets: dict[str, Any] = {}

    def check(name: str, rule: str, need: dict[str, Any] | None, test: Any,
              peer_of: Any = None) -> None:
        """``test(figures, reference)`` for every configuration; the reference is ``need``,
        or with ``peer_of(config) -> name`` that configuration's own peer (else vllm_direct)."""
        results = {}
        for cfg, fig in ours.items():
            peer = None
            if peer_of is not None:
                peer = peer_of(cfg)
                peer = peer if peer in ok else "vllm_direct"
                need = ok.get(peer)
            if need is None:
                results[cfg] = {"passed": None, "why": "reference configuration did not run"}
                continue
            value, limit, passed = test(fig, need)
            if not (finite_number(value) and finite_number(limit)):
                passed = None
            results[cfg] = {"value": value, "limit": limit, "passed": passed}
            if peer is not None:
                results[cfg]["peer"] = peer
        targets[name] = {"rule": rule, "configs": results,
                         "passed": all_passed([r["passed"] for r in results.values()])}

    if workload == "default":
        check("ttft_from_turn8_le_fifth_of_naive",
              "p50 TTFT from turn 8 <= 1/5 of naive's", naive,
              lambda f, n: (f["ttft_p50_from_turn8_s"], n["ttft_p50_from_turn8_s"] / 5,
                            f["ttft_p50_from_turn8_s"] <= n["ttft_p50_from_turn8_s"] / 5))
    else:
        check("ttft_from_turn8_le_twentieth_of_naive",
              "p50 TTFT from turn 8 <= 1/20 of naive's", naive,
              lambda f, n: (f["ttft_p50_from_turn8_s"], n["ttft_p50_from_turn8_s"] / 20,
                            f["ttft_p50_from_turn8_s"] <= n["ttft_p50_from_turn8_s"] / 20))
        check("output_throughput_ge_2_3x_naive", "output tokens/s >= 2.3x naive's", naive,
              lambda f, n: (f["output_tok_s"], 2.3 * n["output_tok_s"],
                            f["output_tok_s"] >= 2.3 * n["output_tok_s"]))
        check("hit_rate_ge_95pct_of_ceiling", "hit rate >= 95% of its ceiling", {},
              lambda f, _n: (f["hit_rate"], 0.95 * f["hit_ceiling"],
                             f["hit_rate"] >= 0.95 * f["hit_ceiling"]))
    for key, label in (("ttft_p50_from_turn8_s", "p50 TTFT from turn 8"),
                       ("latency_p50_s", "p50 turn latency")):
        check(f"{key.removesuffix('_s')}_within_10pct_of_vllm_direct",
              f"{label} <= 1.1x vllm_direct's", direct,
              lambda f, d, key=key: (f[key], 1.1 * d[key], f[key] <= 1.1 * d[key]))
    check("output_tok_s_within_10pct_of_vllm_direct", "output tokens/s >= vllm_direct's / 1.1",
          direct, lambda f, d: (f["output_tok_s"], d["output_tok_s"] / 1.1,
                                f["output_tok_s"] >= d["output_tok_s"] / 1.1))
    # issue 19: zero-cost middleware, against vLLM with the same isolation: a cache per
    # session (vllm_direct_salted) for most configurations, one cache for the application
    # (vllm_direct) for those that share it (the ``app`` scope)
    check("ttft_from_turn8_le_1_03x_vllm_direct_same_isolation",
          "p50 TTFT from turn 8 <= 1.03x vllm_direct's at the same isolation", None,
          lambda f, d: (f["ttft_p50_from_turn8_s"], 1.03 * d["ttft_p50_from_turn8_s"],
                        f["ttft_p50_from_turn8_s"] <= 1.03 * d["ttft_p50_from_turn8_s"]),
          peer_of=same_isolation_peer)
    check("output_tok_s_ge_0_97x_vllm_direct_same_isolation",
          "output tokens/s >= 0.97x vllm_direct's at the same isolation", None,
          lambda f, d: (f["output_tok_s"], 0.97 * d["output_tok_s"],
                        f["output_tok_s"] >= 0.97 * d["output_tok_s"]),
          peer_of=same_isolation_peer)
    check("manager_overhead_p50_le_1ms", "manager overhead p50 <= 1 ms", {},
          lambda f, _d: _at_most(f.get("manager_overhead_ms_p50"), 1.0))
    check("manager_overhead_p99_le_5ms", "manager overhead p99 <= 5 ms", {},
          lambda f, _d: _at_most(f.get("manager_overhead_ms_p99"), 5.0))
    return targets


def _at_most(value: Any, limit: float) -> tuple[Any, float, bool]:
    return value, limit, finite_number(value) and value <= limit


def all_passed(values: list[bool | None]) -> bool | None:
    """A target's overall verdict: None when any configuration had none (or none ran), else
    whether all passed."""
    if not values or any(v is None for v in values):
        return None
    return all(values)


def merge_repeats(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's figures over alternating repeats: each numeric figure is the median
    of the runs that succeeded, with ``spread[key] = [min, max]`` and ``runs[key]``; ``by_turn``
    and the other fields come from the median run by TTFT p50 from turn 8. A configuration that
    failed in any repeat is reported as that failure."""
    bad = next((r for r in runs if r.get("status") != "ok"), None)
    if bad is not None or not runs:
        return bad or {"status": "error", "reason": "no runs"}
    order = sorted(runs, key=lambda r: (math.isnan(x := r.get("ttft_p50_from_turn8_s",
                                                              math.nan)), x))
    out = dict(order[(len(order) - 1) // 2])
    spread: dict[str, list[float]] = {}
    values: dict[str, list[float]] = {}
    for key, v in runs[0].items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        xs = [float(r[key]) for r in runs if finite_number(r.get(key))]
        if not xs:
            continue
        out[key] = percentile(xs, 50)
        spread[key] = [min(xs), max(xs)]
        values[key] = xs
    out["repeats"] = len(runs)
    out["spread"] = spread
    out["runs"] = values
    return out


def same_text_share(turns: list[dict[str, Any]], reference: str) -> dict[str, float]:
    """Per configuration, the share of (session, turn) replies whose text equals the
    ``reference`` configuration's (greedy runs): whether cached or restored KV changed what the
    model said. Prompts must match for the comparison to mean anything; the report says so."""
    ref = {(t["session"], t["turn"]): t["text"] for t in turns if t["config"] == reference}
    out: dict[str, float] = {}
    for name in sorted({t["config"] for t in turns} - {reference}):
        mine = [t for t in turns if t["config"] == name and (t["session"], t["turn"]) in ref]
        if mine:
            same = sum(t["text"] == ref[(t["session"], t["turn"])] for t in mine)
            out[name] = same / len(mine)
    return out


def same_text_from_drop(turns: list[dict[str, Any]], reference: str) -> dict[str, dict[str, Any]]:
    """``same_text_share`` against ``reference`` split at each session's first turn that
    dropped history (``dropped_turns`` > 0 in that configuration's own run): ``before`` (nothing
    dropped yet: exact reuse must reproduce the reference's text), ``from_drop`` (that turn and
    every later one: context shift's approximation, then histories that may have diverged) and
    ``turns_from_drop``. Per configuration, over every round."""
    ref = {(t["session"], t["turn"]): t["text"] for t in turns if t["config"] == reference}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({t["config"] for t in turns} - {reference}):
        first: dict[tuple[int, int], int] = {}  # (round, session) -> first turn that dropped
        mine = [t for t in turns if t["config"] == name and (t["session"], t["turn"]) in ref]
        for t in mine:
            key = (t.get("repeat", 0), t["session"])
            if t.get("dropped_turns") and t["turn"] < first.get(key, 1 << 30):
                first[key] = t["turn"]
        sides: dict[bool, list[bool]] = {False: [], True: []}
        for t in mine:
            late = t["turn"] >= first.get((t.get("repeat", 0), t["session"]), 1 << 30)
            sides[late].append(t["text"] == ref[(t["session"], t["turn"])])
        out[name] = {
            "before": sum(sides[False]) / len(sides[False]) if sides[False] else math.nan,
            "from_drop": sum(sides[True]) / len(sides[True]) if sides[True] else math.nan,
            "turns_from_drop": len(sides[True]),
        }
    return out
