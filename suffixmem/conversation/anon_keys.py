"""Session keys of stateless calls that survive the caller's own sliding window.

A stateless call (``complete(None, messages)``) has no session id, so the manager derives the
engine's session key from the conversation itself (``reconcile.anon_key``: the scope, the
system prompt and the first user message). A conversation that grows keeps that key. But an
application that trims its history (LangChain's ``trim_messages``, LlamaIndex's memory buffer)
drops the first user message once the window fills, and every turn from then on got a new key:
under per-session isolation nothing cached was found, not even the system prompt, and the
torch engine's context shift, which remembers each key's previous sequence, never saw one.

``AnonKeys`` remembers, per manager, which key each *exchange* was last sent under: a user
message, the assistant reply after it and the user message after that (three messages, so that
a common short exchange such as "thanks" / "You're welcome!" alone does not tie two
conversations together). A call whose first exchange is known continues that exchange's
conversation and its key; any other call gets ``anon_key``. Each call records its first and
newest exchanges (the newest ends with the question being asked), so the exchange a window
starts with next time is known when it gets there. An exchange is identified by the scope, the
system prompt and the three texts, hashed.

Trade-offs: the memory is in-process (``capacity`` exchanges, least recently used dropped), so
after a restart a windowed conversation starts a new key once. Two conversations of one scope
and system prompt that share an exchange word for word share a key from then on, and with it
the key's cached KV (on the torch engine, context shift may then place the other
conversation's KV of that exchange); conversations starting with the same user message already
shared a key (``anon_key``), and a scope never shares with another scope.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence

from suffixmem.conversation.reconcile import anon_key, split
from suffixmem.engine.protocol import Message

CAPACITY = 8192  # exchanges remembered (~100 bytes each)


def _exchanges(conv: Sequence[Message]) -> list[tuple[str, str, str]]:
    """The (user, assistant, user) runs of adjacent messages, in order."""
    return [(a.content, b.content, c.content) for (a, b), c in zip(itertools.pairwise(conv),
                                                                  conv[2:], strict=False)
            if (a.role, b.role, c.role) == ("user", "assistant", "user")]


class AnonKeys:
    """The stateless calls' key memory (module docstring). Thread-safe."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("AnonKeys needs a capacity of at least 1")
        self.capacity = capacity
        self._keys: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._keys)

    @staticmethod
    def _fingerprint(scope: str, system: str | None, exchange: tuple[str, ...]) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for part in (scope, system or "", *exchange):
            h.update(part.encode())
            h.update(b"\x00")
        return h.digest()

    def key(self, messages: Sequence[Message], scope: str = "") -> str:
        """The session key of a stateless call sending ``messages`` (checked, non-empty)."""
        system, before, tail = split(messages)
        pairs = _exchanges([*before, *tail])
        ends = pairs[:1] + pairs[1:][-1:]  # first and newest (once when they are one)
        prints = [self._fingerprint(scope, system, p) for p in ends]
        with self._lock:
            found = self._keys.get(prints[0]) if prints else None
            key = found if found is not None else anon_key(messages, scope)
            for fp in prints:  # first and newest exchange: the next window starts at a known one
                self._keys[fp] = key
                self._keys.move_to_end(fp)
            while len(self._keys) > self.capacity:
                self._keys.popitem(last=False)
        return key
