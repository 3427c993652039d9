"""``AnonKeys``: a stateless conversation keeps one session key when the caller's own sliding
window drops its first exchanges; other conversations and other scopes keep theirs."""

from __future__ import annotations

import pytest

from suffixmem.conversation.anon_keys import AnonKeys
from suffixmem.conversation.reconcile import anon_key
from suffixmem.engine.protocol import Message

SYSTEM = Message("system", "Be brief.")


def conversation(n: int, tag: str = "") -> list[Message]:
    """``n`` exchanges then a new question, as a framework resends them."""
    out = [SYSTEM]
    for i in range(n):
        out += [Message("user", f"{tag}question {i}"), Message("assistant", f"{tag}answer {i}")]
    return [*out, Message("user", f"{tag}question {n}")]


def test_a_windowed_conversation_keeps_its_key() -> None:
    keys = AnonKeys()
    first = keys.key(conversation(0))
    assert first == anon_key(conversation(0))  # a new conversation: the plain derived key
    for n in range(1, 5):  # it grows: the same key
        assert keys.key(conversation(n)) == first
    # the window keeps the system prompt and the last two exchanges (trim_messages)
    for n in range(5, 9):
        full = conversation(n)
        window = [SYSTEM, *full[-5:]]
        assert anon_key(window) != first  # what the plain derivation would have said
        assert keys.key(window) == first
        keys.key(full)  # the same conversation unwindowed in between changes nothing


def test_other_conversations_and_scopes_keep_their_own_keys() -> None:
    keys = AnonKeys()
    a = [keys.key(conversation(n, "a ")) for n in range(3)]
    b = [keys.key(conversation(n, "b ")) for n in range(3)]
    assert len(set(a)) == 1 and len(set(b)) == 1 and a[0] != b[0]
    window = [SYSTEM, *conversation(3, "a ")[-5:]]  # starts at exchange 1, which a answered
    assert keys.key(window) == a[0]
    assert keys.key(window, "tenant-2.") != a[0]  # another scope never continues it
    other_system = [Message("system", "Be verbose."), *window[1:]]
    assert keys.key(other_system) != a[0]


def test_memory_is_bounded_and_a_forgotten_window_starts_a_new_key() -> None:
    keys = AnonKeys(capacity=4)
    start = keys.key(conversation(1))
    for i in range(10):  # ten other conversations push the first one's exchanges out
        keys.key(conversation(1, f"{i} "))
    assert len(keys) == 4
    window = [SYSTEM, *conversation(3)[-3:]]
    fresh = keys.key(window)
    assert fresh != start and fresh == anon_key(window)
    # from then on the conversation keeps the new key, window after window
    assert keys.key([SYSTEM, *conversation(4)[-5:]]) == fresh
    assert keys.key([SYSTEM, *conversation(5)[-5:]]) == fresh
    with pytest.raises(ValueError, match="capacity"):
        AnonKeys(capacity=0)
