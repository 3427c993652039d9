"""``reconcile``: what a resent conversation means against the stored one (pure, no model)."""

from __future__ import annotations

from suffixmem.conversation.reconcile import reconcile
from suffixmem.engine.protocol import Message

SYSTEM = "You are terse."
STORED = [
    Message("user", "one?"), Message("assistant", "1", token_ids=(16,)),
    Message("user", "two?"), Message("assistant", "2", token_ids=(17,)),
    Message("user", "three?"), Message("assistant", "3", token_ids=(18,)),
]


def sent(*messages: Message, system: str = SYSTEM) -> list[Message]:
    return [Message("system", system), *messages]


def plain(m: Message) -> Message:
    return Message(m.role, m.content)  # as a framework resends it: text only


def test_appended_keeps_the_stored_ids() -> None:
    r = reconcile(sent(*map(plain, STORED), Message("user", "four?")), STORED, SYSTEM, None)
    assert r.kind == "appended" and not r.replace and r.dropped == 0
    assert r.history == tuple(STORED) and r.to_store == (Message("user", "four?"),)


def test_one_message_alone_is_answered_alone_unless_it_continues() -> None:
    """One user message sent to a session with history: the adapters' frameworks mean exactly
    that message (a trim to the last question, a first answer regenerated, a thread started
    over, a helper call), so it is stateless and the session stays; the server's "only the new
    message" (``continue_single``) continues the session as ``chat`` does."""
    four = Message("user", "four?")
    for msgs in ([four], sent(four)):  # no system message, or the stored one
        r = reconcile(msgs, STORED, SYSTEM, None)
        assert r.kind == "stateless" and not r.replace
        assert r.history == r.to_store == () and r.tail == (four,) and r.system_prompt == SYSTEM
        r = reconcile(msgs, STORED, SYSTEM, None, continue_single=True)
        assert r.kind == "appended" and not r.replace
        assert r.history == tuple(STORED) and r.tail == r.to_store == (four,)
    # another system prompt, two user messages, or an empty session: not a continuation
    for flag in (False, True):
        assert reconcile(sent(four, system="Be loud."), STORED, SYSTEM, None,
                         continue_single=flag).kind == "rewritten"
        assert reconcile([Message("user", "x"), four], STORED, SYSTEM, None,
                         continue_single=flag).kind == "rewritten"
        assert reconcile([four], [], SYSTEM, None, continue_single=flag).kind == "appended"
        # a message the framework's history store already holds is the prefix case: not twice
        held = reconcile([four], [four], SYSTEM, None, continue_single=flag)
        assert held.kind == "appended" and held.history == () and held.to_store == ()


def test_a_sliding_window_keeps_the_stored_history_and_starts_the_prompt_at_it() -> None:
    """The application's window dropped the oldest exchanges: the stored history stays whole
    (a memory over this session keeps the whole conversation), the new message is appended,
    and the prompt starts at the window (``dropped`` messages in)."""
    four = Message("user", "four?")
    r = reconcile(sent(*map(plain, STORED[2:]), four), STORED, SYSTEM, None)
    assert r.kind == "windowed" and not r.replace and r.dropped == 2
    assert r.history == tuple(STORED)  # the kept turns come back with their generated ids
    assert r.to_store == (four,) and r.tail == (four,)
    # the window may also take the new message's predecessor along (two exchanges dropped)
    r = reconcile(sent(*map(plain, STORED[4:]), four), STORED, SYSTEM, None)
    assert r.kind == "windowed" and r.dropped == 4 and r.history == tuple(STORED)
    # the prompt starts at the window, wherever the session's layout had started it
    assert r.window_start(0) == r.window_start(2) == 4
    appended = reconcile(sent(*map(plain, STORED), four), STORED, SYSTEM, None)
    assert appended.window_start(2) == 2  # the layout's own evictions stand
    assert reconcile(sent(four, four, system="x"), STORED, SYSTEM, None).window_start(2) == 0
    # a memory that stored the new message before the call (a LlamaIndex chat store): it is
    # not stored twice
    r = reconcile(sent(*map(plain, STORED[2:]), four), [*STORED, four], SYSTEM, None)
    assert r.kind == "windowed" and r.dropped == 2 and r.to_store == ()
    assert r.history == tuple(STORED) and r.tail == (four,)


def test_other_rewrites_are_not_a_window() -> None:
    four = Message("user", "four?")
    edited = [*map(plain, STORED[2:4]), Message("user", "THREE?"), plain(STORED[5]), four]
    assert reconcile(sent(*edited), STORED, SYSTEM, None).dropped == 0
    # another system prompt (passages retrieved for this turn) over a window: the system
    # prompt is replaced, the history kept whole (a memory over the session keeps it all)
    other = reconcile(sent(*map(plain, STORED[2:]), four, system="Context: x."), STORED,
                      SYSTEM, None)
    assert other.kind == "rewritten" and other.replace and other.dropped == 2
    assert other.system_prompt == "Context: x." and other.window_start(0) == 2
    assert other.history == tuple(STORED) and other.to_store == (*STORED, four)
    # a window may start with a reply (trim_messages keeps the last messages whatever their
    # role): still a window, never a rewrite that would drop the stored history before it
    r = reconcile(sent(*map(plain, STORED[3:]), four), STORED, SYSTEM, None)
    assert r.kind == "windowed" and r.dropped == 3 and r.to_store == (four,)
    assert r.history == tuple(STORED) and r.window_start(0) == 3


def test_another_system_prompt_keeps_the_stored_ids() -> None:
    """A RAG chat engine resends the history under this turn's passages: a rewrite, but the
    stored messages (and the generated ids of the replies) are the ones rendered."""
    four = Message("user", "four?")
    r = reconcile(sent(*map(plain, STORED), four, system="Context: x."), STORED, SYSTEM, None)
    assert r.kind == "rewritten" and r.replace and r.dropped == 0
    assert r.system_prompt == "Context: x."
    assert r.history == tuple(STORED) and r.to_store == (*STORED, four)
    # an edited message is sent as written; the ones around it keep their ids
    edited = [*map(plain, STORED[:2]), Message("user", "TWO?"), *map(plain, STORED[3:]), four]
    r = reconcile(sent(*edited, system="Context: y."), STORED, SYSTEM, None)
    assert r.history[:2] == tuple(STORED[:2]) and r.history[2] == Message("user", "TWO?")
    assert r.history[3] == STORED[3] and r.history[3].token_ids == (17,)


def test_a_stored_leading_system_message_is_the_system_prompt() -> None:
    """A chat store's ``set_messages([system, ...])`` stores the system message as a message;
    the framework then resends it first: that continues the session (it was read as a
    rewrite, which recomputed the whole prompt and moved the message out of the store)."""
    stored = [Message("system", SYSTEM), *STORED]
    four = Message("user", "four?")
    for stored_system in (None, SYSTEM):
        r = reconcile(sent(*map(plain, STORED), four), stored, stored_system, None)
        assert r.kind == "appended" and not r.replace and r.system_prompt == SYSTEM
        assert r.history == tuple(STORED) and r.to_store == (four,)
    r = reconcile(sent(*map(plain, STORED), four, system="Be loud."), stored, None, None)
    assert r.kind == "rewritten" and r.system_prompt == "Be loud."


def test_a_tool_call_resent_in_canonical_form_matches_the_generated_one() -> None:
    """The model generated ``{"name": "mul", "arguments": {"a": 6}}``; an HTTP client resends
    the call as name and arguments, which render as ``{"arguments": {"a": 6}, "name": "mul"}``:
    the same message, so the session appends and keeps the generated ids."""
    generated = Message("assistant", '{"name": "mul", "arguments": {"a": 6}}', token_ids=(5, 6))
    stored = [Message("user", "6*7?"), generated]
    canonical = '{"arguments": {"a": 6}, "name": "mul"}'
    resent = [Message("user", "6*7?"), Message("assistant", canonical),
              Message("tool", '{"tool": "mul", "result": "42"}')]
    r = reconcile(resent, stored, None, None)
    assert r.kind == "appended" and r.history == tuple(stored)
    other = [Message("user", "6*7?"), Message("assistant", canonical.replace("6", "7")),
             Message("tool", "42")]
    assert reconcile(other, stored, None, None).kind == "rewritten"


def test_a_question_a_history_store_wrote_first_takes_the_first_turns_system_prompt() -> None:
    """A LlamaIndex chat engine stores the question before it calls the model, into a session
    without a system prompt; the call then sends its system prompt: the first turn, appended
    (it read as a rewrite), setting the system prompt and storing the question once."""
    four = Message("user", "four?")
    r = reconcile(sent(four), [four], None, None)
    assert r.kind == "appended" and r.system_prompt == SYSTEM and r.replace
    assert r.to_store == (four,) and r.history == () and r.tail == (four,)
    # once the session has a reply, another system prompt is a rewrite, as before
    assert reconcile(sent(*map(plain, STORED), four), STORED, None, None).kind == "rewritten"



def test_a_list_that_ends_with_a_reply_asks_one_more_reply_and_stores_nothing() -> None:
    """As OpenAI answers it (LangGraph's structured response re-reads the finished agent
    conversation): stateless, the last reply is the tail, matched replies keep their ids."""
    r = reconcile(sent(*map(plain, STORED)), STORED, SYSTEM, None)
    assert r.kind == "stateless" and not r.replace and r.to_store == ()
    assert r.history == tuple(STORED[:-1]) and r.tail == (STORED[-1],)
    assert r.system_prompt == SYSTEM
    fresh = reconcile([Message("user", "hi"), Message("assistant", "hello")], None, None, "d")
    assert fresh.kind == "stateless" and fresh.system_prompt == "d"
    assert fresh.tail == (Message("assistant", "hello"),) and fresh.to_store == ()
