"""Replies an adapter's model just stored, for the history the framework writes next.

A framework calls the model (the manager stores the turn), then writes the turn into its own
history, which is the same session: LangChain's ``RunnableWithMessageHistory`` calls
``add_messages([question, reply])``, LlamaIndex's chat engines ``put`` the question and the
reply into their memory. The reply normally carries where it was stored (the adapters'
``suffixmem_stored`` marker), but a chain that ends in a parser (``| StrOutputParser()``) and
LlamaIndex's ``ContextChatEngine`` / ``CondensePlusContextChatEngine`` hand the history a fresh
message with the text only. So the adapter also notes here, per manager and session, the last
reply it stored and not yet seen by a history; the history takes the note (once) when the
reply it is given is that text, and leaves the question before it out too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

_CAPACITY = 4096  # sessions; an unread note only costs an entry


class StoredTurns:
    """LRU ``(manager id, session id) -> (index of the reply in the session, reply text)``."""

    def __init__(self, capacity: int = _CAPACITY) -> None:
        self._notes: OrderedDict[tuple[int, str], tuple[int, str]] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def note(self, manager: object, session_id: str, index: int, text: str) -> None:
        key = (id(manager), session_id)
        with self._lock:
            self._notes[key] = (index, text)
            self._notes.move_to_end(key)
            while len(self._notes) > self._capacity:
                self._notes.popitem(last=False)

    def take(self, manager: object, session_id: str) -> tuple[int, str] | None:
        with self._lock:
            return self._notes.pop((id(manager), session_id), None)

    def peek(self, manager: object, session_id: str) -> tuple[int, str] | None:
        with self._lock:
            return self._notes.get((id(manager), session_id))


STORED_TURNS = StoredTurns()
