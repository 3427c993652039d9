"""``suffixmem bench profile``: where one chat turn spends its time (issue 19 item 1).

A child process builds a ``ConversationManager`` over an engine (torch or vllm, temporary
SQLite), opens ``sessions`` sessions with a shared system prompt and warms each up with two
turns; then py-spy attaches to it (``py-spy record --pid``, all threads) while it runs
``turns`` more turns per session, sequentially (one session) or one thread per session at
once; py-spy stops before the engine shuts down. The collapsed stacks are folded into the top
functions by *self* samples (where the CPU was) and by *inclusive* samples (what a call cost
with its callees), each as a share of all samples, for the whole process and for the callers'
threads alone (the manager's work around the engine, ``callers``) and for the manager's
background thread (``background``: bookkeeping and verdicts run beside generation), and printed
or written as JSON. Start-up, warm-up and shutdown are not sampled. Turns are greedy with
``temperature=0`` given, as ``bench chat`` runs them (so the topic verdict runs beside
generation; see ``suffixmem.conversation.turns``).

Needs ``py-spy`` (``pip install py-spy``) and permission to ptrace one's own children.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

QUESTIONS = (
    "What is a computer?", "Who invented the telephone?", "Why is the sky blue?",
    "How do plants make food?", "What is the capital of France?", "Tell me about the moon.",
    "How does a bicycle stay upright?", "What is rain made of?", "Why do cats purr?",
    "What is a prime number?", "How far away is the sun?", "What do bees eat?",
)
CALLER_FRAME = "_child.<locals>.run"
BACKGROUND_FRAME = "Background._loop"  # the manager's bookkeeping thread (off the callers' path)
SYSTEM = "You are a helpful assistant. Answer briefly and clearly, in plain English."


def fold(raw: str, top: int = 15, focus: str | None = None) -> dict[str, Any]:
    """Top functions of py-spy's raw (collapsed) output: ``self`` and ``inclusive`` shares.
    ``focus``: only stacks with a frame containing this text (e.g. the callers' threads)."""
    self_n: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("thread (", "process "))]
        if not frames or (focus is not None and not any(focus in f for f in frames)):
            continue
        total += n
        self_n[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    share = (lambda c: [{"function": f, "share": n / total} for f, n in c.most_common(top)]
             ) if total else (lambda c: [])
    return {"samples": total, "self": share(self_n), "inclusive": share(incl)}


def _child(engine_name: str, sessions: int, turns: int, max_tokens: int) -> None:
    """The profiled process: set up, warm up, say ``ready``, wait for ``go``, run the turns."""
    from suffixmem.conversation.manager import ConversationManager
    from suffixmem.engine import create_engine

    engine = create_engine(engine_name, max_model_len=2048, kv_cache_gib=0.5)
    with tempfile.TemporaryDirectory() as tmp:
        mgr = ConversationManager(engine, f"sqlite:///{Path(tmp) / 'p.db'}")
        ids = [mgr.open_session(None, system_prompt=SYSTEM).id for _ in range(sessions)]
        overhead: list[float] = []
        lock = threading.Lock()

        def run(s: int, qs: tuple[str, ...]) -> None:
            for q in qs:
                t = mgr.chat(ids[s], q, temperature=0.0, max_tokens=max_tokens)
                with lock:
                    overhead.append(t.manager_overhead_ms)

        for s in range(sessions):  # warm-up: caches, first-call allocations, topic detector
            run(s, QUESTIONS[:2])
        overhead.clear()
        print("ready", flush=True)
        sys.stdin.readline()
        t0 = time.perf_counter()
        qs = tuple(QUESTIONS[2 + i % (len(QUESTIONS) - 2)] for i in range(turns))
        threads = [threading.Thread(target=run, args=(s, qs)) for s in range(sessions)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        from suffixmem_bench.chat.metrics import percentile

        print(json.dumps({"wall_s": wall, "turns": len(overhead),
                          "manager_overhead_ms_p50": percentile(overhead, 50),
                          "manager_overhead_ms_p99": percentile(overhead, 99),
                          "manager_overhead_ms_max": max(overhead)}), flush=True)
        sys.stdin.readline()  # the parent stops py-spy first: shutdown is not sampled
        mgr.close()
    engine.close()


def profile_turns(engine: str = "torch", sessions: int = 1, turns: int = 6,
                  max_tokens: int = 16, rate: int = 200, top: int = 15) -> dict[str, Any]:
    """Profile ``turns`` turns in each of ``sessions`` sessions (see the module docstring)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise RuntimeError("py-spy is not installed: pip install py-spy")
    child = subprocess.Popen(
        [sys.executable, "-m", "suffixmem_bench.profile", engine, str(sessions), str(turns),
         str(max_tokens)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert child.stdin is not None and child.stdout is not None
    line = child.stdout.readline()
    while line and line.strip() != "ready":
        line = child.stdout.readline()
    if not line:
        child.wait()
        raise RuntimeError(f"the profiled process exited ({child.returncode}) before its turns")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stacks.txt"
        spy_proc = subprocess.Popen(
            [spy, "record", "--pid", str(child.pid), "--format", "raw", "--threads",
             "--rate", str(rate), "--nonblocking", "-o", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # py-spy attaches before the turns start
        child.stdin.write("go\n")
        child.stdin.flush()
        summary = json.loads(child.stdout.readline())
        spy_proc.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        _, err = spy_proc.communicate(timeout=120)
        child.stdin.write("close\n")
        child.stdin.flush()
        child.wait()
        if not out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.strip()[-300:]}")
        raw = out.read_text()
    # the callers' threads: what the manager does around the engine (the driver excluded)
    callers = fold(raw, top, focus=CALLER_FRAME)
    background = fold(raw, top, focus=BACKGROUND_FRAME)
    return {"engine": engine, "sessions": sessions, "turns_per_session": turns,
            "max_tokens": max_tokens, **summary, **fold(raw, top), "callers": callers,
            "background": background}


def to_markdown(run: dict[str, Any]) -> str:
    """One profile as a markdown section (top functions by self and by inclusive share)."""
    head = (f"### {run['engine']}, {run['sessions']} session(s) x {run['turns_per_session']} "
            f"turns\n\n{run['turns']} turns in {run['wall_s']:.1f} s, {run['samples']} "
            f"samples; manager overhead p50 {run['manager_overhead_ms_p50']:.2f} ms, p99 "
            f"{run.get('manager_overhead_ms_p99', float('nan')):.2f} ms, max "
            f"{run['manager_overhead_ms_max']:.2f} ms.\n\n| self | function | | inclusive | "
            "function |\n|---:|---|---|---:|---|\n")
    rows = []
    for a, b in zip(run["self"], run["inclusive"], strict=False):
        rows.append(f"| {a['share']:.1%} | `{a['function']}` | | {b['share']:.1%} | "
                    f"`{b['function']}` |")
    c = run["callers"]
    rows.append(f"\nCallers' threads only (the manager around the engine; {c['samples']} "
                f"samples, {c['samples'] / max(1, run['samples']):.0%} of all):\n\n"
                "| self | function | | inclusive | function |\n|---:|---|---|---:|---|")
    for a, b in zip(c["self"], c["inclusive"], strict=False):
        rows.append(f"| {a['share']:.1%} | `{a['function']}` | | {b['share']:.1%} | "
                    f"`{b['function']}` |")
    g = run.get("background")
    if g and g["samples"]:
        rows.append(f"\nThe manager's background thread (bookkeeping, verdicts beside generation; "
                    f"{g['samples']} samples, {g['samples'] / max(1, run['samples']):.0%} of all), "
                    "top 5 by self:\n\n| self | function |\n|---:|---|")
        rows += [f"| {a['share']:.1%} | `{a['function']}` |" for a in g["self"][:5]]
    return head + "\n".join(rows) + "\n"


def register(bench: Any) -> None:
    import typer

    @bench.command("profile")
    def profile_cmd(
        engine: str = typer.Option("torch", help="torch or vllm"),
        sessions: int = typer.Option(1, min=1, help="sessions at once (1: sequential)"),
        turns: int = typer.Option(6, min=1, help="profiled turns per session"),
        max_tokens: int = typer.Option(16, min=1, help="reply length"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """py-spy profile of chat turns through the ConversationManager (top functions)."""
        from suffixmem_bench.measure import RunContext

        with RunContext() as ctx:
            run = profile_turns(engine, sessions, turns, max_tokens)
        run.update(ctx.fields())
        print(json.dumps(run) if as_json else to_markdown(run))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
