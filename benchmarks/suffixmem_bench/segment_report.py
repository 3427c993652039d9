"""Console tables of ``bench segments``' result (``--json`` prints the object instead)."""

from __future__ import annotations

from typing import Any

COLUMNS = ("mean_kl", "top1_agreement", "free_running_agreement", "task_agreement",
           "task_agreement_exact_right", "first_line_agreement", "compute_share")


def _methods(console: Any, result: dict[str, Any], dtype: str) -> None:
    from rich.table import Table

    blocks = {f"scenario {k}": v for k, v in result.get("methods", {}).items()}
    blocks.update({f"{k} events ({v['events']})": v["methods"]
                   for k, v in result.get("events", {}).items() if v.get("methods")})
    for title, rows in blocks.items():
        table = Table(title=f"recompute methods, {title} ({dtype} primitives)")
        table.add_column("method")
        for col in ("mean KL", "top-1", "free-running", "task", "task, exact right",
                    "first line", "compute share"):
            table.add_column(col, justify="right")
        for label, row in rows.items():
            table.add_row(label, *("-" if c not in row else f"{row[c]:.4f}" if c == "mean_kl"
                                   else f"{row[c]:.3f}" for c in COLUMNS))
        console.print(table)
    for name, d in result.get("workload_defaults", {}).items():
        state = "[green]segment reuse on[/]" if d["segment_reuse"] else "[yellow]exact[/]"
        console.print(f"default for {name}: {state} ({d['method']}): {d['why']}")


def print_events_report(console: Any, result: dict[str, Any]) -> None:
    """``bench segments --events``' result: each workload's replay and methods, and the
    defaults per workload class (the whole bench's report needs its grid)."""
    for name, ev in result["events"].items():
        console.print(f"{name}: {ev['events']} reuse events, {ev['prompt_tokens_mean']:.0f} "
                      f"prompt tokens on average; chosen {ev.get('chosen') or '-'}")
        if "chained" in ev:
            c = ev["chained"]
            console.print(
                f"{name}, {c['sessions']} sessions served with {c['method']}, reuse chained: "
                f"free-running {c['free_running_agreement']} (one hop "
                f"{c['free_running_unchained']}), task {c['task_agreement']} (one hop "
                f"{c['task_agreement_unchained']}) on {c['task_events']} questions")
    _methods(console, result, result["setup"]["dtype"])


def print_report(console: Any, result: dict[str, Any]) -> None:
    """The grid, the scenarios, the methods, the events and the defaults as tables."""
    from rich.table import Table

    table = Table(title="segment reuse vs full recomputation")
    for col in ("k", "r", "mean KL", "top-1", "free-running", "TTFT speed-up"):
        table.add_column(col, justify="right")
    for row in result["grid"]:
        table.add_row(str(row["k"]), f"{row['r']:.2f}", f"{row['mean_kl']:.4f}",
                      f"{row['top1_agreement']:.3f}", f"{row['free_running_agreement']:.3f}",
                      f"{row['ttft_speedup']:.2f}x")
    console.print(table)
    dtype = result.get("setup", {}).get("dtype", "bf16")  # runs before 2026-12-03: bf16
    scen = Table(title=f"scenarios ({dtype}, method {result['scenario_gate']['method']})")
    for col in ("scenario", "mean KL", "top-1", "free-running", "task", "exact right",
                "reuse right", "TTFT speed-up"):
        scen.add_column(col, justify="right")
    for name, row in result["scenarios"].items():
        right = [f"{row[k]:.2f}" if k in row else "-"
                 for k in ("task_exact_accuracy", "task_reuse_accuracy")]
        scen.add_row(name, f"{row['mean_kl']:.4f}", f"{row['top1_agreement']:.3f}",
                     f"{row['free_running_agreement']:.3f}", f"{row['task_agreement']:.2f}",
                     *right, f"{row['ttft_speedup']:.2f}x")
    console.print(scen)
    _methods(console, result, dtype)
    gate, d = result["gate"], result["defaults"]
    share = gate["segment_share"]
    if gate["passed"]:
        console.print(f"[bold green]defaults: k={d['k']}, r={d['r']}[/] (segments are "
                      f"{share:.0%} of the prompt; gate passed)")
    else:
        console.print(f"[bold yellow]no setting passes the gate[/] (top-1 >= "
                      f"{gate['top1_min']}, KL <= {gate['kl_max']}, speed-up >= "
                      f"{gate['speedup_min']}x at {share:.0%} segments): "
                      f"exact mode stays the default; best candidate k={d['k']}, r={d['r']}")
    det = result["detector"]
    console.print(f"detector: {det['regions']} regions on real sessions, "
                  f"{det['regions_reused_later']} met again later "
                  f"({det['region_reuse_rate']:.0%})")
