"""Stateless calls derive their cache key from the conversation's start and a scope, so callers
of different scopes (a server's API keys) never share cached KV."""

from __future__ import annotations

from suffixmem.conversation.reconcile import anon_key
from suffixmem.engine.protocol import Message


def test_anon_key_is_stable_per_conversation_and_scope() -> None:
    first = [Message("system", "Be brief."), Message("user", "Hi")]
    grown = [*first, Message("assistant", "Hello!"), Message("user", "And now?")]
    # a resent, growing conversation keeps its key (it keeps hitting its own cache)
    assert anon_key(first, "k1.") == anon_key(grown, "k1.")
    # another scope, another key: no cache entries shared across API keys
    assert anon_key(first, "k1.") != anon_key(first, "k2.")
    assert anon_key(first) != anon_key(first, "k1.")
    # another conversation start, another key
    assert anon_key([Message("user", "Hey")], "k1.") != anon_key(first, "k1.")
