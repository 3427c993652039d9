"""``suffixmem bench retention``: value-tiered segment retention against plain LRU.

The workload is a simulated multi-session RAG service over 8 hours, logged into the SQL store
exactly as the manager logs real turns (``segment_events``: every segment sighting with its
features at that moment), then read back from SQL:

- sessions arrive at random; each uses one of a few shared system prompts (``system_tail``,
  scope ``*``) and takes 3-12 turns with 20 s - 4 min between them; some pause for 40-90
  minutes in the middle;
- each turn retrieves 1-3 documents (300-1200 tokens, session scope). A document is a
  follow-up of one already retrieved in the session with probability 0.35, else new; new
  documents are usually one-shot.

The first half of the log (by time) trains the value model (``train_value_scorer``: a sighting
is positive when its segment comes back within 30 minutes); the second half is replayed under a
fixed token budget by both policies from an empty cache:

- **LRU**: every sighted segment is cached; the least recently used go first when full;
- **value-tiered**: a sighting's score picks its tier (>= 0.85 pinned, 0.6-0.85 kept 30 min
  after last use, < 0.6 not cached); when full, expired entries go first, then the lowest
  score (least recently used among equals), pinned ones last.

A sighting of a cached segment saves its tokens. Reported: tokens saved by each, and by the
heuristic fallback scorer.
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from suffixmem.conversation.value import (
    TTL_S,
    HeuristicValueScorer,
    Tier,
    ValueFeatures,
    ValueScorer,
    train_value_scorer,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(slots=True, frozen=True)
class Access:
    t: float  # seconds since the workload's start
    session: str
    hash: str
    scope: str
    kind: str
    tokens: int
    position: int
    prompt_tokens: int


def simulate_workload(seed: int = 0, sessions: int = 400, hours: float = 8.0) -> list[Access]:
    """The segment sightings of the simulated service (see the module docstring), by time."""
    rng = random.Random(seed)
    systems = [(f"sys{i}", rng.randint(200, 600)) for i in range(3)]
    out: list[Access] = []
    doc_counter = 0
    for s in range(sessions):
        sid = f"s{s}"
        t = rng.uniform(0, hours * 3600 * 0.9)
        sys_hash, sys_tokens = systems[min(int(rng.expovariate(1.2)), len(systems) - 1)]
        docs: list[tuple[str, int]] = []
        turns = rng.randint(3, 12)
        pause_at = rng.randint(1, turns - 1) if rng.random() < 0.25 else -1
        for turn in range(turns):
            pos = sys_tokens + 40 * turn
            out.append(Access(t, sid, sys_hash, "*", "system_tail", sys_tokens, 0, 0))
            for _ in range(rng.randint(1, 3)):
                if docs and rng.random() < 0.35:
                    h, n = rng.choice(docs)
                else:
                    doc_counter += 1
                    h, n = f"d{doc_counter}", rng.randint(300, 1200)
                    docs.append((h, n))
                out.append(Access(t, sid, h, sid, "document", n, pos, 0))
                pos += n
            t += rng.uniform(20, 240) if turn != pause_at else rng.uniform(2400, 5400)
    out.sort(key=lambda a: (a.t, a.session))
    return [Access(a.t, a.session, a.hash, a.scope, a.kind, a.tokens, a.position,
                   a.position + a.tokens + 50) for a in out]


class _Tracker:
    """Running per-segment statistics, giving each sighting its features."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, str], float] = {}
        self.last: dict[tuple[str, str], float] = {}
        self.seen: dict[tuple[str, str], int] = {}
        self.sessions: dict[tuple[str, str], set[str]] = {}

    def features(self, a: Access) -> ValueFeatures:
        key = (a.hash, a.scope)
        sessions = self.sessions.setdefault(key, set())
        f = ValueFeatures(
            num_tokens=a.tokens, kind=a.kind, shared=a.scope == "*",
            seen=self.seen.get(key, 0), position=a.position, prompt_tokens=a.prompt_tokens,
            age_s=a.t - self.first.get(key, a.t), since_last_s=a.t - self.last.get(key, a.t),
            sessions_seen=len(sessions | {a.session}), token_entropy=0.0,
        )
        self.first.setdefault(key, a.t)
        self.last[key] = a.t
        self.seen[key] = self.seen.get(key, 0) + 1
        sessions.add(a.session)
        return f


def log_workload(store: Any, accesses: Sequence[Access]) -> None:
    """Record every sighting in the store (``segment_events``) with its features."""
    from suffixmem.conversation.store import SegmentSighting

    tracker = _Tracker()
    i = 0
    while i < len(accesses):  # one transaction per turn (same session, same time)
        j = i
        while j < len(accesses) and (accesses[j].t, accesses[j].session) == (
                accesses[i].t, accesses[i].session):
            j += 1
        batch = [SegmentSighting(a.hash, a.scope, a.kind, a.tokens,
                                 tracker.features(a).to_dict()) for a in accesses[i:j]]
        store.record_segments(accesses[i].session, batch,
                              seen_at=T0 + timedelta(seconds=accesses[i].t))
        i = j


def replay_lru(events: Sequence[Any], budget: int) -> int:
    """Tokens saved by an LRU cache of ``budget`` tokens over logged sightings."""
    cache: OrderedDict[tuple[str, str], int] = OrderedDict()
    used = saved = 0
    for e in events:
        key = (e.hash, e.scope)
        if key in cache:
            saved += e.tokens
            cache.move_to_end(key)
            continue
        if e.tokens > budget:
            continue
        while used + e.tokens > budget:
            _, n = cache.popitem(last=False)
            used -= n
        cache[key] = e.tokens
        used += e.tokens
    return saved


def score_events(events: Sequence[Any], scorer: ValueScorer) -> list[float]:
    """Each sighting's score from its logged features (batched when the scorer can)."""
    feats = [ValueFeatures.from_dict(e.features) for e in events]
    many = getattr(scorer, "score_many", None)
    return list(many(feats)) if many is not None else [scorer.score(f) for f in feats]


def replay_value(events: Sequence[Any], budget: int, scorer: ValueScorer,
                 scores: Sequence[float] | None = None) -> int:
    """Tokens saved by value-tiered retention of ``budget`` tokens over logged sightings
    (``scores``: precomputed ``score_events``)."""
    if scores is None:
        scores = score_events(events, scorer)
    # key -> (tokens, score, tier, expires_at (s), last use (s))
    cache: dict[tuple[str, str], list[Any]] = {}
    used = saved = 0
    for e, score in zip(events, scores, strict=True):
        now = (e.seen_at - T0).total_seconds()
        key = (e.hash, e.scope)
        entry = cache.get(key)
        if entry is not None and entry[3] < now:  # expired: gone before this sighting
            used -= entry[0]
            del cache[key]
            entry = None
        if entry is not None:
            saved += e.tokens
        tier = scorer.tier(score)
        if tier is Tier.NONE:
            if entry is not None:
                used -= entry[0]
                del cache[key]
            continue
        expires = float("inf") if tier is Tier.PINNED else now + TTL_S
        if entry is not None:
            entry[1:] = [score, tier, expires, now]
            continue
        if e.tokens > budget:
            continue
        while used + e.tokens > budget:
            victim = min(cache, key=lambda k: (
                cache[k][3] >= now, cache[k][2] is Tier.PINNED, cache[k][1], cache[k][4]))
            used -= cache.pop(victim)[0]
        cache[key] = [e.tokens, score, tier, expires, now]
        used += e.tokens
    return saved


SWEEP = (3_000, 5_000, 10_000, 20_000, 40_000)


def run_retention(budget: int = 5_000, seed: int = 0, sessions: int = 400,
                  database_url: str = "sqlite://") -> dict[str, Any]:
    """Simulate, log to SQL, train on the first half, replay the second half."""
    from suffixmem.conversation.store import Store

    store = Store(database_url)
    try:
        log_workload(store, simulate_workload(seed, sessions))
        events = store.segment_events()
    finally:
        store.close()
    mid = events[0].seen_at + (events[-1].seen_at - events[0].seen_at) / 2
    train = [e for e in events if e.seen_at < mid]
    test = [e for e in events if e.seen_at >= mid]
    scorer = train_value_scorer(train)
    scores = score_events(test, scorer)
    total = sum(e.tokens for e in test)
    return {
        "value_tokens_saved": replay_value(test, budget, scorer, scores),
        "lru_tokens_saved": replay_lru(test, budget),
        "heuristic_tokens_saved": replay_value(test, budget, HeuristicValueScorer()),
        "scorer": type(scorer).__name__,
        "budget_tokens": budget,
        "replayed_sightings": len(test),
        "replayed_tokens": total,
        "training_sightings": len(train),
        "sweep": [
            {"budget_tokens": b, "value_tokens_saved": replay_value(test, b, scorer, scores),
             "lru_tokens_saved": replay_lru(test, b)}
            for b in SWEEP
        ],
    }


def register(bench: Any) -> None:
    import typer

    @bench.command("retention")
    def retention_cmd(
        budget: int = typer.Option(5_000, help="cache budget in tokens"),
        seed: int = typer.Option(0, help="workload seed"),
        sessions: int = typer.Option(400, help="simulated sessions"),
        database: str = typer.Option("sqlite://", help="SQLAlchemy URL to log the workload in"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Tokens saved by value-tiered retention vs LRU on a logged workload."""
        result = run_retention(budget, seed, sessions, database)
        if as_json:
            print(json.dumps(result))
            return
        from rich.console import Console

        c = Console()
        c.print(f"replayed {result['replayed_sightings']} sightings "
                f"({result['replayed_tokens']} tokens) under a {budget}-token budget")
        c.print(f"value-tiered ({result['scorer']}): {result['value_tokens_saved']} tokens saved")
        c.print(f"heuristic fallback: {result['heuristic_tokens_saved']} tokens saved")
        c.print(f"LRU: {result['lru_tokens_saved']} tokens saved")
        for row in result["sweep"]:
            c.print(f"  budget {row['budget_tokens']:>6}: value {row['value_tokens_saved']}, "
                    f"LRU {row['lru_tokens_saved']}")
