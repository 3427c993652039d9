"""One jump probability from a turn's topic signals: a logistic model over a handful of
language-independent features of the new user message against the session's current topic.

The features (computed by ``TopicDetector.signals``, in this order, see ``FEATURES``):

- ``sim``: the TF-IDF similarity with the topic (the closest of its decayed centroid, its
  opening turn and its latest turns), in [0, 1].
- ``sim_drop``: how far ``sim`` falls below the mean similarity the topic's own turns had when
  they arrived: a per-session threshold (a session of loosely worded turns tolerates a lower
  similarity than one that keeps repeating its terms). 0 until the topic has a turn to compare.
- ``novelty``: the share of the message's character TF-IDF mass (its vector is l2-normed, so
  the squared weights sum to 1) on n-grams the session never used. A new subject brings new
  words; a follow-up reuses the session's words or mostly function words.
- ``length``: ``log1p(letters) / 5`` (``content_chars``: kanji, hanzi and hangul count 3, kana
  2): a few words rarely open a topic.
- ``follow_up``: 1 when the message opens with a continuation cue or, short, refers back with
  a pronoun (``topic_cues.continues_topic``).
- ``question``: 1 when it asks something (a question mark or a CJK question particle).
- ``rel_length``: ``log((1 + letters) / (1 + letters of the last user message))``: a new
  subject tends to come as a message longer than the one before it, a follow-up as a shorter
  one. ``length`` alone cannot tell a terse writer's new subject from a wordy writer's
  follow-up; the ratio reads each message against the same writer's last one. 0 at a
  session's second turn: the session's opening message sets its subject up, and a second one
  that fills in detail runs far longer without leaving it.
- ``context_gain`` (optional, ``GAIN_FEATURES``): nats per token by which the last turn makes
  the message more likely under the served model (``suffixmem.context_gain``); only a detector
  given a ``ContextGain`` computes it.
- ``hidden_sim`` (optional, ``HIDDEN_FEATURES``): the cosine of the message's and the last
  user message's mean hidden states at a middle layer of the served model
  (``suffixmem.hidden_similarity``); only a detector given a ``HiddenSimilarity`` computes it.

No topic list and no vocabulary is learned: only one weight per feature, a bias and the
decision cutoff. ``DEFAULT_MODEL`` holds the weights that ``suffixmem bench topics`` fits on its
tuning data (English chatterbot tuning topics and the separate natural tuning sessions; the
scored data is never seen), copied here so serving trains nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from suffixmem.errors import ConfigError

FEATURES: tuple[str, ...] = ("sim", "sim_drop", "novelty", "length", "follow_up", "question",
                             "rel_length")
GAIN_FEATURES: tuple[str, ...] = (*FEATURES, "context_gain")
HIDDEN_FEATURES: tuple[str, ...] = (*FEATURES, "hidden_sim")
# the served model's signals, each an eighth feature: its name -> its features
EXTRA_FEATURES: dict[str, tuple[str, ...]] = {"context_gain": GAIN_FEATURES,
                                              "hidden_sim": HIDDEN_FEATURES}


@dataclass(slots=True, frozen=True)
class SignalModel:
    """``probability(x) = sigmoid(bias + weights . x)``; a jump when it is >= ``cutoff``.
    ``features``: what ``x`` holds, ``FEATURES`` or one of ``EXTRA_FEATURES``."""

    weights: tuple[float, ...]
    bias: float
    cutoff: float = 0.5
    features: tuple[str, ...] = FEATURES

    def __post_init__(self) -> None:
        if self.features != FEATURES and self.features not in EXTRA_FEATURES.values():
            raise ConfigError("features must be FEATURES, GAIN_FEATURES or HIDDEN_FEATURES, "
                              f"got {self.features}")
        if len(self.weights) != len(self.features):
            raise ConfigError(f"weights needs {len(self.features)} values "
                              f"({', '.join(self.features)}), got {len(self.weights)}")
        if not all(math.isfinite(w) for w in (*self.weights, self.bias)):
            raise ConfigError("weights and bias must be finite numbers")
        if not 0.0 < self.cutoff < 1.0:
            raise ConfigError(f"cutoff must be in (0, 1), got {self.cutoff}")

    @property
    def uses_gain(self) -> bool:
        """Whether it weighs one of the served model's signals (an eighth feature)."""
        return self.extra is not None

    @property
    def extra(self) -> str | None:
        """The served model's signal it weighs (``context_gain``, ``hidden_sim``), or None."""
        return self.features[-1] if len(self.features) > len(FEATURES) else None

    def probability(self, x: Sequence[float]) -> float:
        """P(jump) for one feature vector (ordered as ``features``)."""
        z = self.bias + sum(w * v for w, v in zip(self.weights, x, strict=True))
        z = max(-30.0, min(30.0, z))  # exp overflow guard; p is 0 or 1 to float precision
        return 1.0 / (1.0 + math.exp(-z))

    def with_cutoff(self, cutoff: float) -> SignalModel:
        return replace(self, cutoff=cutoff)

    def describe(self) -> dict[str, float]:
        """Weights by feature name, with the bias and cutoff (for reports)."""
        return {**{n: round(w, 4) for n, w in zip(self.features, self.weights, strict=True)},
                "bias": round(self.bias, 4), "cutoff": self.cutoff}

    @classmethod
    def fit(cls, x: Sequence[Sequence[float]], y: Sequence[bool],
            sample_weight: Sequence[float] | None = None, c: float = 1.0,
            extra: str = "context_gain") -> SignalModel:
        """Maximum-likelihood weights (L2-regularised with strength 1/``c``) for features ``x``
        (rows of ``FEATURES``, or of ``EXTRA_FEATURES[extra]`` when they are one longer) and
        jump labels ``y``; the cutoff stays 0.5 (tune it with ``with_cutoff``)."""
        import numpy as np
        from sklearn.linear_model import LogisticRegression

        if not x or len(set(map(bool, y))) < 2:
            raise ConfigError("fitting needs feature rows of both jumps and continuations")
        lr = LogisticRegression(C=c, max_iter=1000)
        lr.fit(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=bool),
               sample_weight=None if sample_weight is None else np.asarray(sample_weight))
        features = EXTRA_FEATURES[extra] if len(x[0]) > len(FEATURES) else FEATURES
        return cls(tuple(round(float(w), 4) for w in lr.coef_[0]),
                   round(float(lr.intercept_[0]), 4), features=features)


# fitted by `suffixmem bench topics` (seed 0: 120 English chatterbot tuning sessions and the 60
# natural tuning sessions in 20 languages; acknowledgements, shift markers and returns to an
# earlier subject decided before the model, as in serving; combining marks count as letters,
# kana as two); cutoff: the smallest worst regret over the two tuning sets; their mean F1
# 0.567. results/topics/amd-*.json reports it. Refitted on 2026-12-06 when a session's second
# turn lost its length ratio (results/topics/amd-379c33c.json; before: weights (-2.8544,
# 4.3108, 0.589, -0.4381, -1.8222, -0.102, 1.2867), bias -1.4295, mean tuning F1 0.557), and
# before that when returns left the model's turns. With ``rel_length`` (2026-12-05) the
# absolute ``length`` weight fell from 4.44 to about 0 and the length ratio carries it;
# docs/conversation.md compares the two.
DEFAULT_MODEL = SignalModel(
    weights=(-2.7507, 4.4421, 0.5434, 0.0084, -1.8209, -0.1718, 1.2564), bias=-1.6976,
    cutoff=0.25,
)

# fitted with `bench topics --context-gain` (seed 0, the same tuning sessions as DEFAULT_MODEL;
# results/topics/context-gain-amd-e896923.json, bf16 forwards on an AMD EPYC host): with the
# gain, the similarity's own weight shrinks and its drop below the topic's earlier
# similarities, the follow-up cue and the length ratio carry the rest. Cutoff 0.35, the
# smallest worst regret over the tuning sets; their mean F1 0.713. Refitted on 2026-12-06 when
# a session's second turn lost its length ratio (before, context-gain-amd-0ec8b57.json:
# weights (-1.183, 3.0875, -0.2906, -1.0263, -1.6033, 0.1242, 1.113, -2.0387), bias 0.5052,
# mean tuning F1 0.716: this signal's model alone lost a little there), and before that with
# returns left out of the model's turns.
GAIN_MODEL = SignalModel(
    weights=(-1.1007, 3.1431, -0.3358, -0.7188, -1.6013, 0.0926, 1.0904, -2.0476), bias=0.3369,
    cutoff=0.35, features=GAIN_FEATURES,
)

# fitted with `bench topics --hidden-similarity` (seed 0, the same tuning sessions as
# DEFAULT_MODEL; layer 12, the first 24 tokens of each message; bf16 forwards on an AMD EPYC
# host; results/topics/hidden-amd-4400fb7.json): the hidden cosine with the last user message
# weighs against a jump, beside the TF-IDF signals. Cutoff 0.25, the smallest worst regret over
# the tuning sets; their mean F1 0.612. Refitted on 2026-12-06 when a session's second turn
# lost its length ratio (before, hidden-amd-0ec8b57.json: weights (-2.5038,
# 3.6789, 0.5514, 0.2162, -1.9246, 0.1067, 1.0806, -5.1595), bias 2.5961, mean tuning F1
# 0.603), and before that with returns left out of the model's turns.
HIDDEN_MODEL = SignalModel(
    weights=(-2.3954, 3.7557, 0.5077, 0.6479, -1.9418, 0.0494, 1.0429, -5.3357), bias=2.4953,
    cutoff=0.25, features=HIDDEN_FEATURES,
)
