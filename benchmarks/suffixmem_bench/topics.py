"""``suffixmem bench topics``: topic-jump detection on conversations the detector never saw.

Data sets:
- ``chatterbot-<language>``: sessions built from chatterbot-corpus, several question/answer pairs
  of one topic file, then of another; the first turn of each new topic is a true jump. Whole
  topic files are held out: tuning uses one set of topics (English only), scoring the others,
  in English and in every other language of the corpus; an utterance that occurs in the tuning
  topics is dropped from the scored ones. The IDF background for scoring chatterbot is rebuilt
  from the tuning topics of all languages, so no scored utterance shapes the weights.
- ``natural``: ``data/natural_topics.jsonl``, 40 multi-turn sessions written for this project
  (English, German, Spanish, Chinese) with short follow-ups, jumps that share words with the
  previous topic and sessions without any jump, labelled conservatively. Never tuned on.

Tuned on the English tuning sessions: the detector's ``threshold`` and the baseline rule's
threshold (``RuleDetector``: char 2-4-gram TF-IDF fitted on the session, cosine with the last
three turns), each to its best F1 there. Reported per data set: F1, precision, recall, the
rule's F1, turns and jumps scored; ``f1_min`` over data sets; ``ms_per_turn_p99`` of the
detector on a 50-turn session; ``peak_mb`` (peak RSS of this process).
"""

from __future__ import annotations

import json
import random
import resource
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from suffixmem.conversation.topic import (
    Featurizer,
    TopicDetector,
    TopicState,
    TopicVerdict,
    default_detector,
)
from suffixmem.conversation.topic_corpus import available_languages, load_topics

Pair = tuple[str, str]
LabelledTurn = tuple[str, str, bool]
Session = list[LabelledTurn]
NATURAL = Path(__file__).parent / "data" / "natural_topics.jsonl"
THRESHOLDS = [round(0.02 * i, 2) for i in range(1, 26)]


class RuleDetector:
    """The plain rule: char 2-4-gram TF-IDF fitted on the session's own text, cosine between the
    new message and the last ``window`` turns; below ``threshold`` is a jump."""

    def __init__(self, threshold: float = 0.3, window: int = 3) -> None:
        self.threshold = threshold
        self.window = window

    def detect(self, turns: Sequence[Pair], message: str) -> TopicVerdict:
        if not turns:
            return TopicVerdict(False, None, reason="first turn")
        from sklearn.feature_extraction.text import TfidfVectorizer

        recent = " ".join(f"{u} {a}" for u, a in turns[-self.window:])
        m = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4)).fit_transform([recent, message])
        sim = float((m[0].multiply(m[1])).sum())
        return TopicVerdict(sim < self.threshold, sim, reason="rule")


def jump_scores(truth: Sequence[bool], predicted: Sequence[bool]) -> dict[str, float]:
    """Precision, recall and F1 of predicted jumps against true boundaries."""
    tp = sum(1 for t, p in zip(truth, predicted, strict=True) if t and p)
    fp = sum(1 for t, p in zip(truth, predicted, strict=True) if p and not t)
    fn = sum(1 for t, p in zip(truth, predicted, strict=True) if t and not p)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "tp": tp, "fp": fp, "fn": fn}


def predictions(detector: Any, sessions: Sequence[Session]) -> tuple[list[bool], list[bool]]:
    """(truth, predicted) for every turn but each session's first. A ``TopicDetector`` runs
    incrementally on its own verdicts (as in serving); others get the true history."""
    truth: list[bool] = []
    pred: list[bool] = []
    for session in sessions:
        if isinstance(detector, TopicDetector):
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
    return truth, pred


def evaluate(detector: Any, sessions: Sequence[Session]) -> dict[str, float]:
    return jump_scores(*predictions(detector, sessions))


def split_topic_names(names: Sequence[str], seed: int) -> tuple[list[str], list[str]]:
    """Whole topics: about half for tuning, the rest held out for scoring."""
    order = sorted(names)
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    return sorted(order[:half]), sorted(order[half:])


def pools(language: str, topics: Sequence[str], exclude: set[str] = frozenset(),  # type: ignore[assignment]
          ) -> dict[str, list[Pair]]:
    """topic -> pairs of ``language`` for ``topics``, without pairs that contain an utterance of
    ``exclude`` and with each utterance kept once (de-duplicated across topics too)."""
    data = load_topics(language)
    seen = set(exclude)
    out: dict[str, list[Pair]] = {}
    for name in topics:
        kept = []
        for conv in data.get(name, []):
            for q, a in conv:
                if q in seen or a in seen:
                    continue
                seen.update((q, a))
                kept.append((q, a))
        if len(kept) >= 4:
            out[name] = kept
    return out


def build_sessions(pool: dict[str, list[Pair]], n: int, seed: int) -> list[Session]:
    """``n`` sessions of 2-4 topic blocks of 2-5 pairs (a block's first turn is a jump)."""
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
            k = min(rng.randint(2, 5), len(pool[topic]))
            for j, (q, a) in enumerate(rng.sample(pool[topic], k)):
                session.append((q, a, b > 0 and j == 0))
        sessions.append(session)
    return sessions


def load_natural(path: Path = NATURAL) -> list[Session]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [[(t["user"], t["assistant"], bool(t["jump"])) for t in r["turns"]] for r in rows]


def _best(make: Any, sessions: Sequence[Session]) -> tuple[float, float]:
    """(threshold, F1) of the best threshold in ``THRESHOLDS`` on ``sessions``."""
    return max(((t, evaluate(make(t), sessions)["f1"]) for t in THRESHOLDS),
               key=lambda x: (x[1], -x[0]))


def per_turn_ms(detector: TopicDetector, turns: int = 50) -> float:
    """p99 of observe_user + add_turn on a ``turns``-turn natural session (milliseconds)."""
    natural = [t for s in load_natural() for t in s]
    times = []
    state = TopicState()
    for q, a, _ in natural[:turns]:
        t0 = time.perf_counter()
        v = detector.observe_user(state, q)
        detector.add_turn(state, q, a, v.jump)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return times[min(len(times) - 1, int(0.99 * len(times)))]


def run_topics(n_sessions: int = 120, seed: int = 0,
               languages: Sequence[str] | None = None) -> dict[str, Any]:
    """Tune on English held-in topics; score chatterbot held-out topics in ``languages`` (all
    by default) and the natural set. See the module docstring for the JSON."""
    names = sorted(load_topics("english"))
    tune_names, test_names = split_topic_names(names, seed)
    tune_pool = pools("english", tune_names)
    tune_sessions = build_sessions(tune_pool, n_sessions, seed + 1)
    langs = list(languages) if languages is not None else available_languages()
    tune_texts = [t for lang in available_languages() for p in
                  pools(lang, tune_names).values() for pair in p for t in pair]
    chat_feat = Featurizer().fit(tune_texts)
    base = default_detector()
    thr, _ = _best(lambda t: TopicDetector(replace(base.config, threshold=t), chat_feat),
                   tune_sessions)
    rule_thr, _ = _best(lambda t: RuleDetector(t), tune_sessions)
    rule = RuleDetector(rule_thr)

    datasets: dict[str, dict[str, Any]] = {}

    def score(name: str, detector: TopicDetector, sessions: list[Session]) -> None:
        if not sessions:
            return
        ours = evaluate(detector, sessions)
        datasets[name] = {
            "f1": round(ours["f1"], 4), "precision": round(ours["precision"], 4),
            "recall": round(ours["recall"], 4),
            "baseline_f1": round(evaluate(rule, sessions)["f1"], 4),
            "turns": sum(len(s) - 1 for s in sessions), "jumps": int(ours["tp"] + ours["fn"]),
        }

    chat_detector = TopicDetector(replace(base.config, threshold=thr), chat_feat)
    for lang in langs:
        held_in = {t for p in pools(lang, tune_names).values() for pair in p for t in pair}
        score(f"chatterbot-{lang}", chat_detector,
              build_sessions(pools(lang, test_names, held_in), n_sessions, seed + 2))
    natural_detector = TopicDetector(replace(base.config, threshold=thr), base.featurizer)
    score("natural", natural_detector, load_natural())
    return {
        "datasets": datasets,
        "f1": datasets["natural"]["f1"],
        "f1_min": min(d["f1"] for d in datasets.values()),
        "threshold": thr, "baseline_threshold": rule_thr,
        "tune_topics": tune_names, "test_topics": test_names,
        "ms_per_turn_p99": round(per_turn_ms(natural_detector), 3),
        "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def register(bench: Any) -> None:
    import typer

    @bench.command("topics")
    def topics_cmd(
        sessions: int = typer.Option(120, help="sessions per data set built from the corpus"),
        seed: int = typer.Option(0, help="random seed of the topic split and the sessions"),
        language: list[str] = typer.Option(  # noqa: B008
            None, help="chatterbot languages to score (default: all)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Precision/recall/F1 of topic-jump detection on held-out topics and natural chats."""
        from suffixmem_bench.measure import RunContext

        with RunContext() as ctx:  # quality figures, but the JSON carries the run's context too
            result = run_topics(sessions, seed, language or None)
        result.update(ctx.fields())
        if as_json:
            print(json.dumps(result))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title="topic jumps (tuned on English held-in topics only)")
        for col in ("data set", "turns", "jumps", "precision", "recall", "F1", "rule F1"):
            table.add_column(col)
        for name, d in result["datasets"].items():
            table.add_row(name, str(d["turns"]), str(d["jumps"]), f"{d['precision']:.3f}",
                          f"{d['recall']:.3f}", f"{d['f1']:.3f}", f"{d['baseline_f1']:.3f}")
        Console().print(table)
        Console().print(f"p99 {result['ms_per_turn_p99']} ms/turn, peak {result['peak_mb']} MB")
