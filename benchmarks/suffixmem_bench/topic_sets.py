"""The topic benchmark's data sets (described in ``suffixmem_bench.topics``): chatterbot-corpus
sessions built from whole held-out topic files, and the hand-written conversation sets under
``data/`` (``natural``, ``natural-fresh``, ``natural-blind``, ``natural-blind2``, and
``natural_tune`` for tuning)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from suffixmem.conversation.topic_corpus import load_topics

Pair = tuple[str, str]
LabelledTurn = tuple[str, str, bool]
Session = list[LabelledTurn]
DATA = Path(__file__).parent / "data"
NATURAL = DATA / "natural_topics.jsonl"
NATURAL_TUNE = DATA / "natural_tune.jsonl"
NATURAL_FRESH = DATA / "natural_fresh.jsonl"
NATURAL_BLIND = DATA / "natural_blind.jsonl"
NATURAL_BLIND2 = DATA / "natural_blind2.jsonl"


def split_topic_names(names: Sequence[str], seed: int) -> tuple[list[str], list[str]]:
    """Whole topics: about half for tuning, the rest held out for scoring."""
    order = sorted(names)
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    return sorted(order[:half]), sorted(order[half:])


def pools(language: str, topics: Sequence[str], exclude: set[str] = frozenset(),  # type: ignore[assignment]
          ) -> dict[str, list[list[Pair]]]:
    """topic -> conversations (pairs in file order) of ``language`` for ``topics``, without
    pairs that contain an utterance of ``exclude`` and with each utterance kept once
    (de-duplicated across topics too); topics with fewer than 4 pairs left are dropped."""
    data = load_topics(language)
    seen = set(exclude)
    out: dict[str, list[list[Pair]]] = {}
    for name in topics:
        convs = []
        for conv in data.get(name, []):
            kept = []
            for q, a in conv:
                if q in seen or a in seen:
                    continue
                seen.update((q, a))
                kept.append((q, a))
            if kept:
                convs.append(kept)
        if sum(map(len, convs)) >= 4:
            out[name] = convs
    return out


def utterances(pool: dict[str, list[list[Pair]]]) -> set[str]:
    return {t for convs in pool.values() for conv in convs for pair in conv for t in pair}


def _block(convs: list[list[Pair]], k: int, rng: random.Random, contiguous: bool) -> list[Pair]:
    if not contiguous:
        flat = [p for conv in convs for p in conv]
        return rng.sample(flat, min(k, len(flat)))
    start = rng.randrange(len(convs))  # a conversation's start, then on through the file
    flat = [p for conv in convs[start:] + convs[:start] for p in conv]
    return flat[:k]


def build_sessions(pool: dict[str, list[list[Pair]]], n: int, seed: int,
                   contiguous: bool = True) -> list[Session]:
    """``n`` sessions of 2-4 topic blocks of 2-5 pairs (a block's first turn is a jump); see
    the module docstring for ``contiguous``."""
    rng = random.Random(seed)
    names = sorted(pool)
    if len(names) < 2:
        return []
    sessions = []
    for _ in range(n):
        session: Session = []
        prev = None
        for b in range(rng.randint(2, 4)):
            topic = rng.choice([t for t in names if t != prev])
            prev = topic
            block = _block(pool[topic], rng.randint(2, 5), rng, contiguous)
            for j, (q, a) in enumerate(block):
                session.append((q, a, b > 0 and j == 0))
        sessions.append(session)
    return sessions


def load_natural(path: Path = NATURAL) -> list[Session]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [[(t["user"], t["assistant"], bool(t["jump"])) for t in r["turns"]] for r in rows]
