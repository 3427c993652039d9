"""The manager's per-session topic state: one ``observe_user`` per turn, a replay only when the
history is not the one the cached state describes; verdicts equal a full replay's."""

from __future__ import annotations

from typing import Any

from suffixmem.conversation.layout import Prompt
from suffixmem.conversation.topic import Featurizer, TopicConfig, TopicDetector, TopicVerdict
from suffixmem.conversation.topic_cache import TopicCache
from suffixmem.conversation.turns import Plan, TurnSpec, turn_pairs
from suffixmem.engine.protocol import Message, SamplingParams

TURNS = [
    ("How do I sort a list of numbers in Python?", "Use sorted(numbers)."),
    ("How do I sort a list of strings in Python by length?", "sorted(words, key=len)."),
    ("Wie backe ich einen Schokoladenkuchen mit Kirschen?", "Mit Mehl, Zucker und Kirschen."),
    ("Wie lange backe ich den Schokoladenkuchen?", "Etwa 40 Minuten."),
]


class Counting(TopicDetector):
    replays = 0

    def replay(self, pairs: Any) -> Any:
        Counting.replays += 1
        return super().replay(pairs)


def _detector() -> Counting:
    from suffixmem.conversation.topic_corpus import load_topics

    background = [t for convs in load_topics("english").values() for c in convs for p in c
                  for t in p]
    return Counting(TopicConfig(threshold=0.1), Featurizer().fit(background))


def _plan(history: list[Message], user: str, verdict: TopicVerdict, fresh: bool) -> Plan:
    spec = TurnSpec(key="s", session_id="s", kind="appended", system_prompt=None,
                    history=list(history), tail=user, context=(),
                    to_store=[Message("user", user)], user_text=user,
                    session_temperature=0.8, window_start=0, stored_count=len(history),
                    version=0, sampling={}, fresh_topic=fresh)
    return Plan(spec, Prompt((1,), (), (), 0, 0, 10), verdict, 0.8, SamplingParams())


def test_one_observation_per_turn_and_the_same_verdicts_as_a_replay() -> None:
    det = _detector()
    cache = TopicCache(True, det, lambda: det)
    history: list[Message] = []
    cached_verdicts = []
    Counting.replays = 0
    for user, reply in TURNS:
        v = cache.verdict("s", history, user, fresh=False)
        cache.advance(_plan(history, user, v, False), reply)
        cached_verdicts.append(v)
        history += [Message("user", user), Message("assistant", reply)]
    assert Counting.replays == 1  # only the first turn (empty history) replays
    # a fresh replay of each prefix gives the same verdicts
    history = []
    for (user, reply), v in zip(TURNS, cached_verdicts, strict=True):
        fresh = cache.verdict("other", history, user, fresh=True)
        assert (fresh.jump, fresh.similarity) == (v.jump, v.similarity)
        history += [Message("user", user), Message("assistant", reply)]
    assert [v.jump for v in cached_verdicts] == [False, False, True, False]
    # a history the cached state does not describe (another writer) is replayed
    n = Counting.replays
    cache.verdict("s", history[:2], "How do I reverse a list in Python?", fresh=False)
    assert Counting.replays == n + 1
    off = TopicCache(False, det, lambda: det)
    assert off.verdict("s", history, "anything", fresh=False).similarity is None


def test_states_are_bounded_least_recently_used_first(monkeypatch: Any) -> None:
    """A long-running server keeps at most ``MAX_STATES`` sessions' states (it kept one per
    session it ever served); a dropped one is replayed when its session returns."""
    import suffixmem.conversation.topic_cache as topic_cache

    monkeypatch.setattr(topic_cache, "MAX_STATES", 2)
    det = _detector()
    cache = TopicCache(True, det, lambda: det)
    user, reply = TURNS[0]
    for key in ("a", "b", "a", "c"):  # "a" used again before "c": "b" is the oldest
        cache.verdict(key, [], user, fresh=False)
    assert list(cache._states) == ["a", "c"]
    Counting.replays = 0
    history = [Message("user", user), Message("assistant", reply)]
    first = cache.verdict("b", history, TURNS[1][0], fresh=False)  # replayed, same verdict
    assert Counting.replays == 1 and first == det.detect(turn_pairs(history), TURNS[1][0])


def test_a_resent_stateless_conversation_advances_instead_of_replaying() -> None:
    """Stateless (the whole conversation resent each call, LangChain's default without a
    session): each call advances the last call's state by the exchange since, with the
    verdicts of a full replay; a conversation that is not that one plus an exchange (an
    earlier message edited, another conversation under the same key) is replayed."""
    det = _detector()
    cache = TopicCache(True, det, lambda: det)
    history: list[Message] = []
    Counting.replays = 0
    for user, reply in TURNS:
        got = cache.verdict("anon", history, user, fresh=True, stateless=True)
        assert got == det.detect(turn_pairs(history), user)
        Counting.replays -= 1  # detect's own replay
        history += [Message("user", user), Message("assistant", reply)]
    assert Counting.replays == 1  # the first call only
    # the reply after the judged message is whatever the client resends: still an advance
    told = [*history[:-1], Message("assistant", "Something else entirely.")]
    cache.verdict("anon", told, "And the icing?", fresh=True, stateless=True)
    assert Counting.replays == 1
    # an earlier message edited: not the conversation the state describes
    edited = [Message("user", "How do I sort a dict?"), *told[1:],
              Message("user", "And the icing?"), Message("assistant", "Chocolate.")]
    cache.verdict("anon", edited, "How long does it set?", fresh=True, stateless=True)
    assert Counting.replays == 2
