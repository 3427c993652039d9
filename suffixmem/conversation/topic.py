"""Topic jumps and semantic temperature.

A *topic jump* is a user turn that leaves the subject of the conversation so far. The detector
compares the new user message with the session's recent turns by TF-IDF cosine over character
n-grams (so languages written without spaces work as well as English):

- ``RuleDetector`` is the plain rule: jump when the cosine between the new message and the last
  three turns is below 0.3, with IDF fitted on the session's own turns. Short chit-chat shares
  few n-grams even within a topic, so it fires too often (F1 ~0.4 on chatterbot sessions).
- ``TopicDetector`` (the default) improves on it in four ways:
  1. **corpus-fitted IDF**: n-gram weights come from a background corpus (hashed n-grams, so
     n-grams the corpus never saw still count, at the highest IDF);
  2. **decayed centroid**: the new message is compared with an exponentially decayed mean of the
     topic's turns (user and assistant), reset at each jump, instead of a fixed window;
  3. **minimum content**: a message with too few letters ("ok", "why?") is never a jump;
  4. **learned parts** (``train``): a topic classifier (logistic regression over the TF-IDF
     features) gives each text a topic posterior, tracked with the same decayed centroid; a
     gradient-boosted decision over the similarities (n-gram and posterior, to the centroid and
     to the last turn) and the message's length gives the jump probability, with its threshold
     set to the best F1 on out-of-fold tuning data. Without them, a cosine threshold is used.

``SemanticTemperature`` turns jumps into the session's sampling temperature: it starts at 0.8,
drops to 0.3 on a jump (the model should stay close to what it knows when the subject changes)
and recovers by ``recovery`` per turn while the topic holds.

Everything here is pure scikit-learn/numpy; no torch.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from suffixmem.errors import ConfigError

START_TEMPERATURE = 0.8
JUMP_TEMPERATURE = 0.3
_LETTERS = re.compile(r"[^\W\d_]", re.UNICODE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def content_chars(text: str) -> int:
    """Letters in ``text``, with CJK characters counting as 3 (one carries about a word)."""
    letters = len(_LETTERS.findall(text))
    return letters + 2 * len(_CJK.findall(text))


@dataclass(slots=True, frozen=True)
class TopicVerdict:
    """The detector's answer for one user turn. ``similarity`` is the cosine with the topic so
    far (``None`` on a session's first turn); ``probability`` the jump probability when a
    learned decision made it."""

    jump: bool
    similarity: float | None
    probability: float | None = None
    reason: str = ""


def char_ngrams(text: str, ngrams: tuple[int, int] = (2, 4)) -> list[str]:
    """Character n-grams within space-separated words (each padded with one space, as
    scikit-learn's ``char_wb``), plus every CJK character on its own: in Chinese and Japanese
    one character often is a word, while 3- and 4-grams of unspaced text are mostly unique."""
    out: list[str] = []
    lo, hi = ngrams
    for word in text.lower().split():
        padded = f" {word} "
        for n in range(lo, hi + 1):
            out += [padded[i:i + n] for i in range(len(padded) - n + 1)]
    out += _CJK.findall(text)
    return out


class Featurizer:
    """Character (and word) n-gram TF-IDF vectors with hashed features and a background IDF.

    Unfitted, every n-gram weighs the same (plain TF, l2-normalised).
    """

    def __init__(self, n_features: int = 2**18, ngrams: tuple[int, int] = (2, 4)) -> None:
        from sklearn.feature_extraction.text import HashingVectorizer

        self.char = HashingVectorizer(
            analyzer=functools.partial(char_ngrams, ngrams=ngrams),
            n_features=n_features, alternate_sign=False, norm=None,
        )
        self.word = HashingVectorizer(
            analyzer="word", ngram_range=(1, 1), n_features=n_features, alternate_sign=False,
            norm=None, lowercase=True, token_pattern=r"(?u)\b\w\w+\b",
        )
        self.char_idf: Any = None
        self.word_idf: Any = None

    def fit(self, corpus: Iterable[str]) -> Featurizer:
        """Fit the IDF on background texts (one document per utterance)."""
        from sklearn.feature_extraction.text import TfidfTransformer

        texts = [t for t in corpus if t and t.strip()]
        if texts:
            self.char_idf = TfidfTransformer(sublinear_tf=True).fit(self.char.transform(texts))
            self.word_idf = TfidfTransformer(sublinear_tf=True).fit(self.word.transform(texts))
        return self

    def transform(self, texts: Sequence[str]) -> tuple[Any, Any]:
        """(char, word) l2-normalised sparse matrices, one row per text."""
        from sklearn.preprocessing import normalize

        c = self.char.transform(texts)
        w = self.word.transform(texts)
        c = self.char_idf.transform(c) if self.char_idf is not None else normalize(c)
        w = self.word_idf.transform(w) if self.word_idf is not None else normalize(w)
        return c, w


def _cos(a: Any, b: Any) -> float:
    """Cosine of two 1-row sparse vectors (0 when either is empty)."""
    na = math.sqrt(float(a.multiply(a).sum()))
    nb = math.sqrt(float(b.multiply(b).sum()))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(a.multiply(b).sum()) / (na * nb)


@dataclass(slots=True)
class TopicState:
    """The running topic of one session: decayed centroids (n-grams and topic posteriors) and
    the last turn's."""

    char: Any = None
    word: Any = None
    post: Any = None
    last_char: Any = None
    last_word: Any = None
    last_post: Any = None
    turns: int = 0


@dataclass(slots=True)
class TopicConfig:
    """``threshold``: cosine below which a turn is a jump (without a learned decision);
    ``decay``: weight of the old centroid when a turn is added; ``min_content``: letters a
    message needs to count as a jump at all; ``decision_threshold``: jump probability above
    which the learned decision says jump (``train`` tunes it)."""

    threshold: float = 0.1
    decay: float = 0.5
    min_content: int = 6
    decision_threshold: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"threshold must be in [0, 1], got {self.threshold}")
        if not 0.0 <= self.decay < 1.0:
            raise ConfigError(f"decay must be in [0, 1), got {self.decay}")
        if self.min_content < 0:
            raise ConfigError(f"min_content must be >= 0, got {self.min_content}")
        if not 0.0 < self.decision_threshold < 1.0:
            raise ConfigError(
                f"decision_threshold must be in (0, 1), got {self.decision_threshold}")


FEATURES = ("cos_centroid_char", "cos_centroid_word", "cos_last_char", "cos_last_word",
            "log_content", "log_turns", "post_cos_centroid", "post_dot_last", "post_same_top",
            "post_entropy", "post_max")

Pair = tuple[str, str]
LabelledSession = Sequence[tuple[str, str, bool]]


def _dense_cos(a: Any, b: Any) -> float:
    na = float(np.linalg.norm(a))
    nb = float(np.linalg.norm(b))
    return float(np.dot(a, b)) / (na * nb) if na and nb else 0.0


class TopicDetector:
    """Corpus-fitted, centroid-based jump detector (see the module docstring).

    Use: ``state = TopicState()``; for each turn ``verdict = detector.observe_user(state, text)``
    then, once the turn is done, ``detector.add_turn(state, user, assistant, verdict.jump)``.
    ``detect(history_turns, message)`` does it statelessly from a list of past turns.

    Optional learned parts: ``topic_model`` (a classifier of topic labels over the TF-IDF
    features, giving each text a topic posterior) and ``decision`` (a logistic regression over
    ``FEATURES`` giving the jump probability). ``train`` fits both from labelled topic pools.
    """

    def __init__(self, config: TopicConfig | None = None,
                 featurizer: Featurizer | None = None) -> None:
        self.config = config or TopicConfig()
        self.featurizer = featurizer or Featurizer()
        self.topic_model: Any = None
        self._topic_w: Any = None
        self.decision: Any = None

    # -- features --------------------------------------------------------------------------------
    def _vectors(self, text: str) -> tuple[Any, Any, Any]:
        from scipy import sparse

        c, w = self.featurizer.transform([text])
        post = None
        if self.topic_model is not None:
            post = self.posteriors(sparse.hstack([c, w]).tocsr())[0]
        return c, w, post

    def posteriors(self, x: Any) -> Any:
        """The topic model's ``predict_proba`` for rows ``x`` (one-vs-rest logistic, normalised),
        computed from a contiguous copy of the weights: scipy's sparse @ transposed-coef path
        is ~100x slower for single rows."""
        from scipy.special import expit

        if getattr(self, "_topic_w", None) is None:
            self._topic_w = np.ascontiguousarray(self.topic_model.coef_.T)
        p = expit(np.asarray(x @ self._topic_w) + self.topic_model.intercept_)
        if p.shape[1] == 1:  # binary: sklearn returns [1 - p, p]
            return np.hstack([1 - p, p])
        return p / p.sum(axis=1, keepdims=True)

    def features(self, state: TopicState, message: str) -> list[float] | None:
        """The decision features of ``message`` against ``state`` (None on the first turn)."""
        if state.turns == 0 or state.char is None:
            return None
        c, w, post = self._vectors(message)
        feats = [
            _cos(c, state.char), _cos(w, state.word),
            _cos(c, state.last_char), _cos(w, state.last_word),
            math.log1p(content_chars(message)), math.log1p(state.turns),
        ]
        if post is not None and state.post is not None:
            feats += [
                _dense_cos(post, state.post), float(np.dot(post, state.last_post)),
                float(np.argmax(post) == np.argmax(state.post)),
                float(-(post * np.log(post + 1e-12)).sum()), float(post.max()),
            ]
        else:
            feats += [0.0, 0.0, 0.0, 0.0, 0.0]
        return feats

    def observe_user(self, state: TopicState, message: str) -> TopicVerdict:
        """Is ``message`` a jump from the topic in ``state``? (``state`` is not changed.)"""
        feats = self.features(state, message)
        if feats is None:
            return TopicVerdict(False, None, reason="first turn")
        sim = feats[0]
        if content_chars(message) < self.config.min_content:
            return TopicVerdict(False, sim, reason="too little content")
        if self.decision is not None:
            p = float(self.decision.predict_proba(np.asarray([feats]))[0, 1])
            return TopicVerdict(p >= self.config.decision_threshold, sim, p, "learned")
        return TopicVerdict(sim < self.config.threshold, sim, reason="threshold")

    def add_turn(self, state: TopicState, user: str, assistant: str, jump: bool) -> None:
        """Fold a finished turn into the topic (a jump starts a new topic from this turn)."""
        c, w, post = self._vectors(f"{user}\n{assistant}")
        if jump or state.char is None:
            state.char, state.word, state.post = c, w, post
        else:
            d = self.config.decay
            state.char = d * state.char + (1 - d) * c
            state.word = d * state.word + (1 - d) * w
            if post is not None and state.post is not None:
                state.post = d * state.post + (1 - d) * post
        state.last_char, state.last_word, state.last_post = c, w, post
        state.turns += 1

    def replay(self, turns: Sequence[tuple[str, str]]) -> TopicState:
        """The state after ``turns`` (user, assistant), re-detecting their jumps."""
        state = TopicState()
        for user, assistant in turns:
            verdict = self.observe_user(state, user)
            self.add_turn(state, user, assistant, verdict.jump)
        return state

    def detect(self, turns: Sequence[tuple[str, str]], message: str) -> TopicVerdict:
        return self.observe_user(self.replay(turns), message)

    # -- learning ---------------------------------------------------------------------------------
    def fit_topics(self, texts: Sequence[str], labels: Sequence[str]) -> TopicDetector:
        """Fit the topic classifier: logistic regression (by SGD, seconds rather than minutes
        on 500k hashed features) over the TF-IDF features."""
        from scipy import sparse
        from sklearn.linear_model import SGDClassifier

        c, w = self.featurizer.transform(list(texts))
        self._topic_w = None
        self.topic_model = SGDClassifier(
            loss="log_loss", alpha=1e-4, class_weight="balanced", max_iter=30, tol=None,
            random_state=0,
        ).fit(sparse.hstack([c, w]).tocsr(), list(labels))
        return self

    def decision_data(self, sessions: Sequence[LabelledSession],
                      ) -> tuple[list[list[float]], list[int]]:
        """Decision features and labels of every turn with enough content (teacher-forced:
        the topic state follows the true boundaries)."""
        xs: list[list[float]] = []
        ys: list[int] = []
        for session in sessions:
            state = TopicState()
            for user, assistant, jump in session:
                feats = self.features(state, user)
                if feats is not None and content_chars(user) >= self.config.min_content:
                    xs.append(feats)
                    ys.append(int(jump))
                self.add_turn(state, user, assistant, jump)
        return xs, ys

    def fit_decision(self, sessions: Sequence[LabelledSession]) -> TopicDetector:
        """Train the jump decision on labelled sessions: lists of (user, assistant, is_jump)."""
        xs, ys = self.decision_data(sessions)
        return self._fit_decision(xs, ys)

    @staticmethod
    def _decision_model() -> Any:
        from sklearn.ensemble import HistGradientBoostingClassifier

        return HistGradientBoostingClassifier(
            max_iter=200, learning_rate=0.05, max_depth=4, random_state=0)

    def _fit_decision(self, xs: list[list[float]], ys: list[int]) -> TopicDetector:
        if len(set(ys)) < 2:
            raise ConfigError("the jump decision needs sessions with and without jumps")
        self.decision = self._decision_model().fit(np.asarray(xs), np.asarray(ys))
        return self

    def train(self, pools: dict[str, list[Pair]], n_sessions: int = 300, seed: int = 0,
              background: Sequence[str] = ()) -> TopicDetector:
        """Fit everything from labelled pools (topic -> question/answer pairs):

        1. the IDF on the pools' texts and ``background``;
        2. stacking without leakage: the pools are halved; a topic model fitted on one half
           gives the features of sessions built from the other half, and the other way round;
           the decision is fitted on those out-of-fold features and its threshold set to the
           best F1 on them;
        3. the topic model is refitted on all pools.
        """
        import random

        from suffixmem.conversation.topic_corpus import build_sessions

        texts = [t for pairs in pools.values() for p in pairs for t in p]
        self.featurizer.fit([*texts, *background])
        rng = random.Random(seed)
        halves: list[dict[str, list[Pair]]] = [{}, {}]
        for name in sorted(pools):
            pairs = list(pools[name])
            rng.shuffle(pairs)
            h = len(pairs) // 2
            if h >= 2:
                halves[0][name], halves[1][name] = pairs[:h], pairs[h:]
        xs: list[list[float]] = []
        ys: list[int] = []
        for k in (0, 1):
            self._fit_pool_topics(halves[1 - k])
            sessions = build_sessions(halves[k], n_sessions // 2, seed + 11 + k)
            x, y = self.decision_data(sessions)
            xs += x
            ys += y
        from sklearn.model_selection import cross_val_predict

        # the threshold: best F1 of out-of-fold probabilities (in-sample ones flatter)
        probs = cross_val_predict(self._decision_model(), np.asarray(xs), np.asarray(ys), cv=5,
                                  method="predict_proba")[:, 1]
        self._fit_decision(xs, ys)
        best = max(
            (jump_scores([bool(v) for v in ys], list(probs >= t))["f1"], t)
            for t in np.arange(0.2, 0.91, 0.05)
        )
        self.config.decision_threshold = float(round(best[1], 2))
        self._fit_pool_topics(pools)
        return self

    def _fit_pool_topics(self, pools: dict[str, list[Pair]]) -> None:
        texts: list[str] = []
        labels: list[str] = []
        for name, pairs in pools.items():
            for q, a in pairs:
                texts += [q, a, f"{q}\n{a}"]
                labels += [name] * 3
        self.fit_topics(texts, labels)


class RuleDetector:
    """The plain rule: char 2-4-gram TF-IDF (fitted on the session's own turns) cosine between
    the new message and the last three turns; below 0.3 is a jump."""

    def __init__(self, threshold: float = 0.3, window: int = 3) -> None:
        self.threshold = threshold
        self.window = window

    def detect(self, turns: Sequence[tuple[str, str]], message: str) -> TopicVerdict:
        if not turns:
            return TopicVerdict(False, None, reason="first turn")
        from sklearn.feature_extraction.text import TfidfVectorizer

        recent = " ".join(f"{u} {a}" for u, a in turns[-self.window:])
        vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4))
        m = vec.fit_transform([recent, message])
        sim = _cos(m[1], m[0])
        return TopicVerdict(sim < self.threshold, sim, reason="rule")


@dataclass(slots=True)
class SemanticTemperature:
    """Sampling temperature driven by topic jumps: ``start`` (0.8) normally, ``jump`` (0.3)
    right after a jump, then ``+recovery`` per turn while the topic holds, back up to ``start``."""

    start: float = START_TEMPERATURE
    jump: float = JUMP_TEMPERATURE
    recovery: float = 0.1
    history: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 <= self.jump <= self.start <= 5.0:
            raise ConfigError("need 0 <= jump temperature <= start temperature <= 5")
        if self.recovery <= 0:
            raise ConfigError(f"recovery must be > 0, got {self.recovery}")

    def next(self, current: float, jumped: bool) -> float:
        """The temperature for this turn, given the session's current one."""
        if jumped:
            return self.jump
        return round(min(self.start, current + self.recovery), 6)


def jump_scores(truth: Sequence[bool], predicted: Sequence[bool]) -> dict[str, float]:
    """Precision, recall and F1 of predicted jumps against true boundaries."""
    tp = sum(1 for t, p in zip(truth, predicted, strict=True) if t and p)
    fp = sum(1 for t, p in zip(truth, predicted, strict=True) if p and not t)
    fn = sum(1 for t, p in zip(truth, predicted, strict=True) if t and not p)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "tp": tp, "fp": fp, "fn": fn}


DETECTOR_VERSION = 1


def default_detector(cache_dir: Path | None = None) -> TopicDetector:
    """The manager's default detector.

    With chatterbot-corpus installed: ``TopicDetector.train`` on all of its English topics,
    with the other languages' utterances added to the IDF background (so CJK n-grams have
    weights); trained once (about a minute) and cached as a pickle under
    ``suffixmem_home()/topic`` (keyed by this module's and scikit-learn's versions).
    Without the corpus: the threshold rule with unfitted IDF.
    """
    import pickle

    import sklearn

    from suffixmem.config import suffixmem_home

    folder = cache_dir or suffixmem_home() / "topic"
    path = folder / f"detector-v{DETECTOR_VERSION}-sklearn{sklearn.__version__}.pkl"
    if path.exists():
        try:
            with path.open("rb") as f:
                detector = pickle.load(f)
            if isinstance(detector, TopicDetector):
                return detector
        except Exception:  # a stale or truncated cache: train again
            pass
    try:
        from suffixmem.conversation.topic_corpus import available_languages, load_topics
    except ImportError:  # pragma: no cover
        return TopicDetector()
    try:
        pools = {name: [p for conv in convs for p in conv]
                 for name, convs in load_topics("english").items()}
    except ImportError:  # chatterbot-corpus is not installed
        return TopicDetector()
    background = [
        t for lang in available_languages() if lang != "english"
        for convs in load_topics(lang).values() for conv in convs for p in conv for t in p
    ]
    pools = {k: v for k, v in pools.items() if len(v) >= 4}
    detector = TopicDetector().train(pools, background=background)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            pickle.dump(detector, f)
        tmp.replace(path)  # atomic: readers never see half a file
    except OSError:
        pass
    return detector
