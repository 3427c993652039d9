"""A configuration's child process, seen from ``bench chat``: start it, read its events, turn
them into the configuration's figures.

Two ways to run a round (``worker`` is the child's side of both):

- ``run_one``: one child runs the whole workload on its own, then the next configuration's
  child starts (the children of a round run one after another, alternating between rounds);
- ``run_lockstep``: every configuration's child of the round is alive at once (started one
  after another, so start-ups never overlap) and the parent hands out the workload one step at
  a time, a step being one turn (round robin) or one wave of every session's turn at once
  (concurrent): each step runs in every child in turn before the next step starts, in an order
  shuffled step by step (seeded by round and step: every child goes first, and follows every
  other, about equally often). The machine's speed drifts within seconds
  (docs/profile-decode.md round 9), so whole-workload runs minutes apart compare that drift as
  much as the configurations; steps a few hundred milliseconds apart do not. Only one child
  works at a time, and each settles its queued work inside its step, on its own clock, so no
  child's background work lands in another's step; a pause of ``GAP_S`` before each step
  lets the previous child's OpenMP (or llama.cpp) threads stop spinning and sleep. Throughput
  is over each child's busy time (its steps' durations), TTFT and latency are each turn's own.
  All of a round's children are in memory together: mind the sum of their footprints.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from suffixmem_bench.chat.configs import CONFIGS, KEEP_DB_ENV
from suffixmem_bench.chat.metrics import TurnRecord, by_turn, summarize
from suffixmem_bench.chat.peers import EngineOptions
from suffixmem_bench.chat.workload import Workload, schedule

GAP_S = 0.02  # idle time before each step: longer than a thread pool's spin before it sleeps


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _spawn(name: str, spec: dict[str, Any], options: EngineOptions, log_dir: Path,
           keep_db: Path | None, log: IO[str], stdin: Any = None) -> subprocess.Popen[str]:
    """Start the worker for configuration ``name`` with ``spec``; its stderr goes to ``log``."""
    spec_path = log_dir / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # every engine gets the same number of threads (vLLM reads this, torch and OpenMP too)
    env["OMP_NUM_THREADS"] = str(options.threads)
    if keep_db is not None:
        env[KEEP_DB_ENV] = str(keep_db)
    return subprocess.Popen(
        [sys.executable, "-m", "suffixmem_bench.chat.worker", str(spec_path)],
        stdin=stdin, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
    )


def run_one(
    name: str, workload: Workload, options: EngineOptions, *, timeout_s: float,
    on_event: Any = None, log_dir: Path, rounds: tuple[int, int] | None = None,
    history: dict[str, list[list[str]]] | None = None, tag: str = "",
    keep_db: Path | None = None,
) -> tuple[dict[str, Any], list[TurnRecord]]:
    """Run configuration ``name`` in a child process; its figures and turn records.
    ``rounds``/``history``: run only those turns, resuming sessions (see ``worker``)."""
    spec = {"config": name, "workload": workload.to_dict(), "options": asdict(options),
            "rounds": list(rounds) if rounds else None, "history": history}
    log_path = log_dir / f"{name}{tag}.log"
    with log_path.open("w") as log:
        child = _Child(name, _spawn(f"{name}{tag}", spec, options, log_dir, keep_db, log),
                       log_path, on_event)
        killer = threading.Timer(timeout_s, child.proc.kill)
        killer.start()
        try:
            child.read_until()
            child.proc.wait()
        finally:
            killer.cancel()
    return child.figures(timeout_s), child.records


def figures_of(name: str, records: list[TurnRecord], final: dict[str, Any], startup: float,
               returncode: int | None, timeout_s: float, log_path: Path) -> dict[str, Any]:
    """One configuration's figures from its turn records and its worker's last event."""
    description = CONFIGS[name][1]
    kind = final.get("event")
    if kind == "missing":
        return {"status": "missing", "reason": final["reason"], "description": description}
    if kind != "done":
        reason = final.get("reason") or (
            f"worker exited with code {returncode}"
            + (f" (killed after {timeout_s:.0f} s)" if returncode == -9 else ""))
        return {"status": "error", "reason": reason, "description": description,
                "log_tail": final.get("traceback") or _tail(log_path)}
    figures: dict[str, Any] = {"status": "ok", "description": description}
    figures.update(summarize(records, final["wall_s"]))
    figures.update({"peak_rss_mb": final["peak_rss_mb"], "kv_pool_mb": final["kv_pool_mb"],
                    "kv_held_mb": final["kv_held_mb"], "startup_s": startup,
                    "by_turn": by_turn(records)})
    figures.update({k: v for k, v in final.items() if k.startswith("tier_")})
    return figures


class _Child:
    """A worker's event stream, read up to a given answer (``run_lockstep``) or its end
    (``run_one``): its turn records, start-up time and final event (``done``, ``missing``,
    ``error``, or ``eof`` when it ended without one). ``on_event(event)`` sees every event."""

    def __init__(self, name: str, proc: subprocess.Popen[str], log_path: Path,
                 on_event: Any) -> None:
        self.name, self.proc, self.log_path = name, proc, log_path
        self.on_event = on_event
        self.records: list[TurnRecord] = []
        self.final: dict[str, Any] = {}
        self.startup = float("nan")

    @property
    def alive(self) -> bool:
        return not self.final

    def read_until(self, *kinds: str) -> None:
        """Read events until one of ``kinds`` or a final one."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = event.get("event")
            if self.on_event is not None:
                self.on_event(event)
            if kind == "turn":
                self.records.append(TurnRecord.from_dict(event["record"]))
            elif kind == "started":
                self.startup = event["startup_s"]
            elif kind not in kinds:  # missing, error or done
                self.final = event
                return
            if kind in kinds:
                return
        self.final = self.final or {"event": "eof"}

    def figures(self, timeout_s: float) -> dict[str, Any]:
        """``figures_of`` this child, once it has ended."""
        return figures_of(self.name, self.records, self.final, self.startup,
                          self.proc.returncode, timeout_s, self.log_path)

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.final = {"event": "eof"}


def step_order(items: list[Any], rnd: int, step: int) -> list[Any]:
    """``items`` in the order of step ``step`` of round ``rnd``: a permutation seeded by both,
    so that a rerun steps alike and no item always follows the same other one (as a rotation
    of one fixed order would make it)."""
    return random.Random(rnd * 1_000_003 + step).sample(items, len(items))


def run_lockstep(
    names: tuple[str, ...], workload: Workload, options: EngineOptions, *, rnd: int,
    timeout_s: float, log_dir: Path, on_event: Any = None, keep_db: Path | None = None,
) -> dict[str, tuple[dict[str, Any], list[TurnRecord]]]:
    """Round ``rnd`` of ``names`` in lockstep (module docstring): per configuration, its
    figures and turn records. ``on_event(name, event)`` sees every event; ``timeout_s``
    bounds the whole round."""
    spec = {"workload": workload.to_dict(), "options": asdict(options), "lockstep": True}
    children: list[_Child] = []
    logs = []
    killer = threading.Timer(timeout_s, lambda: [s.proc.kill() for s in children])
    killer.start()
    try:
        for name in names:  # one at a time: start-ups never overlap
            log_path = log_dir / f"{name}.log"
            log = log_path.open("w")
            logs.append(log)
            proc = _spawn(name, {**spec, "config": name}, options, log_dir, keep_db, log,
                          stdin=subprocess.PIPE)
            child = _Child(name, proc, log_path, None if on_event is None else
                           lambda event, name=name: on_event(name, event))
            child.read_until("started")
            children.append(child)
        if workload.mode == "concurrent":
            steps = [{"cmd": "wave", "turn": t} for t in range(workload.num_turns)]
        else:
            steps = [{"cmd": "turn", "session": s, "turn": t} for s, t in schedule(workload)]
        for i, command in enumerate(steps):
            for child in step_order(children, rnd, i):
                if child.alive:
                    time.sleep(GAP_S)
                    child.send(command)
                    child.read_until("ack")
        for child in children:
            if child.alive:
                child.send({"cmd": "done"})
                child.read_until()
            child.proc.wait()
    finally:
        killer.cancel()
        for child in children:
            if child.proc.poll() is None:
                child.proc.kill()
        for log in logs:
            log.close()
    return {s.name: (s.figures(timeout_s), s.records) for s in children}
