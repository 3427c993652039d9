"""Topic jumps: English and languages without spaces, learned detector on held-out sessions,
semantic temperature."""

from __future__ import annotations

from pathlib import Path

import pytest

from suffixmem.bench.topics import evaluate
from suffixmem.conversation.topic import (
    Featurizer,
    RuleDetector,
    SemanticTemperature,
    TopicConfig,
    TopicDetector,
    TopicState,
    content_chars,
    default_detector,
    jump_scores,
)
from suffixmem.conversation.topic_corpus import build_sessions, load_topics, split_topics
from suffixmem.errors import ConfigError


def _background(language: str) -> list[str]:
    return [t for convs in load_topics(language).values() for c in convs for p in c for t in p]


def _verdicts(detector: TopicDetector, turns: list[tuple[str, str]]) -> list[bool]:
    state = TopicState()
    out = []
    for user, assistant in turns:
        v = detector.observe_user(state, user)
        out.append(v.jump)
        detector.add_turn(state, user, assistant, v.jump)
    return out


def test_english_threshold_detector() -> None:
    d = TopicDetector(TopicConfig(threshold=0.1), Featurizer().fit(_background("english")))
    turns = [
        ("How do I sort a list in Python?", "Use sorted(my_list) or my_list.sort()."),
        ("Can I sort the Python list in reverse order?", "Yes: sorted(my_list, reverse=True)."),
        ("What is your favourite football team?", "I do not follow football."),
        ("Who won the football world cup in 2014?", "Germany won the 2014 world cup."),
    ]
    assert _verdicts(d, turns) == [False, False, True, False]


@pytest.mark.parametrize("language,turns,expected", [
    ("japanese", [
        ("寿司の作り方を教えてください", "酢飯を作り、新鮮な魚をのせます。"),
        ("寿司に合う魚は何ですか", "マグロやサーモンが寿司によく合います。"),
        ("明日の東京の天気はどうですか", "晴れの予報です。"),
    ], [False, False, True]),
    ("chinese", [
        ("怎么用Python给列表排序", "可以用sorted函数给列表排序。"),
        ("Python列表可以倒序排序吗", "可以，sorted(列表, reverse=True)。"),
        ("今天北京的天气怎么样", "今天北京晴天。"),
    ], [False, False, True]),
])
def test_languages_without_spaces(language: str, turns: list[tuple[str, str]],
                                  expected: list[bool]) -> None:
    feat = Featurizer().fit(_background(language))
    d = TopicDetector(TopicConfig(threshold=0.1), feat)
    assert _verdicts(d, turns) == expected
    # why character n-grams: word tokens of unspaced text are whole sentences, sharing nothing
    _, w1 = feat.transform([turns[0][0]])
    _, w2 = feat.transform([turns[1][0]])
    c1, _ = feat.transform([turns[0][0]])
    c2, _ = feat.transform([turns[1][0]])
    assert w1.multiply(w2).sum() == 0 and c1.multiply(c2).sum() > 0


def test_min_content_is_never_a_jump() -> None:
    d = TopicDetector(TopicConfig(threshold=0.99))
    state = TopicState()
    d.add_turn(state, "Tell me about volcanoes", "They erupt.", False)
    assert content_chars("ok?") < d.config.min_content
    v = d.observe_user(state, "ok?")
    assert not v.jump and v.reason == "too little content"
    assert d.observe_user(state, "Describe the history of the Roman empire").jump
    assert content_chars("天气") == 6  # a CJK character carries about a word


@pytest.mark.slow
def test_learned_detector_beats_the_rule_on_held_out_sessions() -> None:
    tune, test = split_topics(load_topics("english"), seed=3)
    detector = TopicDetector().train(tune, n_sessions=160, seed=3)
    scored = build_sessions(test, 60, seed=4)
    ours = evaluate(detector, scored)
    rule = evaluate(RuleDetector(), scored)
    assert ours["f1"] >= 0.6
    assert ours["f1"] > rule["f1"] + 0.15
    assert ours["precision"] > rule["precision"]


@pytest.mark.slow
def test_default_detector_is_cached(tmp_path: Path) -> None:
    d1 = default_detector(tmp_path)
    files = list(tmp_path.glob("detector-*.pkl"))
    assert len(files) == 1 and d1.decision is not None and d1.topic_model is not None
    d2 = default_detector(tmp_path)
    turns = [("What is artificial intelligence?", "Machines that think."),
             ("Tell me a joke about cats", "Why did the cat sit on the computer?")]
    assert [d1.detect(turns[:1], turns[1][0]).probability] == [
        d2.detect(turns[:1], turns[1][0]).probability]


def test_semantic_temperature() -> None:
    t = SemanticTemperature()
    temps = [0.8]
    for jumped in (False, True, False, False, False, False, False, False):
        temps.append(t.next(temps[-1], jumped))
    assert temps == [0.8, 0.8, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.8]
    with pytest.raises(ConfigError):
        SemanticTemperature(start=0.2, jump=0.3)


def test_jump_scores() -> None:
    s = jump_scores([True, False, True, False], [True, True, False, False])
    assert (s["precision"], s["recall"], s["f1"]) == (0.5, 0.5, 0.5)
    assert jump_scores([False], [False])["f1"] == 0.0


def test_fast_posteriors_equal_sklearn() -> None:
    from scipy import sparse

    tune, _ = split_topics(load_topics("english"), seed=0)
    d = TopicDetector()
    d.featurizer.fit([t for pairs in tune.values() for p in pairs for t in p])
    d._fit_pool_topics({k: v[:20] for k, v in tune.items()})
    c, w = d.featurizer.transform(["what is artificial intelligence", "tell me a joke"])
    x = sparse.hstack([c, w]).tocsr()
    import numpy as np

    np.testing.assert_allclose(d.posteriors(x), d.topic_model.predict_proba(x), rtol=1e-10)
