"""``complete`` (a framework resending the whole conversation) is the same turn as ``chat``:
same prompt tokens, cached tokens, stored token ids, topic verdicts and temperatures, on the
real model with both engines; plus the other reconciliations (rewritten, stateless, schema)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from suffixmem.conversation.manager import ConversationManager, ManagerConfig
from suffixmem.conversation.topic import Featurizer, TopicConfig, TopicDetector
from suffixmem.engine.protocol import Message

from .recording import Recorder

pytestmark = [pytest.mark.slow]

SYSTEM = "You are a helpful assistant."
TURNS = [
    "How do I sort a list of numbers in Python?",
    "How do I sort a list of strings in Python by length?",
    "Wie backe ich einen Schokoladenkuchen mit Kirschen?",
]
SAMPLING = {"max_tokens": 8, "seed": 0}  # temperature: the session's semantic temperature


def _detector() -> TopicDetector:
    from suffixmem.conversation.topic_corpus import load_topics

    background = [t for convs in load_topics("english").values() for c in convs for p in c
                  for t in p]
    return TopicDetector(TopicConfig(threshold=0.1), Featurizer().fit(background))


@pytest.fixture(scope="module", params=["vllm", "torch"])
def engine(request: pytest.FixtureRequest) -> Iterator[Recorder]:
    if request.param == "vllm":
        yield Recorder(request.getfixturevalue("vllm_engine"))
        return
    from suffixmem.engine import create_engine

    request.getfixturevalue("model_path")
    eng = create_engine("torch", max_model_len=2048, kv_cache_gib=0.25)
    yield Recorder(eng)
    eng.close()


@pytest.fixture
def manager(engine: Recorder, tmp_path: Path) -> Iterator[ConversationManager]:
    mgr = ConversationManager(engine, f"sqlite:///{tmp_path / 'c.db'}", ManagerConfig(
        system_prompt=SYSTEM, topic_detector=_detector()))
    yield mgr
    mgr.close()


def test_complete_turn_by_turn_equals_chat(manager: ConversationManager, engine: Recorder,
                                           request: pytest.FixtureRequest) -> None:
    tag = request.node.callspec.id
    chat_sid, comp_sid = f"chat-{tag}", f"complete-{tag}"
    manager.open_session(chat_sid)
    via_chat = []
    for text in TURNS:
        via_chat.append((manager.chat(chat_sid, text, **SAMPLING), engine.requests[-1]))
    sent: list[Message] = [Message("system", SYSTEM)]
    via_complete = []
    for text in TURNS:
        sent.append(Message("user", text))
        t = manager.complete(comp_sid, sent, **SAMPLING)
        via_complete.append((t, engine.requests[-1]))
        sent.append(Message("assistant", t.text))  # plain text, as frameworks send it
    assert [t.history for t, _ in via_chat] == ["appended"] * 3
    assert [t.history for t, _ in via_complete] == ["new", "appended", "appended"]
    for (a, ra), (b, rb) in zip(via_chat, via_complete, strict=True):
        assert tuple(ra.token_ids) == tuple(rb.token_ids)
        assert (a.prompt_tokens, a.cached_tokens) == (b.prompt_tokens, b.cached_tokens)
        assert (a.topic_jump, a.temperature, a.similarity) == (
            b.topic_jump, b.temperature, b.similarity)
        assert a.token_ids == b.token_ids and a.text == b.text
        assert a.manager_overhead_ms > 0 and b.manager_overhead_ms > 0
        assert a.usage()["total_tokens"] == a.prompt_tokens + len(a.token_ids)
    assert via_chat[2][0].topic_jump  # the conversation does exercise a jump
    assert via_chat[1][0].cached_tokens > 0
    assert manager.history(chat_sid) == manager.history(comp_sid)  # ids included
    assert manager.get_session(comp_sid).temperature == manager.get_session(chat_sid).temperature


def test_a_history_store_and_a_single_message_store_it_once(
        manager: ConversationManager) -> None:
    """A chat store appends the user message, then the framework sends that message alone
    (LlamaIndex's first turn): it is answered and stored once, not continued as a new one."""
    manager.open_session("held")
    question = Message("user", "What is a croissant?")
    manager.append_messages("held", [question])
    turn = manager.complete("held", [question], max_tokens=4, seed=0)
    assert turn.history == "appended"
    assert [(m.role, m.content) for m in manager.history("held")] == [
        ("user", "What is a croissant?"), ("assistant", turn.text)]


def test_one_message_alone_leaves_the_session_as_it_is(
        manager: ConversationManager, engine: Recorder) -> None:
    """A framework that sends one message to a session with history (a trim to the last
    question, a thread started over, a helper call) gets it answered from that message alone:
    the model reads only it and the session is untouched; ``continue_single`` (the server's
    "only the new message") continues the session."""
    sid = "alone"
    secret = Message("user", "My secret word is PINEAPPLE. Please remember it for the rest of our "
                             "long conversation about fruit, gardens, markets and the recipes "
                             "we might cook together later this week.")
    manager.complete(sid, [secret], max_tokens=4, seed=0)
    before = manager.history(sid)
    helper = manager.complete(sid, [Message("user", "Write a title.")], max_tokens=4, seed=0)
    assert helper.history == "stateless"
    assert manager.history(sid) == before
    read = engine.requests[-1]
    assert "PINEAPPLE" not in engine.detokenize(engine.prompt_ids(read))
    # the session's own cache still serves what the message shares with it (a first answer
    # regenerated: the same first message again)
    again = manager.complete(sid, [secret], max_tokens=4, seed=0)
    assert again.history == "stateless" and again.cached_tokens > 0
    assert engine.requests[-1].session_key == sid and manager.history(sid) == before
    more = manager.complete(sid, [Message("user", "And now?")], max_tokens=4, seed=0,
                            continue_single=True)
    assert more.history == "appended" and manager.history(sid)[:2] == before
    assert "PINEAPPLE" in engine.detokenize(engine.prompt_ids(engine.requests[-1]))


def test_a_first_message_planned_before_another_landed_stores_nothing(
        manager: ConversationManager) -> None:
    """Two first messages to one new session, both planned before either ran (a LangChain
    ``batch`` with one session): the second, planned again under the session's lock, is one
    message to a session with history now, so it is answered statelessly and stores nothing
    (it stored its reply, without its question, as a second assistant message in a row)."""
    from suffixmem.conversation.turns import last_event

    first = manager.stream_complete("pair", [Message("user", "Name a colour.")], **SAMPLING)
    second = manager.stream_complete("pair", [Message("user", "Name a fruit.")], **SAMPLING)
    assert last_event(first).history == "new"
    stored = manager.history("pair")
    assert last_event(second).history == "stateless"
    assert manager.history("pair") == stored and [m.role for m in stored] == ["user", "assistant"]


def test_rewritten_stateless_and_schema(manager: ConversationManager, engine: Recorder) -> None:
    sid = "rw"
    t1 = manager.complete(sid, [Message("user", "Name a fruit.")], max_tokens=6, seed=0)
    assert t1.history == "new" and manager.get_session(sid).system_prompt == SYSTEM
    # an edited history replaces the stored one with the turn
    edited = [Message("system", "Be brief."), Message("user", "Name a vegetable.")]
    t2 = manager.complete(sid, edited, max_tokens=6, seed=0)
    assert t2.history == "rewritten"
    hist = manager.history(sid)
    assert [(m.role, m.content) for m in hist] == [("user", "Name a vegetable."),
                                                   ("assistant", t2.text)]
    assert manager.get_session(sid).system_prompt == "Be brief."
    # stateless: nothing stored, one cache key per conversation
    n = len(manager.list_sessions())
    msgs = [Message("user", "Say hi.")]
    s1 = manager.complete(None, msgs, max_tokens=4, seed=0)
    key1 = engine.requests[-1].session_key
    s2 = manager.complete(None, [*msgs, Message("assistant", s1.text), Message("user", "Again.")],
                          max_tokens=4, seed=0)
    assert s1.history == s2.history == "stateless"
    assert key1.startswith("anon-") and engine.requests[-1].session_key == key1
    assert len(manager.list_sessions()) == n
    # show_schema: a system message after the conversation, not stored
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    if engine.supports_json_schema:
        manager.complete(sid, [*edited, Message("assistant", t2.text),
                               Message("user", "Give a number.")],
                         show_schema=True, json_schema=schema, max_tokens=12, temperature=0.0)
        last = engine.requests[-1]
        text = engine.detokenize(last.token_ids[-60:])
        assert "JSON schema" in text
        assert all("JSON schema" not in m.content for m in manager.history(sid))
