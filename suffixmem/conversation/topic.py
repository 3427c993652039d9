"""Online topic-jump detection: TF-IDF similarity plus the signals a conversation carries.

A *topic jump* is a user turn that leaves the subject of the conversation so far. The detector
knows no list of topics and learns nothing at run time beyond the session's own statistics:

1. **TF-IDF over n-grams.** Character 2-4-grams inside words (every script works, including
   Chinese and Japanese, where each CJK character also counts on its own) and word unigrams
   where words exist (ignored for text written without spaces, whose "words" are whole
   clauses). Weights: sublinear TF times an IDF from document frequencies of a small background
   corpus (package data, ``topic_idf.npz``; see ``topic_corpus``) *plus* the session's own turns,
   so a word the session keeps repeating stops looking rare.
2. **Several references.** The new message is compared with a decayed centroid of the current
   topic's turns (user and assistant; reset at each jump), with the topic's opening turn (which
   usually names the subject that later turns only imply) and with its latest turns; the
   closest counts. Shorter messages need proportionally less similarity to continue.
3. **Conversation signals.** A message that opens with a continuation cue or, when short,
   refers back with a pronoun ("what about its ...", "und warum?", "那第二个呢") reads as a
   follow-up; an explicit shift marker ("by the way", "unrelated question", "übrigens",
   "顺便问一下", ...) is a jump unless the message is plainly about the same subject or adds
   to it ("btw does that work on a couch too"), and so is a message that says it returns to
   an earlier subject ("back to the python thing", "回到红烧肉"). Fewer than
   ``min_content`` letters ("ok", "why?") is never a jump.
4. **One decision over all signals** (``topic_signals``): the similarity, its drop below the
   similarities the topic's own turns had (a per-session threshold), the share of the message
   on n-grams the session never used, its length, follow-up cue and question form, and its
   length relative to the last user message (a new subject tends to come longer than the
   message before it, a follow-up shorter) go through a logistic model of seven weights,
   fitted by ``suffixmem bench topics`` on its tuning data and shipped in code. A detector
   built without a model (``TopicDetector(config)``) uses the plain rule instead: similarity
   below ``threshold`` (scaled down for short messages) is a jump.
5. **Optionally, the served model's own signal**, an eighth feature: its hidden states
   (``default_detector(gain=HiddenSimilarity(...))``, ``suffixmem.hidden_similarity``: the
   middle-layer cosine with the last user message, one forward of 12 layers; ``HIDDEN_MODEL``)
   or its context gain (``gain=ContextGain(...)``, ``suffixmem.context_gain``: how much the last
   turn makes the message more likely, two forwards of the model; ``GAIN_MODEL``). The gain
   alone ranks the conversation sets' jumps at ROC AUC ~0.9 (an elliptical follow-up shares no
   n-gram with its topic); the hidden cosine alone is at chance there, a help only beside the rest.

Stable API: ``default_detector()`` returns a ``TopicDetector``; ``detect(turns, message)`` gives
a ``TopicVerdict`` with ``.jump``. The incremental form the manager uses:
``state = detector.replay(pairs)``, ``detector.observe_user(state, message)``,
``detector.add_turn(state, user, reply, jump)``. Pure numpy/scikit-learn; no torch (a served
model's signal is a callable passed in).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# the manager imports these from here today; their home is temperature.py
from suffixmem.conversation.temperature import (  # noqa: F401
    JUMP_TEMPERATURE,
    START_TEMPERATURE,
    SemanticTemperature,
)
from suffixmem.conversation.topic_cues import (
    adds_to_topic,
    continues_topic,
    has_shift_marker,
    is_acknowledgement,
    returns_to_topic,
)
from suffixmem.conversation.topic_signals import (
    DEFAULT_MODEL,
    GAIN_MODEL,
    HIDDEN_MODEL,
    SignalModel,
)
from suffixmem.conversation.topic_text import content_chars, is_question
from suffixmem.conversation.topic_vector import (  # noqa: F401  (the API's names, re-exported)
    EMPTY,
    N_FEATURES,
    Featurizer,
    SparseRow,
)
from suffixmem.errors import ConfigError


@dataclass(slots=True, frozen=True)
class TopicVerdict:
    """The detector's answer for one user turn. ``similarity``: the TF-IDF similarity with the
    topic so far, in [0, 1] (``None`` on a session's first turn); ``probability``: the signal
    model's P(jump) when it decided; ``reason``: which rule decided ("first turn", "signals",
    "threshold", "follow-up", "reaction", "shift marker", "shift marker, adding", "return",
    "too little content")."""

    jump: bool
    similarity: float | None
    probability: float | None = None
    reason: str = ""


@dataclass(slots=True)
class TopicConfig:
    """``threshold``: similarity below which a message of ``full_content`` letters or more is a
    jump; shorter messages need proportionally less similarity (a few words can hardly name a
    new subject, and mostly lean on the previous turn). ``marker_ceiling``: a message with a
    shift marker is a jump unless its similarity is at least this; ``follow_up_factor``: the
    threshold is multiplied by it for a follow-up (a message that opens with a continuation
    cue or refers back with a pronoun). ``decay``: weight of the old
    centroid when a turn is added. ``min_content``: letters below which a message is never a
    jump; ``short_content``: letters below which a message that asks nothing is a reaction
    ("thanks", "interesting"), never a jump. ``char_weight``: share of the character
    similarity (the rest is the word similarity) for text with words. ``topic_turns``: recent
    turns of the current topic kept besides its opening turn (each is a reference)."""

    threshold: float = 0.12  # the bench's best on English tuning topics (seed 0)
    follow_up_factor: float = 0.3
    marker_ceiling: float = 0.35
    decay: float = 0.8
    min_content: int = 6
    # off by default: on the tuning data (chatterbot, whose topics often open with short
    # statements) treating short statements as reactions cost 0.1 F1
    short_content: int = 0
    full_content: int = 40
    char_weight: float = 0.5
    topic_turns: int = 6

    def __post_init__(self) -> None:
        for name in ("threshold", "follow_up_factor", "marker_ceiling", "char_weight"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {v}")
        if not 0.0 <= self.decay < 1.0:
            raise ConfigError(f"decay must be in [0, 1), got {self.decay}")
        if min(self.min_content, self.short_content, self.full_content, self.topic_turns) < 0:
            raise ConfigError("min_content, short_content, full_content and topic_turns "
                              "must be >= 0")


@dataclass(slots=True)
class TopicState:
    """The running topic of one session: decayed centroids (char, word) of the current topic,
    the last turn's vectors, and the session's document frequencies (feature -> turns)."""

    char: SparseRow | None = None
    word: SparseRow | None = None
    last_char: SparseRow | None = None
    last_word: SparseRow | None = None
    turns: int = 0
    # the current topic's first turn (it names it)
    opening: tuple[SparseRow, SparseRow] | None = None
    recent: list[tuple[SparseRow, SparseRow]] = field(default_factory=list)  # its latest turns
    sims: list[float] = field(default_factory=list)  # its turns' similarities on arrival
    observed: tuple[str, float] | None = None  # the last observed message and its similarity
    char_df: SparseRow = EMPTY  # per feature, the session's turns that used it
    word_df: SparseRow = EMPTY
    last_turn: tuple[str, str] | None = None  # (user, reply): rel_length, served signals


def _dot(a: SparseRow | None, b: SparseRow | None) -> float:
    """Dot product of two rows (cosine when both are l2-normed); 0 when either is missing."""
    if a is None or b is None:
        return 0.0
    return a.dot(b)


class TopicDetector:
    """Centroid-and-last-turn TF-IDF detector with conversation signals (module docstring).

    Use: ``state = TopicState()``; per turn ``verdict = detector.observe_user(state, text)``,
    then once the turn is done ``detector.add_turn(state, user, assistant, verdict.jump)``.
    ``detect(turns, message)`` does the same statelessly. Thread-safe for distinct states: the
    detector itself is read-only after construction.
    """

    def __init__(self, config: TopicConfig | None = None,
                 featurizer: Featurizer | None = None,
                 model: SignalModel | None = None,
                 gain: Callable[[tuple[str, str], str], float] | None = None) -> None:
        if model is not None and model.extra != signal_name(gain):
            raise ConfigError(f"the signal model weighs {model.extra or 'no served-model signal'}"
                              f" but the detector was given {signal_name(gain) or 'none'} "
                              "(default_detector(gain=...) pairs them)")
        self.config = config or TopicConfig()
        self.featurizer = featurizer or Featurizer()
        self.model = model
        self.gain = gain

    def _vectors(self, state: TopicState, text: str) -> tuple[SparseRow, SparseRow]:
        return self._weighed(state, *self.featurizer.counts(text))

    def _weighed(self, state: TopicState, c: SparseRow, w: SparseRow
                 ) -> tuple[SparseRow, SparseRow]:
        f = self.featurizer
        return (f.weigh(c, f.char_df, state.char_df, state.turns),
                f.weigh(w, f.word_df, state.word_df, state.turns))

    def similarity(self, state: TopicState, message: str) -> float | None:
        """How close ``message`` is to the topic in ``state`` (None before any turn): the larger
        of its similarity to the centroid and to the last turn, each a blend of the character
        and word cosines (character only when either side has no words)."""
        if state.turns == 0 or state.char is None:
            return None
        return self._similarity(state, *self._vectors(state, message))

    def _similarity(self, state: TopicState, c: SparseRow, w: SparseRow) -> float:
        cw = self.config.char_weight

        def blend(ref_c: SparseRow | None, ref_w: SparseRow | None) -> float:
            sc = _dot(c, ref_c)
            if w.nnz == 0 or ref_w is None or ref_w.nnz == 0:
                return sc
            return cw * sc + (1 - cw) * _dot(w, ref_w)

        # the centroid is a decayed sum of unit vectors: renormalise before the cosine
        best = blend(_unit(state.char), _unit(state.word))
        refs = [*state.recent, *([state.opening] if state.opening is not None else [])]
        for ref_c, ref_w in refs:
            best = max(best, blend(ref_c, ref_w))
        return max(0.0, min(1.0, best))

    def signals(self, state: TopicState, message: str) -> tuple[float, list[float]] | None:
        """(similarity, feature vector ordered as the signal model's ``features``) of
        ``message`` against the topic in ``state``; None before any turn."""
        found = self._signals(state, message, content_chars(message))
        if found is not None and self.gain is not None:
            found[1].append(self._gain(state, message))
        return found

    def _gain(self, state: TopicState, message: str) -> float:
        assert self.gain is not None
        return self.gain(state.last_turn, message) if state.last_turn is not None else 0.0

    def _signals(self, state: TopicState, message: str, letters: int
                 ) -> tuple[float, list[float]] | None:
        """``signals`` without the context gain (the costly one: computed only for messages
        that reach the signal model); ``letters`` is ``content_chars(message)``, which
        ``observe_user`` needs too."""
        if state.turns == 0 or state.char is None:
            return None
        c, w = self._vectors(state, message)
        sim = self._similarity(state, c, w)
        # squared weights of an l2-normed row sum to 1: this is the share on unseen n-grams
        unseen = c.data[state.char_df.values_at(c.indices) == 0].tolist() if c.nnz else []
        novelty = float(sum(v * v for v in unseen))
        drop = sum(state.sims) / len(state.sims) - sim if state.sims else 0.0
        # no ratio (0) against the session's opening message: it sets the subject up, and a
        # second message that fills in detail (a pasted error, the user's situation) runs far
        # longer than it without leaving it (``topic_signals``: the tuning F1 chose this)
        ratio = state.last_turn is not None and state.turns > 1
        before = content_chars(state.last_turn[0]) if ratio else letters
        return sim, [sim, drop, novelty, math.log1p(letters) / 5.0,
                     float(continues_topic(message)), float(is_question(message)),
                     math.log((1 + letters) / (1 + before))]

    def _cue_verdict(self, message: str, content: int, sim: float) -> TopicVerdict | None:
        """The verdict of the cues that decide before the signal model (too little content, a
        return to an earlier subject, a shift marker, an acknowledgement); None when none
        does. ``content`` is ``content_chars(message)``."""
        cfg = self.config
        if content < cfg.min_content:
            return TopicVerdict(False, sim, reason="too little content")
        if returns_to_topic(message):  # leaves the current subject for an earlier one
            return TopicVerdict(sim < cfg.marker_ceiling, sim, reason="return")
        if has_shift_marker(message):
            if adds_to_topic(message):  # "by the way, does that work on a couch too"
                return TopicVerdict(False, sim, reason="shift marker, adding")
            return TopicVerdict(sim < cfg.marker_ceiling, sim, reason="shift marker")
        if is_acknowledgement(message):
            return TopicVerdict(False, sim, reason="reaction")
        return None

    def decided_by_cues(self, message: str) -> bool:
        """Whether a cue, not the signal model, decides ``message`` (after a session's first
        turn): the model is fitted on the other turns only (``bench topics``)."""
        return self._cue_verdict(message, content_chars(message), 0.0) is not None

    def observe_user(self, state: TopicState, message: str) -> TopicVerdict:
        """Is ``message`` a jump from the topic in ``state``? (``state`` only remembers the
        message's similarity, so that ``add_turn`` need not compute it again.)"""
        content = content_chars(message)
        found = self._signals(state, message, content) if self.model is not None else None
        sim = found[0] if found is not None else self.similarity(state, message)
        if sim is None:
            return TopicVerdict(False, None, reason="first turn")
        state.observed = (message, sim)
        cued = self._cue_verdict(message, content, sim)
        if cued is not None:
            return cued
        cfg = self.config
        if found is not None and self.model is not None:
            if self.gain is not None:
                found[1].append(self._gain(state, message))
            p = self.model.probability(found[1])
            return TopicVerdict(p >= self.model.cutoff, sim, p, reason="signals")
        if content < cfg.short_content and not is_question(message):
            return TopicVerdict(False, sim, reason="reaction")
        scale = min(1.0, content / cfg.full_content) if cfg.full_content else 1.0
        if continues_topic(message):
            return TopicVerdict(sim < cfg.threshold * scale * cfg.follow_up_factor, sim,
                                reason="follow-up")
        return TopicVerdict(sim < cfg.threshold * scale, sim, reason="threshold")

    def add_turn(self, state: TopicState, user: str, assistant: str, jump: bool,
                 prime: bool = True) -> None:
        """Fold a finished turn into the topic (a jump starts a new topic from this turn).
        ``prime``: let the served-model signal prepare what the next verdict needs of this
        turn (``_prime``)."""
        if state.observed is not None and state.observed[0] == user:
            sim: float | None = state.observed[1]
        else:
            sim = self.similarity(state, user)
        state.observed = None
        raw_c, raw_w = self.featurizer.counts(f"{user}\n{assistant}")  # hashed once
        c, w = self._weighed(state, raw_c, raw_w)  # weigh copies: the raw counts stay
        if jump or state.char is None:
            state.char, state.word = c, w
            state.opening, state.recent, state.sims = (c, w), [], []
        else:
            d = self.config.decay
            state.char = state.char.scaled(d).plus(c.scaled(1 - d))
            state.word = state.word.scaled(d).plus(w.scaled(1 - d))
            if sim is not None:
                state.sims = [*state.sims, sim][-max(1, self.config.topic_turns):]
        state.last_char, state.last_word = c, w
        state.recent = [*state.recent, (c, w)][-self.config.topic_turns:] \
            if self.config.topic_turns else []
        state.last_turn = (user, assistant)
        state.char_df = state.char_df.plus(SparseRow(raw_c.indices, np.ones(raw_c.nnz)))
        state.word_df = state.word_df.plus(SparseRow(raw_w.indices, np.ones(raw_w.nnz)))
        state.turns += 1
        if prime:
            self._prime(user)

    def _prime(self, user: str) -> None:
        """Compute now, after the reply, what the next verdict's signal needs of this turn's
        message, where the signal can (``HiddenSimilarity.prime``: its vector, unless
        remembered). A message decided without the signal (the first, or one a cue decided)
        would otherwise cost the next verdict a second forward."""
        prime = getattr(self.gain, "prime", None)
        if prime is not None:
            prime(user)

    def replay(self, turns: Sequence[tuple[str, str]]) -> TopicState:
        """The state after ``turns`` (user, assistant), re-detecting their jumps. With a
        context gain the past turns are re-detected without it (``DEFAULT_MODEL``'s seven
        signals): their verdicts only shape the state, and a gain per stored turn (two
        forwards of the model each) would make a cold session's first verdict take seconds."""
        judge = self
        if self.gain is not None:
            judge = TopicDetector(self.config, self.featurizer,
                                  DEFAULT_MODEL if self.model is not None else None)
        state = TopicState()
        for user, assistant in turns:
            verdict = judge.observe_user(state, user)
            self.add_turn(state, user, assistant, verdict.jump, prime=False)
        if turns:  # only the last turn's message is compared with the next one
            self._prime(turns[-1][0])
        return state

    def detect(self, turns: Sequence[tuple[str, str]], message: str) -> TopicVerdict:
        """The verdict for ``message`` after the (user, assistant) ``turns``."""
        return self.observe_user(self.replay(turns), message)


def _unit(row: SparseRow | None) -> SparseRow | None:
    return None if row is None else row.unit()


@functools.lru_cache(maxsize=1)
def _background() -> Featurizer:
    from suffixmem.conversation.topic_corpus import load_background

    char_df, word_df, docs = load_background()
    return Featurizer(char_df, word_df, docs)


def default_detector(config: TopicConfig | None = None,
                     model: SignalModel | None = DEFAULT_MODEL,
                     gain: Callable[[tuple[str, str], str], float] | None = None
                     ) -> TopicDetector:
    """The manager's detector: default ``TopicConfig``, the shipped background IDF (read from
    package data in well under a second; nothing is trained) and the shipped signal model
    (``model=None``: the plain threshold rule). With ``gain`` (a ``ContextGain``: the served
    model's opinion, opt-in and costly, ``suffixmem.context_gain``; or a ``HiddenSimilarity``,
    its hidden states, opt-in, ``suffixmem.hidden_similarity``) the shipped model is the one
    fitted with it, ``GAIN_MODEL`` or ``HIDDEN_MODEL``. The background is shared between detectors
    (read-only)."""
    if gain is not None and model is DEFAULT_MODEL:
        model = GAIN_MODEL if signal_name(gain) == "context_gain" else HIDDEN_MODEL
    return TopicDetector(config, _background(), model, gain)


def signal_name(gain: Callable[[tuple[str, str], str], float] | None) -> str | None:
    """The signal model feature ``gain`` fills: its ``feature`` attribute (``HiddenSimilarity``
    says ``hidden_sim``), ``context_gain`` for any other callable, None without one."""
    return None if gain is None else getattr(gain, "feature", "context_gain")
