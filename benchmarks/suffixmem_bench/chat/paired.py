"""Stock vLLM's chat path against suffixmem's on one engine, turn by turn: ``suffixmem bench
paired``.

``bench chat`` builds each configuration in a process of its own and alternates whole rounds;
its configurations' TTFT medians move by 5-20% between rounds, so a difference of a few percent
between suffixmem over vLLM and stock vLLM (issue 19's 1.03x) falls inside that spread and its
verdict flips between runs. This command takes the process, the engine and the machine's drift
out of the comparison: one embedded vLLM engine (``VLLMEngine``, one object) serves two arms in
one process:

- ``stock``: ``peers.VLLMHistory`` with a cache salt per session (``vllm_direct_salted``): the
  chat template over the text history, re-tokenized every turn, as a framework sends it;
- ``suffixmem``: ``configs.SuffixmemChat`` (``ConversationManager`` over that engine, SQLite in
  a temporary folder, isolation ``session``: a salt per session).

``scope="app"`` pairs the wider sharing instead, as issue 19 allows: ``stock`` is
``vllm_direct`` (no salt per session: every session in one namespace) and ``suffixmem`` runs in
isolation scope ``app`` (one salt for the tenant). The engine is built in scope ``app`` and each
arm gets a tenant of its own per round (set on the engine before each of its turns or waves,
one arm at a time), so the arms share nothing with each other or with an earlier round, and
each shares everything among its own sessions.

Every turn of the workload runs in both arms back to back, the first arm alternating turn by
turn and between rounds (A/B, B/A, ...: ``measure``'s interleaving at the finest grain). After
a suffixmem turn its manager's queued bookkeeping (commit, topic update) is flushed, so it never
lands in the stock arm's turn; the flush counts as suffixmem's busy time (below). Each round
opens new sessions under new salts, so no round reuses an earlier one's blocks and no arm the
other's.

``concurrent``: every session's turn t at once (one thread per session), as ``bench chat
--concurrent`` sends them, in waves: arm A's wave of turn t, then arm B's, the first arm
alternating by turn and round. A wave ends when its last reply has ended and (suffixmem) its
manager's queued work is flushed.

Throughput counts all the work an arm causes: an arm's ``busy`` time is its turns' latency plus
the suffixmem manager's flush after them (sequential), or its waves' wall time, flush included
(concurrent, split evenly over the wave's turns); ``output_tok_s`` is its output tokens over its
busy time, per round.

Report: ``paired_report.summarize`` (its module docstring).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from suffixmem_bench.chat.paired_report import ARMS, LATE_TURN, summarize
from suffixmem_bench.chat.peers import (
    EngineOptions,
    TurnOutcome,
    VLLMHistory,
    vllm_pool_extra,
    wrap_stream,
)
from suffixmem_bench.chat.workload import Workload, schedule
from suffixmem_bench.measure import check_repeats

SCOPES: tuple[str, ...] = ("session", "app")


class _EntryClock:
    """Notes when each request reaches the engine, per calling thread (concurrent waves call
    from several); ``remove()`` takes the wrapper back."""

    def __init__(self, engine: Any) -> None:
        self._local = threading.local()
        self.remove = wrap_stream(engine, self._stamp)

    @property
    def at(self) -> float:
        return float(getattr(self._local, "at", 0.0))

    def _stamp(self, _request: Any) -> None:
        self._local.at = time.perf_counter()


def run_paired(workload: Workload, options: EngineOptions, repeats: int = 3,
               progress: Callable[[int, int], None] | None = None, late_turn: int = LATE_TURN,
               engine: Any = None, concurrent: bool = False, scope: str = "session",
               log_config: str | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``workload`` in both arms on one vLLM engine for ``repeats`` rounds, turn by turn
    (round robin) or in concurrent waves (``concurrent``; module docstring); returns (the report
    without ``RunContext`` fields, one record per arm and turn). ``progress(done, total)`` is
    called after each turn pair (each wave pair when concurrent); ``late_turn``: see
    ``summarize``. ``engine``: a ``VLLMEngine`` to run on (left open, its isolation put back)
    instead of one built from ``options``. ``scope``: ``session`` or ``app`` (module
    docstring). ``log_config``: a logging ``dictConfig`` file for the engine built here
    (``same_engine.vllm_log_to``)."""
    from suffixmem.engine import create_engine
    from suffixmem.engine.isolation import IsolationPolicy
    from suffixmem_bench.chat.configs import SuffixmemChat

    check_repeats(repeats)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {list(SCOPES)}, got {scope!r}")
    owned = engine is None
    if engine is None:
        extra = vllm_pool_extra(options).get("extra", {})
        if log_config:  # vLLM's logging set up from this file when it builds the engine
            extra = {**extra, "log_config_file": log_config}
        engine = create_engine("vllm", model=options.model, max_model_len=options.max_model_len,
                               kv_cache_gib=options.kv_cache_gib, isolation=scope,
                               tenant="paired", extra=extra)
    isolation = engine.isolation

    def enter(arm: str, rnd: int) -> None:
        """Give ``arm`` its own tenant for round ``rnd`` (app scope; one arm runs at a time)."""
        if scope == "app":
            engine.isolation = IsolationPolicy("app", f"{arm}-r{rnd}")

    clock = _EntryClock(engine)
    records: list[dict[str, Any]] = []
    pool = ThreadPoolExecutor(max_workers=workload.num_sessions) if concurrent else None
    try:
        for r in range(repeats):
            arms: dict[str, Any] = {
                "stock": VLLMHistory(f"stock-r{r}", options, prefix_caching=True,
                                     salted=scope == "session", engine=engine),
                "suffixmem": SuffixmemChat("suffixmem_vllm", "vllm", options,
                                           shared_engine=engine,
                                           session_prefix=f"paired-r{r}"),
            }
            try:
                for s in range(workload.num_sessions):
                    for arm in arms.values():
                        arm.open(s, workload.system_prompt_of(s))
                if pool is None:
                    _sequential(arms, workload, r, clock, records, progress, repeats, enter)
                else:
                    _waves(arms, workload, r, clock, records, progress, repeats, pool, enter)
            finally:
                for arm in arms.values():
                    arm.close()
    finally:
        if pool is not None:
            pool.shutdown()
        clock.remove()
        engine.isolation = isolation
        if owned:
            engine.close()
    report = summarize(records, workload, repeats, late_turn, concurrent)
    report["workload"]["scope"] = scope
    return report, records


def _flush_ms(arm: Any) -> float:
    """Flush the suffixmem arm's queued bookkeeping (commit, topic update) so that it never
    lands in the other arm's turn; its time (0 for stock) counts as the arm's busy time."""
    manager = getattr(arm, "manager", None)
    if manager is None:
        return 0.0
    t0 = time.perf_counter()
    manager.flush()
    return (time.perf_counter() - t0) * 1000


def _sequential(arms: dict[str, Any], workload: Workload, r: int, clock: _EntryClock,
                records: list[dict[str, Any]], progress: Callable[[int, int], None] | None,
                repeats: int, enter: Callable[[str, int], None]) -> None:
    """Round ``r``: every (session, turn) in both arms back to back, alternating the first."""
    order = schedule(workload)
    for i, (s, t) in enumerate(order):
        turn_order = ARMS if (i + r) % 2 == 0 else ARMS[::-1]
        for name in turn_order:
            enter(name, r)
            t0 = time.perf_counter()
            out: TurnOutcome = arms[name].turn(s, workload.sessions[s][t])
            pre_ms = (clock.at - t0) * 1000
            busy = out.latency_s * 1000 + _flush_ms(arms[name])
            records.append(_record(name, r, s, t, turn_order[0] == name, out, pre_ms, busy))
        if progress is not None:
            progress(r * len(order) + i + 1, repeats * len(order))


def _waves(arms: dict[str, Any], workload: Workload, r: int, clock: _EntryClock,
           records: list[dict[str, Any]], progress: Callable[[int, int], None] | None,
           repeats: int, pool: ThreadPoolExecutor, enter: Callable[[str, int], None]) -> None:
    """Round ``r``: per turn, every session's turn at once in one arm, then in the other."""
    sessions = range(workload.num_sessions)

    def one(arm: Any, s: int, t: int) -> tuple[TurnOutcome, float]:
        t0 = time.perf_counter()
        out = arm.turn(s, workload.sessions[s][t])
        return out, (clock.at - t0) * 1000

    for t in range(workload.num_turns):
        turn_order = ARMS if (t + r) % 2 == 0 else ARMS[::-1]
        for name in turn_order:
            enter(name, r)
            t0 = time.perf_counter()
            futures = [pool.submit(one, arms[name], s, t) for s in sessions]
            outs = [f.result() for f in futures]  # re-raises a turn's error here
            _flush_ms(arms[name])
            busy = (time.perf_counter() - t0) * 1000 / len(outs)
            for s, (out, pre_ms) in zip(sessions, outs, strict=True):
                records.append(_record(name, r, s, t, turn_order[0] == name, out, pre_ms,
                                       busy))
        if progress is not None:
            progress(r * workload.num_turns + t + 1, repeats * workload.num_turns)


def _record(arm: str, rnd: int, session: int, turn: int, first: bool, out: TurnOutcome,
            pre_ms: float, busy_ms: float) -> dict[str, Any]:
    return {"arm": arm, "round": rnd, "session": session, "turn": turn + 1, "first": first,
            "ttft_ms": out.ttft_s * 1000, "latency_ms": out.latency_s * 1000,
            "pre_engine_ms": pre_ms, "busy_ms": busy_ms,
            "engine_ttft_ms": (out.engine_ttft_s * 1000 if out.engine_ttft_s is not None
                               else float("nan")),
            "prompt_tokens": len(out.prompt_ids),
            "cached_tokens": out.cached_tokens, "output_tokens": len(out.reply_ids),
            "manager_overhead_ms": out.manager_overhead_ms}


def register(bench: Any) -> None:
    """Add ``suffixmem bench paired`` to the CLI's ``bench`` group."""
    import typer

    @bench.command("paired")
    def paired(
        sessions: int = typer.Option(4, min=1, help="Sessions."),
        turns: int = typer.Option(10, min=1, help="Turns per session."),
        max_tokens: int = typer.Option(32, min=1, help="Reply length limit, tokens."),
        system_tokens: int = typer.Option(300, min=0, help="System prompt size, tokens."),
        model: str | None = typer.Option(None, help="Model (default: suffixmem's default)."),
        max_model_len: int = typer.Option(4096, help="Context window."),
        kv_cache_gib: float = typer.Option(1.0, help="KV pool (GiB) of the shared engine."),
        threads: int | None = typer.Option(None, help="CPU threads (default: all cores)."),
        repeats: int = typer.Option(3, min=3, help="Rounds (>= 3)."),
        concurrent: bool = typer.Option(False, "--concurrent", help="Every session's turn "
                                        "at once, in waves (one arm's, then the other's)."),
        scope: str = typer.Option("session", help="Isolation pair: session (suffixmem's "
                                  "default against vllm_direct_salted) or app (scope app "
                                  "against vllm_direct)."),
        out: str = typer.Option("results/paired", help="Folder for report.json and "
                                "turns.jsonl."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    ) -> None:
        """Stock vLLM's chat path vs suffixmem's on one engine, interleaved turn by turn."""
        import json
        import os
        from pathlib import Path

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        from suffixmem.config import DEFAULT_MODEL
        from suffixmem_bench.chat.run import token_counter
        from suffixmem_bench.chat.workload import build_workload
        from suffixmem_bench.measure import RunContext, set_threads

        if scope not in SCOPES:
            raise typer.BadParameter(f"expected one of {list(SCOPES)}, got {scope!r}",
                                     param_hint="--scope")
        model = model or DEFAULT_MODEL
        n_threads = set_threads(threads or os.cpu_count() or 1)
        options = EngineOptions(model=model, max_model_len=max_model_len,
                                kv_cache_gib=kv_cache_gib, max_tokens=max_tokens,
                                threads=n_threads)
        workload = build_workload(sessions=sessions, turns=turns, max_tokens=max_tokens,
                                  system_tokens=system_tokens, count=token_counter(model))
        err = Console(stderr=True)
        with RunContext(n_threads) as ctx, Progress(
                "paired", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=err) as bar:
            task = bar.add_task("turns", total=repeats * sessions * turns)
            report, records = run_paired(
                workload, options, repeats,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
                concurrent=concurrent, scope=scope)
        report.update(ctx.fields())
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(report, indent=2, default=float)
        (folder / "report.json").write_text(text + "\n", encoding="utf-8")
        with (folder / "turns.jsonl").open("w", encoding="utf-8") as f:
            for x in records:
                f.write(json.dumps(x) + "\n")
        if as_json:
            print(text)
            return
        p, t, tp = report["paired"], report["target"], report["throughput_target"]
        for name in ARMS:
            a = report["arms"][name]
            err.print(f"{name:9s} TTFT p50 from turn {LATE_TURN}: "
                      f"{a['ttft_p50_from_turn8_ms']['median']:.1f} ms "
                      f"[{a['ttft_p50_from_turn8_ms']['min']:.1f}-"
                      f"{a['ttft_p50_from_turn8_ms']['max']:.1f}], before the engine "
                      f"{a['pre_engine_ms_p50']:.2f} ms, {a['output_tok_s']['median']:.1f} "
                      f"output tokens/s")
        err.print(f"paired: suffixmem/stock TTFT {p['ttft_ratio_p50']:.3f} "
                  f"({p['ttft_diff_ms_p50']:+.2f} ms) over {p['turns']} turns: "
                  + ("pass" if t["pass"] else "FAIL") + f" (<= {t['limit']}x)")
        rr = p["throughput_round_ratios"]
        err.print(f"paired: suffixmem/stock output tokens/s {p['throughput_ratio']:.3f} "
                  f"[{min(rr):.3f}-{max(rr):.3f} by round]: "
                  + ("pass" if tp["pass"] else "FAIL") + f" (>= {tp['limit']}x)")
