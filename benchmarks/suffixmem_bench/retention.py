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
is positive when its segment comes back within 30 minutes); the second half is replayed from an
empty cache through the engine's own ``SegmentCache`` (fake clock, counting block pool,
16-token blocks) under each policy of ``suffixmem.retention`` at each budget of the sweep
(3k-40k tokens plus the engine's default segment budget, ``DEFAULT_BUDGET_SHARE`` of the default
1 GiB KV pool, about 11,600 tokens for the default model):

- ``lru``: every segment kept the standard TTL (5 min after last use), LRU eviction;
- ``lru_no_ttl``: LRU with no expiry (the reviewer's baseline in issue 10);
- ``pinned-lru``: shared segments (system prompts) pinned, the rest ``lru``
  (``pinned-lru_no_ttl``: the same with no expiry);
- ``second-hit``: admitted from the second sighting on, then ``lru``;
- ``value``: value tiers from the learned scorer; ``value_heuristic``: from the formula.
(``plain_lru_tokens``: the same plain LRU computed without the cache class, a cross-check.)

A sighting of a live cached segment saves its tokens. The JSON keeps ``value_tokens_saved``
and ``lru_tokens_saved`` at ``budget_tokens`` (default: the engine's default budget), the
whole ``sweep``, which policy wins at the default budget and whether it is the library's
default. ``--trace URL`` replays the segment log of real ``bench chat --keep-db`` runs the
same way (``traces``).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from suffixmem.conversation.value import (
    HeuristicValueScorer,
    ValueFeatures,
    ValueScorer,
    train_value_scorer,
)
from suffixmem.engine.reuse.segment_cache import SegmentCache, SegmentCacheConfig
from suffixmem.retention import LRU, Decision, PinnedLRU, SecondHit, SegmentFeatures, tier_of

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
    """Tokens saved by a plain LRU cache of ``budget`` tokens, no expiry (the reviewer's
    baseline of issue 10), over logged sightings."""
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


class _Refs:
    """A block pool that only counts: the replay needs the cache's bookkeeping, not KV."""

    def incref(self, block_ids: Sequence[int]) -> None:
        pass

    def decref(self, block_ids: Sequence[int]) -> None:
        pass


class _Scored:
    """``ValueTiers`` over precomputed scores (the learned scorer is slow one call at a time):
    the replay sets ``score`` before each offer."""

    def __init__(self) -> None:
        self.score = 0.0

    def decide(self, features: SegmentFeatures) -> Decision:
        return Decision(tier_of(self.score), self.score)


def _ids(h: str, tokens: int) -> tuple[int, ...]:
    """Token ids standing for segment ``h``: distinct per hash (the cache re-checks ids)."""
    head = int.from_bytes(hashlib.blake2b(h.encode(), digest_size=7).digest(), "big")
    return (head, *range(tokens - 1))


def replay_policy(events: Sequence[Any], budget: int, policy: Any,
                  scores: Sequence[float] | None = None,
                  config: SegmentCacheConfig | None = None) -> int:
    """Tokens saved by the engine's own ``SegmentCache`` under ``policy`` with a budget of
    ``budget`` tokens (``BLOCK_SIZE``-token blocks) over logged sightings, on the log's clock.

    A sighting looks its segment up (session namespace, then the shared one); a hit saves its
    tokens, a miss offers the segment (``put``) with its logged features. ``scores`` (one per
    event) drive a ``_Scored`` policy."""
    now = [0.0]
    base = dict(max_blocks=max(1, budget // BLOCK_SIZE))
    cfg = config or SegmentCacheConfig(**base)
    cache = SegmentCache(_Refs(), cfg, clock=lambda: now[0], policy=policy)
    t0 = events[0].seen_at if events else T0
    next_block = saved = 0
    for i, e in enumerate(events):
        now[0] = (e.seen_at - t0).total_seconds()
        session = e.session_id or e.scope
        ids = _ids(e.hash, e.tokens)
        if cache.lookup(session, ids) is not None:
            saved += e.tokens
            continue
        if scores is not None:
            policy.score = scores[i]
        feats = ValueFeatures.from_dict(e.features)
        n = -(-e.tokens // BLOCK_SIZE)
        cache.put(session, ids, range(next_block, next_block + n), 0, feats.position,
                  kind=e.kind, shared=e.scope == "*", features=feats)
        next_block += n
    return saved


BLOCK_SIZE = 16  # the torch engine's default KV block size
SWEEP = (3_000, 5_000, 10_000, 20_000, 40_000)
POLICY_NAMES = ("lru", "pinned-lru", "second-hit", "value", "value_heuristic")
"""The policies under the engine's own cache settings (TTLs); the best of these at the default
budget must be the library's default."""
NO_TTL_NAMES = ("lru_no_ttl", "pinned-lru_no_ttl")
"""The same cache with no expiry (evicted only for space): what the TTLs cost."""


def default_budget_tokens(model: str | None = None, kv_cache_gib: float | None = None) -> int:
    """The engine's default segment budget in tokens: ``DEFAULT_BUDGET_SHARE`` of the torch
    engine's KV pool (``EngineConfig``'s default size) for ``model``, in whole blocks."""
    import torch

    from suffixmem.config import DEFAULT_MODEL, EngineConfig
    from suffixmem.engine.reuse.hook import DEFAULT_BUDGET_SHARE
    from suffixmem.engine.torch.kv_pool import KVPool
    from suffixmem.engine.torch.model_config import read_config
    from suffixmem.models import resolve_model

    c = read_config(resolve_model(model or DEFAULT_MODEL, progress=False))
    gib = kv_cache_gib if kv_cache_gib is not None else EngineConfig().kv_cache_gib
    per_block = KVPool.bytes_per_block(c.num_layers, c.num_kv_heads, c.head_dim, BLOCK_SIZE,
                                       torch.bfloat16)
    blocks = int(gib * (1 << 30)) // per_block
    return max(1, int(blocks * DEFAULT_BUDGET_SHARE)) * BLOCK_SIZE


def library_default_policy() -> str:
    """The name (in ``POLICY_NAMES``) of the policy a segment cache gets by default."""
    from suffixmem.retention import POLICIES

    policy = SegmentCache(_Refs()).policy
    return next(n for n, cls in POLICIES.items() if type(policy) is cls)


def compare(events: Sequence[Any], budgets: Sequence[int]) -> dict[str, Any]:
    """Train on the first half of ``events`` (by time), replay the second half under every
    policy at every budget. Returns the sweep and the trace's size."""
    mid = events[0].seen_at + (events[-1].seen_at - events[0].seen_at) / 2
    train = [e for e in events if e.seen_at < mid]
    test = [e for e in events if e.seen_at >= mid]
    scorer = train_value_scorer(train)
    scores = score_events(test, scorer)
    heur = score_events(test, HeuristicValueScorer())
    no_ttl = dict(session_ttl_s=1e15, extended_ttl_s=1e15)
    sweep = []
    for b in sorted(set(budgets)):
        blocks = max(1, b // BLOCK_SIZE)
        sweep.append({
            "budget_tokens": b,
            "lru": replay_policy(test, b, LRU()),
            "lru_no_ttl": replay_policy(
                test, b, LRU(), config=SegmentCacheConfig(max_blocks=blocks, **no_ttl)),
            "pinned-lru": replay_policy(test, b, PinnedLRU()),
            "pinned-lru_no_ttl": replay_policy(
                test, b, PinnedLRU(), config=SegmentCacheConfig(max_blocks=blocks, **no_ttl)),
            "second-hit": replay_policy(test, b, SecondHit()),
            "value": replay_policy(test, b, _Scored(), scores),
            "value_heuristic": replay_policy(test, b, _Scored(), heur),
            "plain_lru_tokens": replay_lru(test, b),
        })
    return {"scorer": type(scorer).__name__, "replayed_sightings": len(test),
            "replayed_tokens": sum(e.tokens for e in test), "training_sightings": len(train),
            "sweep": sweep}


def trace_events(database_url: str) -> list[Any]:
    """The segment sightings a real run logged (``bench chat --keep-db``) in that database."""
    from suffixmem.conversation.store import Store

    store = Store(database_url)
    try:
        return store.segment_events()
    finally:
        store.close()


def run_retention(budget: int | None = None, seed: int = 0, sessions: int = 400,
                  database_url: str = "sqlite://",
                  traces: Sequence[str] = ()) -> dict[str, Any]:
    """Simulate, log to SQL, train on the first half, replay the second half under every
    policy over the sweep (which includes ``budget``, default: the engine's default segment
    budget); the same for each real trace (database URLs). See the module docstring."""
    from suffixmem.conversation.store import Store

    default = default_budget_tokens()
    budget = budget or default
    store = Store(database_url)
    try:
        log_workload(store, simulate_workload(seed, sessions))
        events = store.segment_events()
    finally:
        store.close()
    budgets = (*SWEEP, default, budget)
    synthetic = compare(events, budgets)
    at = next(r for r in synthetic["sweep"] if r["budget_tokens"] == budget)
    at_default = next(r for r in synthetic["sweep"] if r["budget_tokens"] == default)
    best = max(POLICY_NAMES, key=lambda n: at_default[n])
    lib = library_default_policy()
    out: dict[str, Any] = {
        "value_tokens_saved": at["value"],
        "lru_tokens_saved": at["lru"],
        "pinned_lru_tokens_saved": at["pinned-lru"],
        "heuristic_tokens_saved": at["value_heuristic"],
        "budget_tokens": budget,
        "default_budget_tokens": default,
        "best_policy_at_default": best,
        "library_default_policy": lib,
        "default_is_best": at_default[lib] >= at_default[best],
        "best_without_ttl_at_default": max(NO_TTL_NAMES, key=lambda n: at_default[n]),
        **synthetic,
        "traces": {},
    }
    for url in traces:
        evs = trace_events(url)
        out["traces"][url] = (compare(evs, budgets) if len(evs) >= 2
                              else {"error": f"{len(evs)} segment sightings logged there"})
    return out


def register(bench: Any) -> None:
    import typer

    @bench.command("retention")
    def retention_cmd(
        budget: int = typer.Option(0, help="cache budget in tokens (0: the engine's default "
                                           "segment budget)"),
        seed: int = typer.Option(0, help="workload seed"),
        sessions: int = typer.Option(400, help="simulated sessions"),
        database: str = typer.Option("sqlite://", help="SQLAlchemy URL to log the workload in"),
        trace: list[str] | None = typer.Option(  # noqa: B008 (typer's way to declare a list)
            None, help="a database a `bench chat --keep-db` run logged segments in "
                       "(repeatable)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Tokens saved by each retention policy over a budget sweep, synthetic and real."""
        from suffixmem_bench.measure import RunContext

        with RunContext() as ctx:
            result = run_retention(budget or None, seed, sessions, database, trace or ())
        result.update(ctx.fields())
        if as_json:
            print(json.dumps(result))
            return
        from rich.console import Console

        c = Console()
        c.print(f"replayed {result['replayed_sightings']} sightings "
                f"({result['replayed_tokens']} tokens); engine default budget "
                f"{result['default_budget_tokens']} tokens; learned scorer: {result['scorer']}")
        for row in result["sweep"]:
            c.print(f"  budget {row['budget_tokens']:>6}: " + ", ".join(
                f"{n} {row[n]}" for n in (*POLICY_NAMES, *NO_TTL_NAMES)))
        c.print(f"best at the default budget: {result['best_policy_at_default']}; library "
                f"default: {result['library_default_policy']}"
                + ("" if result["default_is_best"] else " [red](not the best)[/]"))
