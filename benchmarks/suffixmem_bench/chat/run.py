"""``suffixmem bench chat``: multi-session, multi-turn chat against naive recompute and peers.

``run_chat(...)`` builds the workload (``workload``), runs every configuration in a
process of its own (``worker``), alternating: every configuration once per round for
``repeats`` (>= 3) rounds (``measure``), and returns the report (medians with ``spread``,
ratios to each baseline, strongest first: ``_vs_vllm_direct``, ``_vs_vllm_direct_salted``,
``_vs_naive``; ``commit``, ``load_avg``, ``matmul_gflops``, ``noisy``):
``{"configs": {NAME: figures}, "targets": {...}, "machine": {...}, "workload": {...},
"date": ...}``. Figures are defined in ``metrics``; a configuration that cannot be
built here (a module not written yet, a package not installed) has ``status: "missing"`` and a
reason, one that failed ``status: "error"``; nothing is estimated in their place.
``write_report`` (``report``) turns the report into JSON, markdown and PNG plots.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from suffixmem_bench.chat import same_engine
from suffixmem_bench.chat.child import run_lockstep, run_one
from suffixmem_bench.chat.configs import BASELINES, CONFIGS, DEFAULT_CONFIGS
from suffixmem_bench.chat.metrics import (
    TurnRecord,
    add_ratios,
    evaluate_targets,
    merge_repeats,
    same_text_from_drop,
    same_text_share,
)
from suffixmem_bench.chat.peers import EngineOptions
from suffixmem_bench.chat.report import machine_info, markdown_table, to_json, write_report
from suffixmem_bench.chat.returning import CONFIGS as RETURNING_CONFIGS
from suffixmem_bench.chat.returning import KV_CACHE_GIB as RETURNING_KV_GIB
from suffixmem_bench.chat.returning import (
    build_returning_workload,
    report_for,
    run_returning,
)
from suffixmem_bench.chat.workload import build_workload

DEFAULT_OUT = Path("results/chat")
err_console = Console(stderr=True)


def token_counter(model: str) -> Any:
    """``count(text) -> tokens`` with the model's own tokenizer."""
    from transformers import AutoTokenizer

    from suffixmem.models import resolve_model

    tok = AutoTokenizer.from_pretrained(str(resolve_model(model, progress=False)))
    return lambda text: len(tok(text, add_special_tokens=False)["input_ids"])


EXACT_REFERENCE = "suffixmem_torch_exact"
"""The configuration whose replies approximate ones are compared with (context shift off)."""


def run_chat(
    *,
    configs: tuple[str, ...] = DEFAULT_CONFIGS,
    sessions: int = 4,
    turns: int = 10,
    max_tokens: int = 32,
    system_tokens: int = 300,
    long: bool = False,
    document_tokens: int = 1500,
    concurrent: bool = False,
    model: str | None = None,
    max_model_len: int = 4096,
    kv_cache_gib: float = 1.0,
    threads: int | None = None,
    timeout_s: float = 1800.0,
    progress: bool = True,
    workload_name: str | None = None,
    repeats: int = 3,
    keep_db: Path | None = None,
    segment_method: str | None = None,
    lockstep: bool = False,
    paired: bool = True,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the benchmark; returns the report and every turn's record (with its config name
    and repeat). Configurations run as alternating processes (``measure``): every
    configuration once per round, ``repeats`` (>= 3) rounds; figures are medians with
    ``spread``. ``lockstep``: a round's processes all alive, stepped turn by turn (or wave by
    wave) in a seeded shuffled order (``child.run_lockstep``). ``keep_db``: keep each suffixmem
    configuration's database (with its segment log, for ``bench retention --trace``) there,
    from the last round. ``segment_method``:
    the segment-reuse configurations' recompute method (``EngineConfig.segment_method``).

    ``workload_name`` picks one of ``suffixmem_bench.workloads`` (``overflow``, ``rag``,
    ``shared``): its builder, its pinned engine options and its targets replace the default
    ones; the sizes given here override the pinned ones only where they differ from this
    function's defaults."""
    from suffixmem.config import DEFAULT_MODEL
    from suffixmem_bench.measure import RunContext, check_repeats

    check_repeats(repeats)

    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; expected some of {list(CONFIGS)}")
    model = model or DEFAULT_MODEL
    machine = machine_info()
    pinned = None
    if workload_name:
        from suffixmem_bench.workloads import get as get_workload

        pinned = get_workload(workload_name)
        given = {"sessions": (sessions, 4), "turns": (turns, 10),
                 "max_tokens": (max_tokens, 32), "system_tokens": (system_tokens, 300)}
        workload = pinned.build(token_counter(model), **{
            k: v for k, (v, default) in given.items() if v != default and k in pinned.PINNED})
        sessions, turns, max_tokens = (workload.num_sessions, workload.num_turns,
                                       workload.max_tokens)
        max_model_len = pinned.ENGINE_OPTIONS.get("max_model_len", max_model_len)
        if concurrent:
            workload.mode = "concurrent"
    else:
        workload = build_workload(
            sessions=sessions, turns=turns, max_tokens=max_tokens, system_tokens=system_tokens,
            document_tokens=document_tokens if long else 0, count=token_counter(model),
            mode="concurrent" if concurrent else "round_robin",
        )
    options = EngineOptions(model=model, max_model_len=max_model_len, kv_cache_gib=kv_cache_gib,
                            max_tokens=max_tokens, threads=threads or os.cpu_count() or 1,
                            segment_method=segment_method)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    all_turns: list[dict[str, Any]] = []
    per_config = sessions * turns * repeats
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with tempfile.TemporaryDirectory(prefix="suffixmem-bench-chat-") as tmp, Progress(
        *columns, console=err_console, disable=not progress, transient=False,
    ) as bar, RunContext(options.threads) as ctx:
        task = bar.add_task("chat benchmark", total=per_config * len(configs))
        def keep(rep: int, name: str, figures: dict[str, Any],
                 records: list[TurnRecord]) -> None:
            rounds[name].append(figures)
            all_turns.extend({"config": name, "repeat": rep, **r.to_dict()} for r in records)
            if figures["status"] != "ok":
                bar.console.print(f"[yellow]{name}: {figures['status']}[/] — "
                                  f"{figures['reason'].splitlines()[0]}")
            elif progress and not bar.console.is_terminal:
                # no live bar in a log file: one line per configuration instead
                bar.console.print(
                    f"{name}: {figures['turns']} turns in {figures['wall_s']:.0f} s, TTFT p50 "
                    f"{figures['ttft_p50_s'] * 1000:.0f} ms, hit rate {figures['hit_rate']:.1%}")

        def show(name: str, event: dict[str, Any]) -> None:
            i = configs.index(name)
            if event["event"] == "turn":
                r = event["record"]
                bar.update(task, advance=1, description=(
                    f"[{i + 1}/{len(configs)}] {name}: session {r['session'] + 1} turn "
                    f"{r['turn']} ttft {r['ttft_s'] * 1000:.0f} ms"))
            elif event["event"] == "started":
                bar.update(task, description=(
                    f"[{i + 1}/{len(configs)}] {name}: started in "
                    f"{event['startup_s']:.0f} s"))

        for rep in range(repeats):
            if lockstep:
                out = run_lockstep(configs, workload, options, rnd=rep,
                                   timeout_s=timeout_s * len(configs), log_dir=Path(tmp),
                                   on_event=show, keep_db=keep_db)
                for name in configs:
                    keep(rep, name, *out[name])
                bar.update(task, completed=per_config * len(configs) * (rep + 1) // repeats)
                continue
            for i, name in enumerate(configs):
                bar.update(task, description=f"[{i + 1}/{len(configs)}] {name}: starting")
                figures, records = run_one(
                    name, workload, options, timeout_s=timeout_s,
                    on_event=lambda event, name=name: show(name, event), log_dir=Path(tmp),
                    keep_db=keep_db)
                # skipped or failed turns
                bar.update(task, advance=per_config // repeats - len(records))
                keep(rep, name, figures, records)
        results: dict[str, dict[str, Any]] = {
            name: merge_repeats(rs) for name, rs in rounds.items()}
        pairs: dict[str, Any] = {}
        if paired and pinned is None and (names := same_engine.pairs_to_run(results)):
            task = bar.add_task("paired on one engine", total=None)

            def step(name: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total,
                           description=f"paired on one engine: {name}")

            pairs = same_engine.run_pairs(names, workload, options, repeats, concurrent,
                                          progress=step if progress else None,
                                          log_path=Path(tmp) / "paired.log")
    for baseline in BASELINES:  # the strongest baseline's ratios first in the JSON
        add_ratios(results, baseline)
    targets = (pinned.targets(results) if pinned is not None
               else evaluate_targets(results, workload.name))
    same_engine.apply(targets, pairs)
    report = {
        "configs": results,
        "targets": targets,
        "same_engine": pairs,
        "workload": {
            "name": workload.name, "mode": workload.mode, "sessions": sessions, "turns": turns,
            "max_tokens": max_tokens, "system_tokens": workload.system_tokens,
            "document_tokens": workload.document_tokens, "model": model,
            "max_model_len": max_model_len, "kv_cache_gib": kv_cache_gib,
            "threads": options.threads, "repeats": repeats,
            "segment_method": segment_method,
            "interleave": "lockstep" if lockstep else "process",
            "paired": sorted(pairs),
        },
        "baselines": [b for b in BASELINES if results.get(b, {}).get("status") == "ok"],
        **ctx.fields(),
        "machine": machine,  # machine_info(): RunContext's fields and the library versions
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if results.get(EXACT_REFERENCE, {}).get("status") == "ok":
        # what approximate reuse changed in what the model said (greedy: same prompts, same
        # text unless the KV differed)
        report["text_same_as_exact"] = same_text_from_drop(all_turns, EXACT_REFERENCE)
    return report, all_turns


def run_returning_chat(
    *, configs: tuple[str, ...], sessions: int, turns: int, max_tokens: int, model: str | None,
    max_model_len: int, kv_cache_gib: float, threads: int | None, timeout_s: float,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``returning`` workload (``chat/returning.py``): report and turn records."""
    from suffixmem.config import DEFAULT_MODEL

    model = model or DEFAULT_MODEL
    workload = build_returning_workload(count=token_counter(model), sessions=sessions,
                                        turns=turns, max_tokens=max_tokens,
                                        restart_after=min(3, turns - 1))
    options = EngineOptions(model=model, max_model_len=max_model_len, kv_cache_gib=kv_cache_gib,
                            max_tokens=max_tokens, threads=threads or os.cpu_count() or 1)

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "turn":
            r = event["record"]
            err_console.print(f"[dim]session {r['session'] + 1} turn {r['turn']} ttft "
                              f"{r['ttft_s'] * 1000:.0f} ms, cached {r['cached_tokens']}[/]")

    from suffixmem_bench.measure import RunContext

    with RunContext(options.threads) as ctx:
        results, all_turns = run_returning(configs=configs, options=options,
                                           workload=workload, timeout_s=timeout_s,
                                           run_one=run_one, on_event=on_event)
    report = report_for(results, workload, options, machine_info())
    report.update({k: v for k, v in ctx.fields().items() if k != "machine"})
    report["text_same_as_naive"] = same_text_share(all_turns, "naive")
    return report, all_turns


def default_out_dir(base: Path, long: bool, concurrent: bool) -> Path:
    """``results/chat/default``, ``results/chat/long``, with ``-concurrent`` when so run."""
    return base / (("long" if long else "default") + ("-concurrent" if concurrent else ""))


def register(bench: typer.Typer) -> None:
    """Add ``suffixmem bench chat`` to the CLI's ``bench`` group."""

    @bench.command("chat")
    def chat(
        ctx: typer.Context,
        configs: str = typer.Option(",".join(DEFAULT_CONFIGS),
                                    help=f"Comma-separated subset of: {', '.join(CONFIGS)}."),
        sessions: int = typer.Option(4, min=1, help="Sessions (S)."),
        turns: int = typer.Option(10, min=1, help="Turns per session (T)."),
        max_tokens: int = typer.Option(32, min=1, help="Reply length limit, tokens."),
        system_tokens: int = typer.Option(300, min=0, help="System prompt size, tokens."),
        long: bool = typer.Option(False, "--long",
                                  help="Add a reference document after the system prompt."),
        document_tokens: int = typer.Option(1500, min=1,
                                            help="Reference document size with --long, tokens."),
        concurrent: bool = typer.Option(False, "--concurrent",
                                        help="One thread per session instead of round-robin."),
        model: str | None = typer.Option(None, help="Model (default: suffixmem's default)."),
        max_model_len: int = typer.Option(4096, help="Context window for every engine."),
        kv_cache_gib: float = typer.Option(1.0, help="KV pool (GiB) for every engine."),
        threads: int | None = typer.Option(None, help="CPU threads (default: all cores)."),
        timeout: float = typer.Option(1800.0, help="Per-configuration time limit, seconds."),
        out: str = typer.Option(str(DEFAULT_OUT),
                                 help="Results folder; the report goes in OUT/<workload>."),
        repeats: int = typer.Option(
            3, min=3, help="Alternating rounds of every configuration (>= 3)."),
        keep_db: str | None = typer.Option(None, help="Keep each suffixmem configuration's "
                                           "database (segment log) in this folder."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        lockstep: bool = typer.Option(
            False, "--lockstep", help="All of a round's configurations alive at once, stepped "
            "turn by turn (waves when --concurrent) in a shuffled order: finer interleaving, "
            "more memory."),
        paired: bool = typer.Option(
            True, "--paired/--no-paired", help="Afterwards, pair each suffixmem configuration "
            "on the vLLM engine with its stock peer on one engine, turn by turn (the ratios "
            "that decide issue 19's speed targets; default and long workloads)."),
        segment_method: str | None = typer.Option(
            None, help="Recompute method of the segment-reuse configurations, a BlendConfig "
            "label (k16, k16-q0.4, k16-p0.1; default: the engine's)."),
        workload: str = typer.Option(
            "default", help="default | long (same as --long) | returning (issue 13: 24 "
            "sessions x 6 turns, own ~1,000-token prompts, 256 MiB pool, restart after round "
            "3; --sessions/--turns/--configs/--kv-cache-gib apply when given) | a pinned "
            "workload of suffixmem_bench.workloads (overflow, rag, shared; its sizes unless "
            "given)."),
    ) -> None:
        """Multi-session multi-turn chat: suffixmem against naive recompute and peer engines."""
        names = tuple(c.strip() for c in configs.split(",") if c.strip())
        unknown = [c for c in names if c not in CONFIGS]
        if unknown:
            raise typer.BadParameter(f"unknown configurations {unknown}; "
                                     f"expected some of {list(CONFIGS)}")
        if segment_method is not None:
            from suffixmem.engine.reuse.blend import BlendConfig
            from suffixmem.errors import ConfigError

            try:
                BlendConfig.parse(segment_method)
            except ConfigError as e:
                raise typer.BadParameter(str(e)) from None
        from suffixmem_bench import workloads as pinned

        pinned_names = pinned.WORKLOADS
        if workload not in ("default", "long", "returning", *pinned_names):
            raise typer.BadParameter(f"unknown workload {workload!r}; expected one of "
                                     f"{['default', 'long', 'returning', *pinned_names]}")
        workload_name = workload if workload in pinned_names else ""
        if lockstep and workload == "returning":
            raise typer.BadParameter("the returning workload restarts its engines between "
                                     "rounds and cannot run in lockstep", param_hint="--lockstep")
        t0 = time.perf_counter()
        if workload == "returning":
            # by name: typer vendors its own click, whose ParameterSource is another enum
            given = {p for p in ("configs", "sessions", "turns", "kv_cache_gib")
                     if getattr(ctx.get_parameter_source(p), "name", "DEFAULT") != "DEFAULT"}
            report, turns_log = run_returning_chat(
                configs=names if "configs" in given else RETURNING_CONFIGS,
                sessions=sessions if "sessions" in given else 24,
                turns=turns if "turns" in given else 6, max_tokens=max_tokens, model=model,
                max_model_len=max_model_len,
                kv_cache_gib=kv_cache_gib if "kv_cache_gib" in given else RETURNING_KV_GIB,
                threads=threads, timeout_s=timeout)
            paths = write_report(report, Path(out) / "returning", turns_log)
            if as_json:
                print(to_json(report))
                return
            from rich.markdown import Markdown

            Console().print(Markdown(markdown_table(report)))
            err_console.print(f"[dim]{time.perf_counter() - t0:.0f} s; wrote "
                              + ", ".join(str(p) for p in paths) + "[/]")
            return
        long = long or workload == "long"
        report, turns_log = run_chat(
            configs=names, sessions=sessions, turns=turns, max_tokens=max_tokens,
            system_tokens=system_tokens, long=long, document_tokens=document_tokens,
            concurrent=concurrent, model=model, max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib, threads=threads, timeout_s=timeout,
            workload_name=workload_name or None, repeats=repeats,
            keep_db=Path(keep_db) if keep_db else None, segment_method=segment_method,
            lockstep=lockstep, paired=paired,
        )
        folder = (Path(out) / workload_name if workload_name
                  else default_out_dir(Path(out), long, concurrent))
        paths = write_report(report, folder, turns_log)
        if as_json:
            print(to_json(report))
            return
        from rich.markdown import Markdown

        Console().print(Markdown(markdown_table(report)))
        err_console.print(f"[dim]{time.perf_counter() - t0:.0f} s; wrote "
                          + ", ".join(str(p) for p in paths) + "[/]")
