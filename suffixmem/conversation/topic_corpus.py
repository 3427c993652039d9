"""Labelled topic sessions from chatterbot-corpus, for fitting and scoring topic detectors.

chatterbot-corpus ships ``data/<language>/<topic>.yml`` files of short conversations. A session
is built by concatenating several question/answer pairs of one topic, then of another; the
first turn of each new topic is a true jump.
"""

from __future__ import annotations

import random
from pathlib import Path

Pair = tuple[str, str]
LabelledTurn = tuple[str, str, bool]

MIN_PAIRS_PER_SPLIT = 6


def corpus_dir(language: str = "english") -> Path:
    """The folder of chatterbot-corpus YAML files for ``language``."""
    import chatterbot_corpus

    return Path(chatterbot_corpus.__file__).parent / "data" / language


def available_languages() -> list[str]:
    """Languages chatterbot-corpus ships (folder names)."""
    root = corpus_dir("english").parent
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def load_topics(language: str = "english") -> dict[str, list[list[Pair]]]:
    """topic -> conversations -> question/answer pairs (utterances 0-1, 2-3, ...)."""
    import yaml

    out: dict[str, list[list[Pair]]] = {}
    for path in sorted(corpus_dir(language).glob("*.yml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        convs: list[list[Pair]] = []
        for conv in data.get("conversations") or []:
            texts = [str(u).strip() for u in conv if u is not None]
            pairs = [(texts[i], texts[i + 1]) for i in range(0, len(texts) - 1, 2)
                     if texts[i] and texts[i + 1]]
            if pairs:
                convs.append(pairs)
        if convs:
            out[path.stem] = convs
    return out


def split_topics(
    topics: dict[str, list[list[Pair]]], seed: int = 0,
) -> tuple[dict[str, list[Pair]], dict[str, list[Pair]]]:
    """Split each topic's conversations in half: (tuning pairs, scored pairs) per topic. Topics
    with fewer than ``MIN_PAIRS_PER_SPLIT`` pairs on either side are dropped."""
    rng = random.Random(seed)
    tune: dict[str, list[Pair]] = {}
    test: dict[str, list[Pair]] = {}
    for name, convs in sorted(topics.items()):
        order = list(range(len(convs)))
        rng.shuffle(order)
        half = len(order) // 2
        a = [p for i in order[:half] for p in convs[i]]
        b = [p for i in order[half:] for p in convs[i]]
        if len(a) >= MIN_PAIRS_PER_SPLIT and len(b) >= MIN_PAIRS_PER_SPLIT:
            tune[name], test[name] = a, b
    return tune, test


def build_sessions(
    pools: dict[str, list[Pair]], n_sessions: int, seed: int,
    blocks: tuple[int, int] = (3, 4), pairs_per_block: tuple[int, int] = (2, 5),
) -> list[list[LabelledTurn]]:
    """Sessions of ``blocks`` topic blocks of ``pairs_per_block`` pairs each; a turn is labelled
    True when it opens a new topic (never the session's first turn)."""
    rng = random.Random(seed)
    names = sorted(pools)
    sessions = []
    for _ in range(n_sessions):
        session: list[LabelledTurn] = []
        prev = None
        for b in range(rng.randint(*blocks)):
            topic = rng.choice([n for n in names if n != prev])
            prev = topic
            k = min(rng.randint(*pairs_per_block), len(pools[topic]))
            for j, (q, a) in enumerate(rng.sample(pools[topic], k)):
                session.append((q, a, b > 0 and j == 0))
        sessions.append(session)
    return sessions


