"""``suffixmem bench topics``: topic-jump detection on chatterbot-corpus sessions.

Sessions are built by concatenating several question/answer pairs of one topic (a corpus file
such as ``ai.yml``), then several of another, and so on; the first turn of each new topic is a
true jump. The corpus's conversations of each topic are split in two halves: *tuning* sessions
(which fit the IDF background and train the learned decision) use one half, *scored* sessions
only the other, so the reported score comes from text the detector never saw.

Reported: precision, recall and F1 of ``TopicDetector`` (the manager's detector) on the scored
sessions, and the same for the plain rule (``RuleDetector``: cosine < 0.3 of char 2-4-gram
TF-IDF against the last three turns).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from suffixmem.conversation.topic_corpus import (
    LabelledTurn,
    Pair,
    build_sessions,
    load_topics,
    split_topics,
)


def evaluate(detector: Any, sessions: Sequence[Sequence[LabelledTurn]]) -> dict[str, float]:
    """Score ``detector.detect(past_turns, message)`` on every turn but the first of each
    session. Past turns are the true history (user, assistant)."""
    from suffixmem.conversation.topic import jump_scores

    truth: list[bool] = []
    pred: list[bool] = []
    for session in sessions:
        if hasattr(detector, "replay"):  # incremental: fold turns with the detector's own calls
            from suffixmem.conversation.topic import TopicState

            state = TopicState()
            for i, (q, a, jump) in enumerate(session):
                verdict = detector.observe_user(state, q)
                if i:
                    truth.append(jump)
                    pred.append(verdict.jump)
                detector.add_turn(state, q, a, verdict.jump)
        else:
            for i, (q, _a, jump) in enumerate(session):
                if i:
                    truth.append(jump)
                    pred.append(detector.detect([(u, v) for u, v, _ in session[:i]], q).jump)
    return jump_scores(truth, pred)


def train_detector(tune_pools: dict[str, list[Pair]], seed: int = 0) -> Any:
    """The manager's detector, trained on tuning pools only (see ``TopicDetector.train``)."""
    from suffixmem.conversation.topic import TopicDetector

    return TopicDetector().train(tune_pools, seed=seed)


def run_topics(n_sessions: int = 200, seed: int = 0) -> dict[str, Any]:
    """Tune on one half of the corpus, score on sessions built from the other half."""
    from suffixmem.conversation.topic import RuleDetector

    tune_pools, test_pools = split_topics(load_topics("english"), seed)
    test_sessions = build_sessions(test_pools, n_sessions, seed + 2)
    detector = train_detector(tune_pools, seed)
    ours = evaluate(detector, test_sessions)
    rule = evaluate(RuleDetector(), test_sessions)
    return {
        "precision": ours["precision"],
        "recall": ours["recall"],
        "f1": ours["f1"],
        "baseline_precision": rule["precision"],
        "baseline_recall": rule["recall"],
        "baseline_f1": rule["f1"],
        "scored_sessions": len(test_sessions),
        "scored_turns": sum(len(s) - 1 for s in test_sessions),
        "true_jumps": int(ours["tp"] + ours["fn"]),
        "topics": sorted(test_pools),
    }


def register(bench: Any) -> None:
    import typer

    @bench.command("topics")
    def topics_cmd(
        sessions: int = typer.Option(200, help="sessions to tune on and to score on (each)"),
        seed: int = typer.Option(0, help="random seed of the split and the sessions"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Precision/recall/F1 of topic-jump detection on held-out chatterbot sessions."""
        result = run_topics(sessions, seed)
        if as_json:
            print(json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"topic jumps on {result['scored_sessions']} held-out sessions")
        for col in ("detector", "precision", "recall", "F1"):
            table.add_column(col)
        table.add_row("suffixmem", f"{result['precision']:.3f}", f"{result['recall']:.3f}",
                      f"{result['f1']:.3f}")
        table.add_row("plain rule", f"{result['baseline_precision']:.3f}",
                      f"{result['baseline_recall']:.3f}", f"{result['baseline_f1']:.3f}")
        Console().print(table)
