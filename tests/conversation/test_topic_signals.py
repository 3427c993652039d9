"""The signal model (a logistic decision over seven conversation features), the features the
detector computes for it, and a session's own semantic temperature range."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from suffixmem.conversation.temperature import SemanticTemperature, check_range, session_range
from suffixmem.conversation.topic import TopicDetector, TopicState, default_detector
from suffixmem.conversation.topic_signals import (
    DEFAULT_MODEL,
    FEATURES,
    GAIN_FEATURES,
    GAIN_MODEL,
    SignalModel,
)
from suffixmem.errors import ConfigError, InvalidRequestError


def test_fit_and_probability_match_scikit_learn() -> None:
    """The shipped form (rounded weights, our sigmoid) gives scikit-learn's probabilities."""
    from sklearn.linear_model import LogisticRegression

    rng = random.Random(0)
    x = [[rng.random() for _ in FEATURES] for _ in range(300)]
    y = [row[0] - row[2] + 0.3 * rng.random() < 0.2 for row in x]
    model = SignalModel.fit(x, y)
    ref = LogisticRegression(max_iter=1000).fit(np.asarray(x), np.asarray(y))
    for row in x[:20]:
        assert model.probability(row) == pytest.approx(ref.predict_proba([row])[0, 1], abs=2e-3)
    # the signs say what the data says: similarity keeps a topic, novelty leaves it
    assert model.weights[0] < 0 < model.weights[2]
    assert model.with_cutoff(0.3).cutoff == 0.3 and set(model.describe()) >= set(FEATURES)
    with pytest.raises(ConfigError):
        SignalModel((1.0,), 0.0)
    with pytest.raises(ConfigError):
        SignalModel(DEFAULT_MODEL.weights, 0.0, cutoff=1.0)
    with pytest.raises(ConfigError):
        SignalModel.fit(x, [True] * len(x))  # one class only: nothing to learn


def test_signals_are_what_they_say() -> None:
    d = default_detector()
    state = TopicState()
    assert d.signals(state, "anything") is None  # no topic yet
    d.add_turn(state, "zorblax quantum flux", "zorblax quantum flux", False)
    sim, x = d.signals(state, "zorblax quantum flux")  # type: ignore[misc]
    f = dict(zip(FEATURES, x, strict=True))
    assert f["novelty"] == 0.0  # every n-gram seen in the session
    assert f["sim"] == sim == d.similarity(state, "zorblax quantum flux")
    assert f["sim_drop"] == 0.0  # the topic has no turn to compare with yet
    assert f["question"] == 0.0 and f["follow_up"] == 0.0
    assert f["length"] == pytest.approx(math.log1p(len("zorblaxquantumflux")) / 5)
    assert f["rel_length"] == 0.0  # as long as the last user message
    _, x = d.signals(state, "Why mmmpf?")  # type: ignore[misc]
    f = dict(zip(FEATURES, x, strict=True))
    assert f["question"] == 1.0 and f["follow_up"] == 1.0 and f["novelty"] > 0.5
    # a session's second turn has no ratio: its opening message sets the subject up
    assert f["rel_length"] == 0.0
    d.add_turn(state, "zorblax quantum flux", "zorblax quantum flux", False)
    _, x = d.signals(state, "Why mmmpf?")  # type: ignore[misc]
    # 8 letters after 18: shorter than the last user message, so the ratio's log is negative
    assert dict(zip(FEATURES, x, strict=True))["rel_length"] == pytest.approx(math.log(9 / 19))
    # the ratio reads the last *user* message, not the reply: a long reply changes nothing
    d.add_turn(state, "Why mmmpf?", "because " * 40, False)
    _, x = d.signals(state, "zorblax quantum flux")  # type: ignore[misc]
    assert dict(zip(FEATURES, x, strict=True))["rel_length"] == pytest.approx(math.log(19 / 9))


@pytest.mark.parametrize(("opening", "detail"), [
    (("My laptop fan is loud all the time. What can I do?",
      "Check which processes use the CPU, clean the vents, and update the BIOS."),
     "I opened Task Manager and the top entries are Antimalware Service Executable at about 30 "
     "percent and Chrome with twenty tabs using most of the memory, and the fan spins up even "
     "when I'm only reading a web page."),
    (("Mein Sauerteig geht nicht richtig auf. Woran kann das liegen?",
      "Oft ist der Starter zu schwach oder die Küche zu kalt. Füttere ihn zweimal täglich und "
      "lass den Teig an einem warmen Ort gehen."),
     "Ich füttere ihn seit einer Woche jeden Morgen mit Roggenmehl und Wasser im Verhältnis "
     "eins zu eins, er blubbert auch, aber nach zwölf Stunden ist der Teig immer noch flach "
     "und klebrig."),
])
def test_a_second_message_that_fills_in_detail_is_no_jump(opening: tuple[str, str],
                                                          detail: str) -> None:
    """A session's second message, far longer than the opening one, stays on its subject:
    with the length ratio against the opening message (the model before 0390bf1) both read
    as jumps (P 0.51 and 0.29, cutoff 0.25)."""
    d = default_detector()
    verdict = d.detect([opening], detail)
    assert verdict.reason == "signals" and not verdict.jump
    _, x = d.signals(d.replay([opening]), detail)  # type: ignore[misc]
    assert dict(zip(FEATURES, x, strict=True))["rel_length"] == 0.0


def test_sim_drop_against_the_topics_own_turns() -> None:
    d = default_detector()
    state = d.replay([("How do I sort a list in Python?", "Use sorted(my_list).")])
    follow = "Can I sort a Python list in reverse?"
    expected = d.similarity(state, follow)
    v = d.observe_user(state, follow)
    d.add_turn(state, follow, "Yes: sorted(my_list, reverse=True).", v.jump)
    assert state.sims == [expected]  # remembered from observe_user, not recomputed differently
    msg = "What is the tallest mountain in Africa?"
    sim, x = d.signals(state, msg)  # type: ignore[misc]
    assert x[FEATURES.index("sim_drop")] == pytest.approx(expected - sim)
    d.add_turn(state, msg, "Kilimanjaro.", True)
    assert state.sims == []  # a jump opens a new topic


def test_signal_verdicts_use_the_model() -> None:
    always = SignalModel((0.0,) * len(FEATURES), 5.0)  # P(jump) ~ 0.993 for anything
    never = SignalModel((0.0,) * len(FEATURES), -5.0)
    base = default_detector()
    state = base.replay([("How do I sort a list in Python?", "Use sorted(my_list).")])
    msg = "Does sorting a Python list with sorted() copy the list?"
    v = TopicDetector(base.config, base.featurizer, always).observe_user(state, msg)
    assert v.jump and v.reason == "signals"
    assert v.probability == pytest.approx(1 / (1 + math.exp(-5.0)))
    assert not TopicDetector(base.config, base.featurizer, never).observe_user(state, msg).jump
    # the rules before the model still hold: too little content, shift markers
    assert TopicDetector(base.config, base.featurizer, always).observe_user(
        state, "ok?").reason == "too little content"
    assert TopicDetector(base.config, base.featurizer, never).observe_user(
        state, "By the way, how tall is Mount Everest?").jump


def test_a_context_gain_joins_the_signals_where_the_model_decides() -> None:
    """A detector with a gain asks it only for messages that reach the signal model, with the
    session's last turn, and the gain model weighs it; models and gains come in pairs."""
    asked: list[tuple[tuple[str, str], str]] = []

    def gain(last_turn: tuple[str, str], message: str) -> float:
        asked.append((last_turn, message))
        return values[message]

    values = {"Why does the soil need to dry first?": 3.0,
              "What is the tallest mountain in Europe?": -1.0}
    detector = default_detector(gain=gain)
    assert detector.model is GAIN_MODEL and GAIN_MODEL.features == GAIN_FEATURES
    state = detector.replay([("How often should I water basil?",
                              "When the top of the soil is dry.")])
    assert asked == []  # the first turn has no last turn to gain from
    verdicts = {m: detector.observe_user(state, m) for m in values}
    assert [m for _, m in asked] == list(values)
    assert {t for t, _ in asked} == {("How often should I water basil?",
                                      "When the top of the soil is dry.")}
    p = {m: v.probability for m, v in verdicts.items()}
    # the gain weighs against a jump: a follow-up the last turn explains is no jump
    assert GAIN_MODEL.weights[-1] < 0
    assert p["Why does the soil need to dry first?"] < p["What is the tallest mountain in Europe?"]
    # rules before the model never pay for the gain
    assert detector.observe_user(state, "ok").reason == "too little content"
    assert detector.observe_user(state, "By the way, is it raining?").reason == "shift marker"
    assert len(asked) == 2
    # a replayed history is re-detected without the gain (a cold session's first verdict
    # would otherwise pay one gain per stored turn); the new message still gets it
    asked.clear()
    values["Is the soil's dryness what matters most?"] = 2.0
    replayed = detector.detect([("How often should I water basil?",
                                 "When the top of the soil is dry."),
                                ("Why does the soil need to dry first?", "Roots rot.")],
                               "Is the soil's dryness what matters most?")
    assert [m for _, m in asked] == ["Is the soil's dryness what matters most?"]
    assert asked[0][0] == ("Why does the soil need to dry first?", "Roots rot.")
    assert replayed.reason == "signals"
    # signals() (the bench's features) carry it as the last feature
    found = detector.signals(state, "Why does the soil need to dry first?")
    assert found is not None and len(found[1]) == len(GAIN_FEATURES) and found[1][-1] == 3.0
    with pytest.raises(ConfigError, match="weighs context_gain but the detector was given none"):
        TopicDetector(None, detector.featurizer, GAIN_MODEL)
    with pytest.raises(ConfigError, match=r"no served-model signal but .* given context_gain"):
        TopicDetector(None, detector.featurizer, DEFAULT_MODEL, gain)
    with pytest.raises(ConfigError, match="features"):
        SignalModel((0.0,) * 3, 0.0, features=("a", "b", "c"))
    # fitting on rows with the gain gives a gain model
    rng = random.Random(1)
    x = [[rng.random() for _ in GAIN_FEATURES] for _ in range(200)]
    fitted = SignalModel.fit(x, [row[-1] < 0.4 for row in x])
    assert fitted.features == GAIN_FEATURES and fitted.uses_gain and fitted.weights[-1] < 0


def test_session_range() -> None:
    t = SemanticTemperature.for_model("smollm2-135m-instruct")  # hot 0.2, cold 0, 4 turns
    s = t.with_range(hot=0.6, cold=0.2)
    assert (s.start, s.jump, s.recovery, s.recovery_turns()) == (0.6, 0.2, 0.1, 4)
    assert t.with_range() is t and t.with_range(hot=0.7).jump == 0.0
    for bad, field in (({"hot": 0.1, "cold": 0.5}, "temperature_cold"),
                       ({"hot": 9.0}, "temperature_hot"), ({"cold": "x"}, "temperature_cold"),
                       ({"hot": float("nan")}, "temperature_hot"),
                       ({"cold": 0.3}, "temperature_cold")):
        with pytest.raises(InvalidRequestError, match=field):
            t.with_range(**bad)  # type: ignore[arg-type]
    assert check_range(t, None, None) == (0.2, 0.0)
    # a stored range the manager's current one makes inconsistent never fails a turn
    assert (t.for_session(None, 0.5).start, t.for_session(None, 0.5).jump) == (0.2, 0.2)
    assert t.for_session(None, None) is t
    assert s.clamp(0.0) == 0.2 and s.clamp(0.9) == 0.6 and s.clamp(0.3) == 0.3

    class Row:
        temperature_hot, temperature_cold = 0.6, None

    assert session_range(Row()) == (0.6, None) and session_range(None) == (None, None)


def test_incremental_verdicts_equal_a_replay() -> None:
    """What the manager's cache does (observe, then add the turn) gives the same verdicts and
    probabilities as replaying the history for every turn."""
    d = default_detector()
    turns = [("How do I make a sourdough starter?", "Mix flour and water, feed it daily."),
             ("What flour works best?", "Whole wheat or rye."),
             ("why?", "They carry more wild yeast."),
             ("Can you recommend a laptop for programming?", "A ThinkPad or a MacBook Air."),
             ("Is 16 GB of memory really necessary?", "It helps with containers."),
             ("顺便问一下，今天北京的天气怎么样", "今天北京晴天。")]
    state = TopicState()
    for i, (user, reply) in enumerate(turns):
        v = d.observe_user(state, user)
        again = d.detect(turns[:i], user)
        assert (v.jump, v.similarity, v.probability, v.reason) == (
            again.jump, again.similarity, again.probability, again.reason)
        d.add_turn(state, user, reply, v.jump)
