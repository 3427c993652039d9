"""The ``returning`` workload of ``suffixmem bench chat`` (issue 13): sessions that come back
after the pool has forgotten them, and after the engine process restarts.

- 24 sessions x 6 turns by default; each session has its own ~1,000-token system prompt and
  reference document (its first line names the session, so no block is shared across sessions:
  block hashes chain from the first block). Rounds are interleaved over all sessions, so each
  session returns after all the others.
- The engine KV pool is 256 MiB (about a third of the sessions); max_tokens 32, greedy.
- After round ``restart_after`` (3) the configuration's process ends and a new one continues on
  the same state folder (database, KV tier) with rounds 4-6; text-history peers get their
  histories back from round 1-3's replies, as a client would reload them.
- Figures besides the usual ones: ``ttft_p50_returning_s`` (turns of rounds 2-6),
  ``ttft_p50_after_restart_s`` (the first round after the restart), ``tier_hit_rate``,
  ``tier_load_ms_p50`` and ``tier_bytes`` (suffixmem configurations with a tier).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from suffixmem_bench.chat.metrics import (
    TurnRecord,
    add_ratios,
    by_turn,
    percentile,
    summarize,
)
from suffixmem_bench.chat.peers import EngineOptions
from suffixmem_bench.chat.workload import (
    DOCUMENT_MODULES,
    Counter,
    Workload,
    _take,
    document_paragraphs,
    session_turns,
    system_prompt_text,
)

CONFIGS: tuple[str, ...] = ("naive", "vllm_direct", "suffixmem_vllm", "suffixmem_torch")
KV_CACHE_GIB = 0.25


def build_returning_workload(*, count: Counter, sessions: int = 24, turns: int = 6,
                             max_tokens: int = 32, prompt_tokens: int = 1000,
                             restart_after: int = 3) -> Workload:
    """The workload (module docstring); deterministic like ``build_workload``."""
    if sessions < 1 or turns < 2:
        raise ValueError(f"need at least one session and two turns, got {sessions}x{turns}")
    if not 0 <= restart_after < turns:
        raise ValueError(f"restart_after must be in 0..{turns - 1}, got {restart_after}")
    system = system_prompt_text(prompt_tokens * 3 // 10, count)
    prompts = []
    for i in range(sessions):
        k = i % len(DOCUMENT_MODULES)
        modules = DOCUMENT_MODULES[k:] + DOCUMENT_MODULES[:k]  # each session its own order
        doc = _take(document_paragraphs(modules), prompt_tokens * 7 // 10, count, "\n\n")
        prompts.append(f"Session {i}: you assist customer #{i:04d} only.\n{system}\n\n{doc}")
    return Workload(
        name="returning", system_prompt="", sessions=[session_turns(i, turns)
                                                      for i in range(sessions)],
        max_tokens=max_tokens, mode="round_robin",
        system_tokens=round(sum(count(p) for p in prompts) / sessions),
        system_prompts=prompts, restart_after=restart_after,
    )


def returning_figures(records: list[TurnRecord], restart_after: int,
                      tier: dict[str, Any]) -> dict[str, Any]:
    """The workload's own figures (module docstring) from both phases' records and tier
    counters."""
    looked = tier.get("tier_hits", 0) + tier.get("tier_misses", 0)
    loads = tier.get("tier_load_ms") or []
    return {
        "ttft_p50_returning_s": percentile([r.ttft_s for r in records if r.turn >= 2], 50),
        "ttft_p50_after_restart_s": percentile(
            [r.ttft_s for r in records if r.turn == restart_after + 1], 50),
        "tier_hit_rate": tier["tier_hits"] / looked if looked else None,
        "tier_load_ms_p50": percentile(loads, 50) if loads else None,
        "tier_bytes": tier.get("tier_bytes"),
    }


def returning_targets(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Issue 13's targets: returning TTFT p50 <= 1/5 of vllm_direct's; round-4 (after the
    restart) TTFT p50 <= 1/5 of naive's. ``passed`` is None when a reference did not run."""
    ok = {k: v for k, v in configs.items() if v.get("status") == "ok"}
    out: dict[str, Any] = {}
    for name, ref, key in (("returning_le_fifth_of_vllm_direct", "vllm_direct",
                            "ttft_p50_returning_s"),
                           ("after_restart_le_fifth_of_naive", "naive",
                            "ttft_p50_after_restart_s")):
        base = ok.get(ref)
        results = {}
        for cfg, fig in ok.items():
            if not cfg.startswith("suffixmem"):
                continue
            if base is None:
                results[cfg] = {"passed": None, "why": f"{ref} did not run"}
            else:
                limit = base[key] / 5
                results[cfg] = {"value": fig[key], "limit": limit, "passed": fig[key] <= limit}
        passed = [r["passed"] for r in results.values()]
        out[name] = {"rule": f"{key} <= 1/5 of {ref}'s", "configs": results,
                     "passed": None if not passed or None in passed else all(passed)}
    return out


def run_returning(*, configs: tuple[str, ...] = CONFIGS, options: EngineOptions,
                  workload: Workload, timeout_s: float, run_one: Any, on_event: Any = None,
                  ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Run each configuration in two processes (rounds before and after the restart) on one
    state folder; returns ``(figures per config, every turn's record)``."""
    results: dict[str, dict[str, Any]] = {}
    all_turns: list[dict[str, Any]] = []
    cut = workload.restart_after or workload.num_turns
    with tempfile.TemporaryDirectory(prefix="suffixmem-bench-returning-") as tmp:
        for name in configs:
            state = Path(tmp) / name
            state.mkdir()
            opts = replace(options, kv_tier=True, state_dir=str(state), exact_pool=True)
            first, rec1 = run_one(name, workload, opts, timeout_s=timeout_s, on_event=on_event,
                                  log_dir=Path(tmp), rounds=(0, cut), tag="-1")
            if first["status"] != "ok" or cut >= workload.num_turns:
                results[name] = first
                all_turns += [{"config": name, **r.to_dict()} for r in rec1]
                continue
            history: dict[str, list[list[str]]] = {}
            for r in sorted(rec1, key=lambda r: r.turn):
                history.setdefault(str(r.session), []).append(
                    [workload.sessions[r.session][r.turn - 1], r.text])
            second, rec2 = run_one(name, workload, opts, timeout_s=timeout_s,
                                   on_event=on_event, log_dir=Path(tmp), rounds=(cut,
                                   workload.num_turns), history=history, tag="-2")
            records = rec1 + rec2
            all_turns += [{"config": name, **r.to_dict()} for r in records]
            if second["status"] != "ok":
                results[name] = second
                continue
            figures = dict(second)
            figures.update(summarize(records, first["wall_s"] + second["wall_s"]))
            figures["by_turn"] = by_turn(records)
            figures["startup_s"] = first["startup_s"]
            figures["restart_startup_s"] = second["startup_s"]
            tier = {k: first.get(k, 0) + second.get(k, 0) for k in ("tier_hits", "tier_misses")}
            tier["tier_load_ms"] = (first.get("tier_load_ms") or []) + (
                second.get("tier_load_ms") or [])
            tier["tier_bytes"] = second.get("tier_bytes")
            figures.pop("tier_load_ms", None)
            figures.update(returning_figures(records, workload.restart_after, tier))
            if "tier_hits" not in second:  # no tier in this configuration
                figures.update(tier_hit_rate=None, tier_load_ms_p50=None, tier_bytes=None)
            results[name] = figures
    add_ratios(results)
    return results, all_turns


def report_for(results: dict[str, dict[str, Any]], workload: Workload, options: EngineOptions,
               machine: dict[str, Any]) -> dict[str, Any]:
    """The report in ``run_chat``'s shape."""
    return {
        "configs": results, "targets": returning_targets(results), "machine": machine,
        "workload": {
            "name": workload.name, "mode": workload.mode, "sessions": workload.num_sessions,
            "turns": workload.num_turns, "max_tokens": workload.max_tokens,
            "system_tokens": workload.system_tokens, "document_tokens": 0,
            "model": options.model, "max_model_len": options.max_model_len,
            "kv_cache_gib": options.kv_cache_gib, "threads": options.threads,
            "restart_after": workload.restart_after,
        },
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
