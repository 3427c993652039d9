"""``bench chat``'s verdict against stock vLLM, from pairs on one engine (issues 10 and 19).

``bench chat`` builds each configuration in a process of its own. One vLLM process decodes
10-20% faster than the next on a quiet machine (the process, not the code: the same
configuration's rounds spread that much), so two configurations at the same speed on the same
engine get ratios anywhere in 0.9-1.1 and issue 19's 1.03x / 0.97x verdicts flip between runs
of one command. Where the engines allow it, issue 10 asks for A/B interleaving in one process:
the vLLM engine does. So after the process rounds, each suffixmem configuration on the vLLM
engine that ran beside its stock peer at the same isolation (``PEERS``) also runs paired with
that peer on one engine, turn by turn or wave by wave (``paired.run_paired``: the same workload,
the same rounds), and the two speed targets of issue 19 take their values from those pairs:
the median per-turn (per-wave) TTFT ratio from turn 8 and the pooled output-throughput ratio.
The process figures stay in the report beside them; every target names where its value came
from (``method``: ``paired`` or ``processes``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from suffixmem_bench.chat.metrics import all_passed
from suffixmem_bench.chat.paired import run_paired
from suffixmem_bench.chat.paired_report import TARGET, THROUGHPUT_TARGET
from suffixmem_bench.chat.peers import EngineOptions
from suffixmem_bench.chat.workload import Workload
from suffixmem_bench.measure import finite_number, set_threads

PEERS: dict[str, tuple[str, str]] = {
    "suffixmem_vllm": ("vllm_direct_salted", "session"),
    "suffixmem_vllm_app": ("vllm_direct", "app"),
}
"""suffixmem configuration on the vLLM engine -> (its stock peer at the same isolation, the
``run_paired`` scope that pairs them)."""

TTFT_TARGET_KEY = "ttft_from_turn8_le_1_03x_vllm_direct_same_isolation"
THROUGHPUT_TARGET_KEY = "output_tok_s_ge_0_97x_vllm_direct_same_isolation"


def pairs_to_run(results: dict[str, dict[str, Any]]) -> list[str]:
    """The suffixmem configurations to pair: those of ``PEERS`` that ran (status ok) beside
    their peer."""
    ok = {name for name, fig in results.items() if fig.get("status") == "ok"}
    return [name for name, (peer, _scope) in PEERS.items() if name in ok and peer in ok]


def run_pairs(names: list[str], workload: Workload, options: EngineOptions, repeats: int,
              concurrent: bool,
              progress: Callable[[str, int, int], None] | None = None,
              engine: Any = None, log_path: Path | None = None) -> dict[str, Any]:
    """Pair every configuration of ``names`` with its peer on one engine in this process, for
    ``repeats`` rounds; returns per configuration its ``summary``, or ``status: "error"`` with
    the reason (one failed pair does not stop the others). ``progress(name, done, total)``;
    ``engine``: a ``VLLMEngine`` to pair on (left open) instead of one built per pair;
    ``log_path``: where vLLM's own log lines go meanwhile (``vllm_log_to``)."""
    set_threads(options.threads)  # as each configuration's process: the same thread count
    with vllm_log_to(log_path) as log_config:
        out: dict[str, Any] = {}
        for name in names:
            peer, scope = PEERS[name]
            try:
                report, _records = run_paired(
                    workload, options, repeats, concurrent=concurrent, scope=scope, engine=engine,
                    progress=None if progress is None else (
                        lambda done, total, name=name: progress(name, done, total)),
                    log_config=log_config)
            except Exception as e:  # reported in the JSON, never estimated
                out[name] = {"status": "error", "peer": peer, "scope": scope,
                             "reason": f"{type(e).__name__}: {e}"}
                continue
            out[name] = summary(report, peer, scope)
        return out


@contextlib.contextmanager
def vllm_log_to(path: Path | None) -> Iterator[str | None]:
    """vLLM's log lines and Python warnings go to ``path`` while the block runs, as each
    configuration's child process writes its own to a log file: the paired phase runs vLLM in
    the benchmark's process, whose stderr carries the progress and the report. Yields the
    ``dictConfig`` file to give each engine built meanwhile (``EngineArgs.log_config_file``):
    vLLM reconfigures its logging when it builds an engine, so swapping handlers beforehand
    does not hold; ``VLLM_LOGGING_CONFIG_PATH`` covers what it logs on import. ``None``: left
    as they are."""
    if path is None:
        yield None
        return
    config = path.with_suffix(".logging.json")
    config.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(asctime)s %(name)s: %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(path),
                              "formatter": "plain", "encoding": "utf-8"}},
        "loggers": {name: {"handlers": ["file"], "level": "INFO", "propagate": False}
                    for name in ("vllm", "py.warnings")},
    }), encoding="utf-8")
    before = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(config)
    logging.captureWarnings(True)
    try:
        yield str(config)
    finally:
        logging.captureWarnings(False)
        if before is None:
            os.environ.pop("VLLM_LOGGING_CONFIG_PATH", None)
        else:
            os.environ["VLLM_LOGGING_CONFIG_PATH"] = before


def summary(report: dict[str, Any], peer: str, scope: str) -> dict[str, Any]:
    """The figures of a ``run_paired`` report that ``bench chat`` keeps: both arms' TTFT from
    turn 8 and throughput (median with min-max over rounds), the manager's overhead, and the
    paired ratios with their spreads over rounds."""
    arms, paired = report["arms"], report["paired"]

    def arm(name: str) -> dict[str, Any]:
        a = arms[name]
        row = {k: {x: a[k][x] for x in ("median", "min", "max")}
               for k in ("ttft_p50_from_turn8_ms", "output_tok_s")}
        row["pre_engine_ms_p50"] = a["pre_engine_ms_p50"]
        for k in ("manager_overhead_ms_p50", "manager_overhead_ms_p99"):
            if k in a:
                row[k] = a[k]
        return row

    return {
        "status": "ok", "peer": peer, "scope": scope, "unit": paired["unit"],
        "turns": paired["turns"], "repeats": report["workload"]["repeats"],
        "ttft_ratio_p50": paired["ttft_ratio_p50"],
        "ttft_diff_ms_p50": paired["ttft_diff_ms_p50"],
        "throughput_ratio": paired["throughput_ratio"],
        "round_ratio": paired["round_ratio"],
        "same_prompts": report["same_prompts"],
        "arms": {"stock": arm("stock"), "suffixmem": arm("suffixmem")},
    }


def apply(targets: dict[str, Any], pairs: dict[str, Any]) -> None:
    """Replace, in ``targets`` (``metrics.evaluate_targets``' result), the values of issue 19's
    two speed targets with the paired ratios for every configuration paired successfully;
    every other configuration's entry says it came from the process rounds. Recomputes each
    target's overall ``passed``."""
    for key, figure, limit, at_most in (
            (TTFT_TARGET_KEY, "ttft_ratio_p50", TARGET, True),
            (THROUGHPUT_TARGET_KEY, "throughput_ratio", THROUGHPUT_TARGET, False)):
        target = targets.get(key)
        if target is None:
            continue
        for name, entry in target["configs"].items():
            pair = pairs.get(name, {})
            if pair.get("status") != "ok":
                entry["method"] = "processes"
                continue
            value = pair[figure]
            passed = (None if not finite_number(value)  # no turn 8 in a short workload
                      else bool(value <= limit if at_most else value >= limit))
            target["configs"][name] = {
                "value": value, "limit": limit, "passed": passed, "peer": pair["peer"],
                "method": "paired", "unit": f"ratio to the peer, paired by {pair['unit']}",
                "processes": entry}
        target["passed"] = all_passed([e["passed"] for e in target["configs"].values()])
        target["rule"] += ("; the vLLM engine's configurations: the paired ratio on one engine "
                           "(chat/same_engine.py)")
