"""What binding the semantic temperature late saves a turn (issue 19; engine/late_temperature.py).

One embedded vLLM engine, two ``ConversationManager`` arms on it (SQLite each), both with the
semantic temperature deciding (no ``temperature=`` given; ``seed=0``): ``late`` as shipped (the
request goes out first and the topic verdict runs while the engine prefills) and ``early`` (the
engine's ``late_temperature`` switched off for that arm's turns: the verdict before the
request, as before). The default chat workload (4 sessions x 10 turns round robin, ~300-token
system prompt, 32-token replies), each turn in both arms back to back, the first arm
alternating by turn and round, each manager's queued bookkeeping flushed after its turn; each
round opens new sessions (new cache salts). Prints JSON: per arm ``manager_overhead_ms`` p50
and p99, TTFT (the call to the first token) p50 from turn 8 per round, and the per-turn TTFT
ratio late / early and difference from turn 8;
``same_text``: the share of turns whose replies were equal in both arms (they must be: the same
prompts, temperatures and seeds).
Run alone: `.venv/bin/python scripts/late-temperature-ab.py [rounds]` (about 4 minutes for 3).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from suffixmem.config import DEFAULT_MODEL
from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.conversation.turns import TurnResult
from suffixmem.engine import create_engine
from suffixmem_bench.chat.metrics import percentile
from suffixmem_bench.chat.run import token_counter
from suffixmem_bench.chat.workload import build_workload, schedule
from suffixmem_bench.measure import RunContext

ARMS = ("late", "early")


def main(rounds: int = 3) -> None:
    workload = build_workload(sessions=4, turns=10, max_tokens=32, system_tokens=300,
                              count=token_counter(DEFAULT_MODEL))
    engine = create_engine("vllm", max_model_len=4096, kv_cache_gib=1.0)
    records: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, RunContext(2) as ctx:
        managers = {arm: ConversationManager(engine, f"sqlite:///{Path(tmp) / arm}.db",
                                             ManagerConfig()) for arm in ARMS}
        for r in range(rounds):
            sessions = {arm: [m.open_session(f"{arm}-r{r}-s{s}",
                                             system_prompt=workload.system_prompt_of(s)).id
                              for s in range(workload.num_sessions)]
                        for arm, m in managers.items()}
            for i, (s, t) in enumerate(schedule(workload)):
                for arm in (ARMS if (i + r) % 2 == 0 else ARMS[::-1]):
                    engine.late_temperature = arm == "late"
                    t0 = time.perf_counter()
                    ttft = None
                    for ev in managers[arm].stream_chat(
                            sessions[arm][s], workload.sessions[s][t], seed=0,
                            max_tokens=workload.max_tokens):
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                        out = ev
                    assert isinstance(out, TurnResult)
                    managers[arm].flush()
                    records.append({"arm": arm, "round": r, "session": s, "turn": t + 1,
                                    "overhead_ms": out.manager_overhead_ms,
                                    "ttft_ms": ttft * 1000,
                                    "temperature": out.temperature, "text": out.text})
        for m in managers.values():
            m.close()
    engine.close()
    print(json.dumps(summary(records, rounds) | ctx.fields(), indent=1, default=float))


def summary(records: list[dict], rounds: int) -> dict:
    out: dict = {"rounds": rounds, "arms": {}}
    for arm in ARMS:
        mine = [x for x in records if x["arm"] == arm]
        overhead = [x["overhead_ms"] for x in mine]
        out["arms"][arm] = {
            "manager_overhead_ms_p50": percentile(overhead, 50),
            "manager_overhead_ms_p99": percentile(overhead, 99),
            "ttft_ms_p50_from_turn8": [
                statistics.median(x["ttft_ms"] for x in mine
                                  if x["round"] == r and x["turn"] >= 8)
                for r in range(rounds)],
        }
    key = {(x["arm"], x["round"], x["session"], x["turn"]): x for x in records}
    pairs = [(x, key[("early", r, s, t)]) for (a, r, s, t), x in key.items()
             if a == "late"]
    late = [(a, b) for a, b in pairs if a["turn"] >= 8]
    out["ttft_ratio_p50_from_turn8"] = statistics.median(
        a["ttft_ms"] / b["ttft_ms"] for a, b in late)
    out["ttft_diff_ms_p50_from_turn8"] = statistics.median(
        a["ttft_ms"] - b["ttft_ms"] for a, b in late)
    out["same_text"] = sum(a["text"] == b["text"] for a, b in pairs) / len(pairs)
    out["same_temperature"] = sum(a["temperature"] == b["temperature"]
                                  for a, b in pairs) / len(pairs)
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
