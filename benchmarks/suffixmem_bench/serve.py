"""``suffixmem bench serve``: ``suffixmem serve`` against stock ``vllm serve`` over HTTP.

The same workload against each server, one server at a time on loopback (so they never share
the CPU): ``sessions`` concurrent sessions x ``turns`` turns, streamed, greedy, ``max_tokens``
each, alternated over ``repeats`` rounds (a fresh server each round; medians with min/max).
suffixmem gets only the new message per turn under ``X-Session-ID`` (it keeps the history);
vLLM gets the whole conversation each turn with ``cache_salt`` = the session (prefix caching
on), which is how an OpenAI client talks to it. Reported per server: TTFT p50/p99 (all
turns and from turn 2), output throughput (completion tokens / wall time), errors, and for
suffixmem the turns found stored in SQL afterwards.

Bounded: each server must be healthy within ``start_timeout_s``, each request finishes within
``request_timeout_s``, and both servers are stopped (their process groups) on any exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from suffixmem.config import DEFAULT_MODEL
from suffixmem_bench.measure import RunContext, check_repeats, spread

QUESTIONS = [
    "Tell me about the history of sailing ships in two sentences.",
    "What made them faster over the centuries?",
    "Which ports were the busiest?",
    "How did steam change that?",
    "What is left of those ships today?",
    "Summarise our conversation in one sentence.",
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _server(cmd: list[str], url: str, log: Path, start_timeout_s: float,
            env: dict[str, str] | None = None) -> Iterator[None]:
    """Run ``cmd`` in its own process group until ``url``/health answers; stop it on exit."""
    import httpx

    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[2]} exited with {proc.returncode}; see {log}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[2]} not healthy after {start_timeout_s:.0f} s; see {log}")
            time.sleep(1)
        yield
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


async def _workload(url: str, model: str, sessions: int, turns: int, max_tokens: int,
                    full_history: bool, request_timeout_s: float) -> dict[str, Any]:
    import httpx

    records: list[dict[str, Any]] = []
    errors: list[str] = []
    run_id = f"bench-{int(time.time())}"

    async def session(client: httpx.AsyncClient, s: int) -> None:
        sid = f"{run_id}-{s}"
        history: list[dict[str, str]] = []
        for t in range(turns):
            question = f"(session {s}) {QUESTIONS[t % len(QUESTIONS)]}"
            history.append({"role": "user", "content": question})
            body: dict[str, Any] = {
                "model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True},
                "messages": history if full_history else [history[-1]],
            }
            if full_history:
                body["cache_salt"] = sid
            started = time.perf_counter()
            ttft, text, usage = None, [], None
            try:
                async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                         headers={"X-Session-ID": sid}) as r:
                    if r.status_code != 200:
                        raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        ev = json.loads(line[6:])
                        if "error" in ev:
                            raise RuntimeError(ev["error"]["message"])
                        for c in ev.get("choices") or []:
                            piece = (c.get("delta") or {}).get("content")
                            if piece:
                                ttft = ttft if ttft is not None else time.perf_counter() - started
                                text.append(piece)
                        usage = ev.get("usage") or usage
            except Exception as e:  # counted, and the session stops (its history is broken)
                errors.append(f"session {s} turn {t + 1}: {' '.join(str(e).split())[:200]}")
                return
            history.append({"role": "assistant", "content": "".join(text)})
            details = (usage or {}).get("prompt_tokens_details") or {}
            records.append({
                "session": s, "turn": t + 1, "ttft_s": ttft or time.perf_counter() - started,
                "latency_s": time.perf_counter() - started,
                "prompt_tokens": (usage or {}).get("prompt_tokens", 0),
                "cached_tokens": details.get("cached_tokens", 0),
                "completion_tokens": (usage or {}).get("completion_tokens", 0),
            })

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=request_timeout_s) as client:
        await asyncio.gather(*(session(client, s) for s in range(sessions)))
    wall = time.perf_counter() - started
    return {"records": records, "errors": errors, "wall_s": wall, "run_id": run_id}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _summary(w: dict[str, Any]) -> dict[str, Any]:
    recs = w["records"]
    ttft = [r["ttft_s"] for r in recs]
    later = [r["ttft_s"] for r in recs if r["turn"] >= 2]
    out_tokens = sum(r["completion_tokens"] for r in recs)
    prompt = sum(r["prompt_tokens"] for r in recs)
    return {
        "turns_ok": len(recs), "errors": len(w["errors"]), "error_samples": w["errors"][:5],
        "wall_s": round(w["wall_s"], 3),
        "throughput_tok_s": round(out_tokens / w["wall_s"], 2) if w["wall_s"] else 0.0,
        "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
        "ttft_p50_turn2plus_s": _pct(later, 50), "ttft_p99_turn2plus_s": _pct(later, 99),
        "prompt_tokens": prompt, "cached_tokens": sum(r["cached_tokens"] for r in recs),
        "completion_tokens": out_tokens,
    }


def _ours(tmp: Path, model: str, sessions: int, turns: int, max_tokens: int,
          start_timeout_s: float, request_timeout_s: float, max_model_len: int,
          rnd: int) -> dict[str, Any]:
    """One round against a fresh ``suffixmem serve`` (its own database): summary + turns stored."""
    import httpx

    port = _port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "suffixmem.cli", "serve", "--port", str(port),
           "--database", f"sqlite:///{tmp / f'serve-{rnd}.db'}", "--model", model,
           "--max-model-len", str(max_model_len), "--served-model-name", "bench",
           "--max-pending", str(max(64, sessions * 2))]
    with _server(cmd, url, tmp / f"suffixmem-{rnd}.log", start_timeout_s):
        w = asyncio.run(_workload(url, "bench", sessions, turns, max_tokens, False,
                                  request_timeout_s))
        stored = 0
        for s in range(sessions):
            r = httpx.get(f"{url}/v1/sessions/{w['run_id']}-{s}", timeout=30)
            if r.status_code == 200:
                stored += r.json()["usage"]["turns"]
    return {**_summary(w), "turns_stored": stored}


def _peer(tmp: Path, model_dir: str, sessions: int, turns: int, max_tokens: int,
          start_timeout_s: float, request_timeout_s: float, max_model_len: int,
          rnd: int) -> dict[str, Any]:
    """One round against a fresh stock ``vllm serve`` (prefix caching on, same block size)."""
    port = _port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
           "--max-model-len", str(max_model_len), "--block-size", "32",
           "--served-model-name", "bench", "--enable-prompt-tokens-details",
           "--enable-prefix-caching"]
    with _server(cmd, url, tmp / f"vllm-{rnd}.log", start_timeout_s,
                 env={"VLLM_CPU_KVCACHE_SPACE": "1"}):
        w = asyncio.run(_workload(url, "bench", sessions, turns, max_tokens, True,
                                  request_timeout_s))
    return _summary(w)


_HEADLINE = ("throughput_tok_s", "ttft_p50_s", "ttft_p99_s", "ttft_p50_turn2plus_s",
             "ttft_p99_turn2plus_s")


def _merge(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one server: headline figures as median (+ min/max/runs), counts summed."""
    out: dict[str, Any] = {k: spread([r[k] for r in rounds if r[k] is not None])["median"]
                           for k in _HEADLINE}
    out["spread"] = {k: spread([r[k] for r in rounds if r[k] is not None]) for k in _HEADLINE}
    for k in ("turns_ok", "errors", "prompt_tokens", "cached_tokens", "completion_tokens",
              "turns_stored"):
        if k in rounds[0]:
            out[k] = sum(r[k] for r in rounds)
    out["error_samples"] = [e for r in rounds for e in r["error_samples"]][:5]
    return out


def run_serve_bench(sessions: int = 16, turns: int = 5, max_tokens: int = 32,
                    model: str = DEFAULT_MODEL, peer: bool = True, repeats: int = 3,
                    start_timeout_s: float = 600, request_timeout_s: float = 300,
                    max_model_len: int = 4096) -> dict[str, Any]:
    """Run the workload against ``suffixmem serve`` and (with ``peer``) ``vllm serve``,
    alternating the servers for ``repeats`` rounds (each round a fresh server and database);
    headline figures are medians over rounds, with the run context (load, probe, noisy)."""
    from suffixmem.models import resolve_model

    check_repeats(repeats)
    model_dir = str(resolve_model(model, progress=False))
    tmp = Path(tempfile.mkdtemp(prefix="suffixmem-bench-serve-"))
    result: dict[str, Any] = {"workload": {
        "sessions": sessions, "turns": turns, "max_tokens": max_tokens, "model": model,
        "temperature": 0, "streaming": True}, "repeats": repeats}
    args = (sessions, turns, max_tokens, start_timeout_s, request_timeout_s, max_model_len)
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    with RunContext() as ctx:
        for rnd in range(repeats):
            ours.append(_ours(tmp, model, *args, rnd))
            if peer:
                theirs.append(_peer(tmp, model_dir, *args, rnd))
    result.update(ctx.fields())
    result["suffixmem"] = _merge(ours)
    if peer:
        result["vllm_serve"] = _merge(theirs)
        a, b = result["suffixmem"], result["vllm_serve"]
        ratio = a["throughput_tok_s"] / b["throughput_tok_s"] if b["throughput_tok_s"] else None
        result["throughput_ratio"] = ratio
        result["targets"] = {
            "zero_errors": a["errors"] == 0,
            "every_turn_stored": a["turns_stored"] == sessions * turns * repeats,
            "throughput_ge_0.9x": ratio is not None and ratio >= 0.9,
            "ttft_p50_turn2plus_le_vllm": a["ttft_p50_turn2plus_s"] <= b["ttft_p50_turn2plus_s"],
        }
    result["logs"] = str(tmp)
    return result


def register(bench: typer.Typer) -> None:
    @bench.command("serve")
    def serve(
        sessions: int = typer.Option(16, min=1, help="Concurrent sessions."),
        turns: int = typer.Option(5, min=1, help="Turns per session."),
        max_tokens: int = typer.Option(32, min=1, help="Reply length per turn."),
        model: str = typer.Option(DEFAULT_MODEL, help="Model name, .gguf file or folder."),
        peer: bool = typer.Option(True, help="Also run stock `vllm serve` on the workload."),
        repeats: int = typer.Option(3, min=3, help="Alternating rounds per server (>= 3)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """suffixmem serve against vllm serve over HTTP on loopback: TTFT, throughput,
        errors, turns stored."""
        result = run_serve_bench(sessions, turns, max_tokens, model, peer, repeats)
        if as_json:
            print(json.dumps(result))
            return
        from rich.console import Console

        console = Console()
        for name in ("suffixmem", "vllm_serve"):
            if name in result:
                s = result[name]
                console.print(
                    f"[bold]{name}[/]: {s['throughput_tok_s']} tok/s, TTFT p50 "
                    f"{(s['ttft_p50_s'] or 0) * 1000:.0f} ms (turn 2+: "
                    f"{(s['ttft_p50_turn2plus_s'] or 0) * 1000:.0f} ms), errors {s['errors']}"
                    + (f", stored {s['turns_stored']}" if "turns_stored" in s else ""))
        if "targets" in result:
            console.print(f"targets: {result['targets']}")
