"""Independent readers' labels: how clear each scored set's jumps are to a careful reader.

On 2026-12-06 helpers that saw neither the writers' labels, nor this code, nor any detector
read sessions of four conversation sets and a chatterbot sample message by message and marked
the turns that open a new subject, each under the same written guide
(``data/readers/GUIDE.md``), judging each message from the turns before it. They labelled by
reading, without a program. Two read ``natural-blind8``, each without the other's labels.

``bench topics`` reports, per set read, ``reader_f1``: the mean over its readers of the F1 of
a reader's jumps against the writer's labels (and ``reader_pair_f1``, the readers' F1 against
each other, where two read it). It bounds what the labels allow: a detector's F1 far below a
reader's is the detector's shortfall, not label noise.

The chatterbot sample (``data/readers/chatterbot_english_sample.jsonl``) is the first 40 of
the 120 English held-out sessions that ``bench topics`` builds with seed 0 (a test checks that
they still are), its labels the topic-file changes; ``chatterbot_sample`` scores the default
detector on it beside the reader.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from suffixmem.conversation.topic import TopicDetector
from suffixmem_bench.topic_scoring import evaluate, jump_scores
from suffixmem_bench.topic_sets import load_natural

DATA_DIR = Path(__file__).parent / "data"
READERS_DIR = DATA_DIR / "readers"
CHATTERBOT_SAMPLE = READERS_DIR / "chatterbot_english_sample.jsonl"


def reader_files(data: Path) -> list[Path]:
    """The readers' label files of the data file ``data`` (``<stem>.reader<k>.json``); none
    for a file outside the shipped data (a test's shortened copy of a set was not read)."""
    if data.resolve().parent not in (DATA_DIR.resolve(), READERS_DIR.resolve()):
        return []
    stem = data.stem.removesuffix("_sample")
    return sorted(READERS_DIR.glob(f"{stem}.reader*.json"))


def writer_jumps(data: Path) -> dict[str, list[bool]]:
    """Session id -> the writer's jump label of each turn, in order."""
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines() if line]
    return {r["id"]: [bool(t["jump"]) for t in r["turns"]] for r in rows}


def reader_jumps(labels: Path, writer: dict[str, list[bool]]) -> dict[str, list[bool]]:
    """A reader's labels (session id -> the turns it marked) as a jump flag per turn, aligned
    with ``writer``. Raises ValueError naming the file if it misses a session, names one the
    data lacks, or marks a turn that is not a later turn of its session."""
    marked: dict[str, list[int]] = json.loads(labels.read_text(encoding="utf-8"))
    if set(marked) != set(writer):
        raise ValueError(f"{labels.name}: sessions differ from the data's "
                         f"(missing {sorted(set(writer) - set(marked))[:3]}, "
                         f"unknown {sorted(set(marked) - set(writer))[:3]})")
    out = {}
    for sid, turns in writer.items():
        bad = [i for i in marked[sid] if not 1 <= i < len(turns)]
        if bad:
            raise ValueError(f"{labels.name}: session {sid} has no later turn {bad[0]}")
        out[sid] = [i in marked[sid] for i in range(len(turns))]
    return out


def _flat(jumps: dict[str, list[bool]]) -> list[bool]:
    """Every turn but each session's first (a first turn is never scored), in session order."""
    return [j for sid in sorted(jumps) for j in jumps[sid][1:]]


def agreement(data: Path) -> dict[str, Any] | None:
    """``reader_f1`` (mean over readers), ``reader_f1_each``, ``readers`` and, with two or
    more, ``reader_pair_f1`` (the first two against each other) for ``data``; None when no
    reader read it."""
    files = reader_files(data)
    if not files:
        return None
    writer = writer_jumps(data)
    readers = [_flat(reader_jumps(f, writer)) for f in files]
    truth = _flat(writer)
    each = [round(jump_scores(truth, r)["f1"], 4) for r in readers]
    out: dict[str, Any] = {"readers": len(files), "reader_f1": round(statistics.fmean(each), 4),
                           "reader_f1_each": each}
    if len(readers) > 1:
        out["reader_pair_f1"] = round(jump_scores(readers[0], readers[1])["f1"], 4)
    return out


def chatterbot_sample(detector: TopicDetector) -> dict[str, Any]:
    """The chatterbot sample: its reader's agreement with the topic-file changes beside
    ``detector``'s F1 on the same 40 sessions."""
    found = agreement(CHATTERBOT_SAMPLE)
    assert found is not None, "the chatterbot sample ships with its reader's labels"
    sessions = load_natural(CHATTERBOT_SAMPLE)
    return {**found, "f1": round(evaluate(detector, sessions)["f1"], 4),
            "sessions": len(sessions), "jumps": sum(j for s in sessions for _, _, j in s[1:])}
