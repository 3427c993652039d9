"""Scoring topic-jump detectors: precision, recall and F1 against labelled sessions, and the
baselines every data set is compared with, each tuned on the same tuning data as the detector:
``RuleDetector``, the plain TF-IDF rule (``best_rule``), and the length rule (``best_length``:
a message of at least so many letters is a jump, nothing else read). Used by ``suffixmem bench
topics``."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence

from suffixmem.conversation.topic import TopicDetector, TopicState, TopicVerdict
from suffixmem.conversation.topic_text import content_chars
from suffixmem_bench.topic_sets import Pair, Session

THRESHOLDS = [round(0.02 * i, 2) for i in range(1, 26)]
LENGTHS = list(range(2, 121))  # letters (``content_chars``) the length rule tries


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


def predictions(detector: TopicDetector, sessions: Sequence[Session]
                ) -> tuple[list[bool], list[bool]]:
    """(truth, predicted) for every turn but each session's first, the detector running
    incrementally on its own verdicts (as in serving). The baseline rules are scored on the
    true history instead (``rule_similarities``, ``message_lengths``)."""
    truth: list[bool] = []
    pred: list[bool] = []
    for session in sessions:
        state = TopicState()
        for i, (q, a, jump) in enumerate(session):
            verdict = detector.observe_user(state, q)
            if i:
                truth.append(jump)
                pred.append(verdict.jump)
            detector.add_turn(state, q, a, verdict.jump)
    return truth, pred


def _verdicts_on_true_history(rule: RuleDetector, session: Session
                              ) -> Iterator[tuple[bool, TopicVerdict]]:
    """(true label, ``rule.detect`` verdict) of every turn but the first, each given the true
    history before it."""
    for i, (q, _a, jump) in enumerate(session):
        if i:
            yield jump, rule.detect([(u, v) for u, v, _ in session[:i]], q)


def evaluate(detector: TopicDetector, sessions: Sequence[Session]) -> dict[str, float]:
    return jump_scores(*predictions(detector, sessions))


def roc_auc(truth: Sequence[bool], scores: Sequence[float], one_class: float) -> float:
    """ROC AUC of ``scores`` (higher: more likely a jump) against ``truth``; ``one_class`` when
    the turns hold one class only, where the AUC is undefined."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(truth, scores)) if len(set(truth)) == 2 else one_class


def best_threshold(scored: Sequence[tuple[Sequence[bool], Sequence[float]]],
                   candidates: Sequence[float],
                   is_jump: Callable[[float, float], bool]) -> tuple[float, float]:
    """(threshold, mean F1) of the best of ``candidates`` over ``scored`` sets of (true labels,
    a per-turn value), a turn being a jump when ``is_jump(value, threshold)``; ties: the
    smaller threshold. The values do not depend on the threshold, so each is computed once."""
    def mean_f1(t: float) -> float:
        return statistics.fmean(jump_scores(truth, [is_jump(x, t) for x in xs])["f1"]
                                for truth, xs in scored)

    return max(((t, mean_f1(t)) for t in candidates), key=lambda x: (x[1], -x[0]))


def rule_scores(rule: RuleDetector, sessions: Sequence[Session]) -> dict[str, float]:
    """Precision, recall and F1 of ``rule`` on the true history, plus ``similarity_auc``: how
    well the rule's similarity alone ranks true jumps below continuations (ROC AUC; 0.5: the
    set carries no TF-IDF signal that any threshold, ours or the rule's, could find)."""
    truth, sims = rule_similarities(sessions, rule.window)
    scores = jump_scores(truth, [x < rule.threshold for x in sims])
    scores["similarity_auc"] = roc_auc(truth, [-x for x in sims], 0.5)
    return scores


def rule_similarities(sessions: Sequence[Session], window: int = 3
                      ) -> tuple[list[bool], list[float]]:
    """(true labels, the rule's similarities) of every turn but each session's first, on the
    true history: what ``RuleDetector(t, window)`` decides at any threshold ``t`` (a jump is a
    similarity below it), computed once."""
    rule = RuleDetector(0.0, window)
    truth: list[bool] = []
    sims: list[float] = []
    for session in sessions:
        for jump, verdict in _verdicts_on_true_history(rule, session):
            truth.append(jump)
            sims.append(verdict.similarity or 0.0)
    return truth, sims


def best_rule(sets: Sequence[Sequence[Session]]) -> tuple[float, float]:
    """(threshold, mean F1) of the baseline rule's best threshold over ``sets``. The rule's
    similarities do not depend on its threshold, so each set's are computed once and every
    threshold in ``THRESHOLDS`` is scored on them (the same verdicts as ``evaluate`` with
    ``RuleDetector(t)``, 25 times less TF-IDF work)."""
    return best_threshold([rule_similarities(s) for s in sets], THRESHOLDS,
                          lambda sim, t: sim < t)


def message_lengths(sessions: Sequence[Session]) -> tuple[list[bool], list[int]]:
    """(true labels, ``content_chars`` of the message) of every turn but each session's first."""
    truth: list[bool] = []
    lengths: list[int] = []
    for session in sessions:
        for q, _a, jump in session[1:]:
            truth.append(jump)
            lengths.append(content_chars(q))
    return truth, lengths


def length_scores(threshold: int, sessions: Sequence[Session]) -> dict[str, float]:
    """Precision, recall and F1 of the length rule: a message of ``threshold`` letters or more
    is a jump. It reads nothing but the message's length, so a detector that does not beat it
    on a set adds nothing there that length alone would not."""
    truth, lengths = message_lengths(sessions)
    return jump_scores(truth, [n >= threshold for n in lengths])


def length_auc(sessions: Sequence[Session]) -> float:
    """ROC AUC of the message's length as a jump score (longer: more likely a jump); 0.5 when
    the turns hold one class only. How much of a set's jumps length alone can rank."""
    return roc_auc(*message_lengths(sessions), 0.5)


def best_length(sets: Sequence[Sequence[Session]]) -> tuple[int, float]:
    """(threshold, mean F1) of the length rule's best threshold in ``LENGTHS`` over ``sets``
    (ties: the shorter threshold)."""
    threshold, f1 = best_threshold([message_lengths(s) for s in sets], LENGTHS,
                                   lambda n, t: n >= t)
    return int(threshold), f1
