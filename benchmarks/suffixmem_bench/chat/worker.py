"""One configuration over the workload, in a process of its own.

``python -m suffixmem_bench.chat.worker SPEC.json`` builds the configuration named in the spec,
runs the workload and writes JSON lines to its standard output, one per event:
``{"event": "started", "startup_s"}``, ``{"event": "turn", "record": {...}}`` per turn, then
one of ``{"event": "done", "wall_s", "peak_rss_mb", "kv_pool_mb", "kv_held_mb", ...}``,
``{"event": "missing", "reason"}`` (the configuration cannot be built here: a module or package
is absent) or ``{"event": "error", "reason", "traceback"}``.

With ``"lockstep": true`` in the spec (``bench chat --lockstep``) the worker opens the sessions
and then waits for commands on its standard input, one JSON line each: ``{"cmd": "turn",
"session", "turn"}`` runs one turn, ``{"cmd": "wave", "turn"}`` every session's turn at once
(one thread per session), ``{"cmd": "done"}`` ends the run. After each command the
configuration settles (``ChatConfig.settle``: the manager's queued bookkeeping is flushed, so
none of it runs while another configuration's process has the machine) and the worker answers
its turn events and ``{"event": "ack", "busy_s"}``: the command's time, settling included. Its
``done`` event's ``wall_s`` is the sum of those busy times.

Anything else written to file descriptor 1 (C libraries, vLLM) is sent to standard error, so the
protocol stream stays clean. A process per configuration makes its peak resident memory its own,
and one engine's teardown cannot disturb the next.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import IO, Any

from suffixmem_bench.chat.metrics import CeilingTracker, TurnRecord
from suffixmem_bench.chat.peers import ChatConfig, EngineOptions
from suffixmem_bench.chat.workload import Workload, schedule
from suffixmem_bench.measure import peak_rss_mb


def run_config(
    config: ChatConfig, workload: Workload, emit: Any = None,
    rounds: tuple[int, int] | None = None, history: dict[str, list[list[str]]] | None = None,
) -> tuple[list[TurnRecord], float]:
    """Run ``workload`` on ``config``; returns the turn records and the wall time in seconds.
    ``emit(record)`` is called after every turn (from the session's thread in concurrent mode).
    ``rounds = (start, end)`` runs only those 0-based turns; when ``start > 0`` (a restarted
    process) each session is resumed with ``history[str(session)]``, its ``[user, reply]``
    pairs so far.
    """
    start, end = rounds or (0, workload.num_turns)
    tracker = CeilingTracker()
    records: list[TurnRecord] = []
    lock = threading.Lock()

    def one(session: int, turn: int) -> None:
        record = run_turn(config, workload, tracker, session, turn)
        with lock:
            records.append(record)
        if emit is not None:
            emit(record)

    for s in range(workload.num_sessions):
        if start > 0:
            config.resume(s, workload.system_prompt_of(s),
                          [(u, r) for u, r in (history or {}).get(str(s), [])])
        else:
            config.open(s, workload.system_prompt_of(s))
    t0 = time.perf_counter()
    if workload.mode == "concurrent":
        errors: list[BaseException] = []
        barrier = threading.Barrier(workload.num_sessions)

        def session_loop(s: int) -> None:
            try:
                barrier.wait()
                for t in range(start, end):
                    one(s, t)
            except BaseException as e:  # re-raised in the main thread below
                errors.append(e)

        threads = [threading.Thread(target=session_loop, args=(s,), name=f"session-{s}")
                   for s in range(workload.num_sessions)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
    else:
        for s, t in schedule(workload):
            if start <= t < end:
                one(s, t)
    return records, time.perf_counter() - t0


def run_turn(config: ChatConfig, workload: Workload, tracker: CeilingTracker, session: int,
             turn: int) -> TurnRecord:
    """Turn ``turn`` (0-based) of ``session`` on ``config``, as a record."""
    text = workload.sessions[session][turn]
    system = workload.system_prompt_at(session, turn)
    if system is not None:  # the rag workload: new passages in the system prompt
        config.set_system(session, system)
    out = config.turn(session, text)
    seen, seen_any = tracker.observe_both(session, out.prompt_ids, out.reply_ids)
    return TurnRecord(
        session=session, turn=turn + 1, prompt_tokens=len(out.prompt_ids),
        cached_tokens=out.cached_tokens, output_tokens=len(out.reply_ids),
        seen_tokens=seen, ttft_s=out.ttft_s, latency_s=out.latency_s,
        engine_ttft_s=out.engine_ttft_s, text=out.text, seen_any_tokens=seen_any,
        manager_overhead_ms=out.manager_overhead_ms, dropped_turns=out.dropped_turns,
    )


def serve_steps(config: ChatConfig, workload: Workload, commands: IO[str],
                send: Any) -> float:
    """Open the sessions, then run ``commands`` (module docstring) until ``done``; returns the
    summed busy time in seconds."""
    from concurrent.futures import ThreadPoolExecutor

    tracker = CeilingTracker()
    sessions = range(workload.num_sessions)
    for s in sessions:
        config.open(s, workload.system_prompt_of(s))
    busy = 0.0
    with ThreadPoolExecutor(max_workers=workload.num_sessions) as pool:
        for line in commands:
            cmd = json.loads(line)
            if cmd["cmd"] == "done":
                break
            t0 = time.perf_counter()
            if cmd["cmd"] == "turn":
                records = [run_turn(config, workload, tracker, cmd["session"], cmd["turn"])]
            else:
                futures = [pool.submit(run_turn, config, workload, tracker, s, cmd["turn"])
                           for s in sessions]
                records = [f.result() for f in futures]
            config.settle()
            spent = time.perf_counter() - t0
            busy += spent
            for r in records:
                send({"event": "turn", "record": r.to_dict()})
            send({"event": "ack", "busy_s": spent})
    return busy


def main(spec_path: str, out: IO[str]) -> int:
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    workload = Workload.from_dict(spec["workload"])
    options = EngineOptions(**spec["options"])

    def send(event: dict[str, Any]) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    from suffixmem_bench.chat.configs import build_config

    t0 = time.perf_counter()
    try:
        config = build_config(spec["config"], options)
    except ImportError as e:
        send({"event": "missing", "reason": f"{type(e).__name__}: {e}"})
        return 0
    except Exception as e:
        send({"event": "error", "reason": f"start-up failed: {type(e).__name__}: {e}",
              "traceback": traceback.format_exc()})
        return 1
    send({"event": "started", "startup_s": time.perf_counter() - t0})
    try:
        rounds = spec.get("rounds")
        if spec.get("lockstep"):
            wall = serve_steps(config, workload, sys.stdin, send)
        else:
            _, wall = run_config(
                config, workload, lambda r: send({"event": "turn", "record": r.to_dict()}),
                rounds=tuple(rounds) if rounds else None, history=spec.get("history"))
        kv = {**config.kv_memory(), **config.tier_stats()}
    except Exception as e:
        send({"event": "error", "reason": f"{type(e).__name__}: {e}",
              "traceback": traceback.format_exc()})
        return 1
    finally:
        try:
            config.close()
        except Exception:  # teardown problems must not hide the figures
            traceback.print_exc()
    send({"event": "done", "wall_s": wall, "peak_rss_mb": peak_rss_mb(), **kv})
    return 0


if __name__ == "__main__":
    # Keep the protocol on the original stdout; everything else printed to fd 1 goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    code = main(sys.argv[1], protocol)
    protocol.flush()
    # vLLM and llama.cpp leave threads behind; leave without waiting for them.
    os._exit(code)
