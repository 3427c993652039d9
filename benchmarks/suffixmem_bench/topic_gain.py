"""``bench topics --context-gain`` / ``--hidden-similarity``: the detector with one of the
served model's signals (``suffixmem.context_gain``, ``suffixmem.hidden_similarity``) beside the
default one, on the same data sets.

The signal's model (``GAIN_FEATURES`` or ``HIDDEN_FEATURES``: the seven signals plus it) is
fitted exactly as the default one, on the same tuning sessions (English chatterbot tuning
topics, natural_tune); the scored sets are never seen. Each data set's entry gains
``"context_gain"`` (or ``"hidden_sim"``) ``: {"f1", "precision", "recall", "auc",
"default_auc", "signal_auc"}`` (``auc``: the fitted probability as a jump score over the turns
it decides; ``signal_auc``: the served model's signal alone, against the true previous turn);
the report's top level the same key with ``{"model", "tune_f1", "ms_p50", "ms_p99", "calls",
"ms_per_turn_p99", "f1_min"}``, where ``ms_p50``/``ms_p99`` are the signal's own per
computation in the bench (the gain: two forwards of the served model; the hidden similarity:
one forward of its first layers per text not remembered) and ``ms_per_turn_p99`` the whole
verdict's per turn as the default detector's is measured.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Sequence
from typing import Any

from suffixmem.conversation.topic import TopicDetector, TopicState, signal_name
from suffixmem_bench.topic_scoring import roc_auc


class MemoGain:
    """A ``ContextGain`` that remembers each (last turn, message) and times each computation:
    the gain depends on the texts alone, and the bench asks again for every cutoff it tries."""

    def __init__(self, gain: Any) -> None:
        self.gain = gain
        self.memo: dict[tuple[tuple[str, str], str], float] = {}
        self.ms: list[float] = []

    @property
    def feature(self) -> str:
        return str(signal_name(self.gain))

    @classmethod
    def load(cls, model: str | None = None, signal: str = "context_gain") -> MemoGain:
        """The served model's ``signal``: ``context_gain`` or ``hidden_sim``."""
        from suffixmem.models import DEFAULT_MODEL

        if signal == "hidden_sim":
            from suffixmem.hidden_similarity import HiddenSimilarity

            return cls(HiddenSimilarity(model or DEFAULT_MODEL))
        from suffixmem.context_gain import ContextGain

        return cls(ContextGain(model or DEFAULT_MODEL))

    def __call__(self, last_turn: tuple[str, str], message: str) -> float:
        key = (last_turn, message)
        hit = self.memo.get(key)
        if hit is None:
            t0 = time.perf_counter()
            hit = self.memo[key] = self.gain(last_turn, message)
            self.ms.append((time.perf_counter() - t0) * 1000)
        return hit

    def untimed(self, last_turn: tuple[str, str], message: str) -> float:
        """The signal as ``__call__`` gives it, remembered but not timed (a measurement
        outside the detector's path must not move the detector's timings)."""
        key = (last_turn, message)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self.gain(last_turn, message)
        return hit

    def timing(self) -> dict[str, float]:
        ms = sorted(self.ms)
        if not ms:
            return {"ms_p50": float("nan"), "ms_p99": float("nan"), "calls": 0}
        return {"ms_p50": round(statistics.median(ms), 2),
                "ms_p99": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
                "calls": len(ms)}


def probability_auc(detector: TopicDetector, sessions: Sequence[Sequence[tuple[str, str, bool]]]
                    ) -> float:
    """ROC AUC of the signal model's probability over the turns it decides, each on the
    detector's own verdicts (as served); NaN when those turns hold one class only."""
    ys: list[bool] = []
    ps: list[float] = []
    for session in sessions:
        state = TopicState()
        for i, (q, a, jump) in enumerate(session):
            verdict = detector.observe_user(state, q)
            if i and verdict.probability is not None:
                ys.append(jump)
                ps.append(verdict.probability)
            detector.add_turn(state, q, a, verdict.jump)
    return roc_auc(ys, ps, float("nan"))


def signal_auc(gain: MemoGain, sessions: Sequence[Sequence[tuple[str, str, bool]]]) -> float:
    """ROC AUC of the signal alone as a jump score: minus its value for each turn but a
    session's first against the true previous turn (a lower gain or hidden cosine should
    mean a jump); 0.5 is no signal. NaN when the turns hold one class only."""
    ys: list[bool] = []
    xs: list[float] = []
    for session in sessions:
        for (q0, a0, _), (q, _a, jump) in itertools.pairwise(session):
            ys.append(jump)
            xs.append(-gain.untimed((q0, a0), q))
    return roc_auc(ys, xs, float("nan"))


def scores(detector: TopicDetector, gain_model: Any, gain: MemoGain,
           sessions: Sequence[Sequence[tuple[str, str, bool]]]) -> dict[str, float]:
    """One data set's ``context_gain`` entry: the gain detector (``detector``'s featurizer,
    ``gain_model``) on its own verdicts, both detectors' probability AUCs, and the signal's
    own AUC (``signal_auc``)."""
    from suffixmem_bench.topic_scoring import evaluate

    with_gain = TopicDetector(None, detector.featurizer, gain_model, gain)
    g = evaluate(with_gain, sessions)
    return {"f1": round(g["f1"], 4), "precision": round(g["precision"], 4),
            "recall": round(g["recall"], 4),
            "auc": round(probability_auc(with_gain, sessions), 4),
            "default_auc": round(probability_auc(detector, sessions), 4),
            "signal_auc": round(signal_auc(gain, sessions), 4)}


def summary(model: Any, tune_f1: float, gain: MemoGain,
            datasets: dict[str, dict[str, Any]], turn_ms_p99: float) -> dict[str, Any]:
    """The report's top-level entry; ``turn_ms_p99``: observe_user + add_turn of the detector
    with the signal on a 50-turn session (``topics.signal_turn_ms``), the issue's budget."""
    scored = [d[gain.feature]["f1"] for d in datasets.values() if gain.feature in d]
    return {"model": model.describe(), "tune_f1": round(tune_f1, 4), **gain.timing(),
            "ms_per_turn_p99": turn_ms_p99, "f1_min": min(scored) if scored else None}
