"""``SuffixMemChatStore``: LlamaIndex chat histories as suffixmem sessions, read and written
through the shared ``ConversationManager`` (its session locks, its SQL store)."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.storage.chat_store.base import BaseChatStore
from llama_index.storage.chat_store.suffixmem.messages import (
    STORED_KEY,
    to_llama_index,
    to_suffixmem,
    to_suffixmem_message,
)

from suffixmem import runtime
from suffixmem.conversation.manager import ConversationManager
from suffixmem.conversation.stored_turns import STORED_TURNS
from suffixmem.engine.protocol import Message
from suffixmem.errors import UnknownSessionError


class SuffixMemChatStore(BaseChatStore):
    """Chat histories keyed by suffixmem session id, in the SQL store that
    ``ConversationManager`` and ``suffixmem chat`` use.

    Semantics follow LlamaIndex's ``SimpleChatStore``: an unknown key reads as ``[]``, and
    ``delete_*`` of an unknown key or index returns ``None``; ``delete_messages`` removes the
    session. ``manager`` defaults to the process-wide one of ``engine`` and ``database_url``
    (``suffixmem.runtime.get_manager``): use the same as ``SuffixMemLLM``'s so both take the
    same session lock. Rewrites (``set_messages``, ``add_message`` with ``idx``,
    ``delete_message``) replace the history in one transaction, once every message passed
    its checks.

    **Turns the LLM already stored.** ``SuffixMemLLM`` (with ``session_id`` = the chat store
    key) stores each turn it generates through the manager; a chat engine then ``put``s the
    reply, and some (``ContextChatEngine``, ``CondensePlusContextChatEngine``) the question
    first, into its memory, i.e. ``add_message`` here. The reply carries where it was stored
    (``additional_kwargs["suffixmem_stored"]``), or, when the engine puts a fresh copy, the
    LLM left a note of it (``suffixmem.conversation.stored_turns``); while the session holds
    it there, that reply and the question stored just before it are not stored twice. Any
    other message is appended, a legitimately repeated one included.

    ```python
    from llama_index.core.memory import ChatMemoryBuffer

    memory = ChatMemoryBuffer.from_defaults(
        chat_store=SuffixMemChatStore(), chat_store_key="alice", token_limit=3000)
    ```
    """

    database_url: str | None = Field(default=None, description="default: suffixmem's own")

    _manager: ConversationManager = PrivateAttr()

    def __init__(self, database_url: str | None = None, *, engine: Any = "vllm",
                 manager: ConversationManager | None = None, **kwargs: Any) -> None:
        super().__init__(database_url=database_url, **kwargs)
        self._manager = manager if manager is not None else runtime.get_manager(
            engine, database_url=database_url)

    @classmethod
    def class_name(cls) -> str:
        return "SuffixMemChatStore"

    @property
    def manager(self) -> ConversationManager:
        return self._manager

    def _read(self, key: str) -> list[Message] | None:
        try:
            return self._manager.history(key)
        except UnknownSessionError:
            return None

    def _replace(self, key: str, messages: list[Message]) -> None:
        self._manager.open_session(key)
        # every message checked before the history is cleared: a bad one changes nothing
        self._manager.append_messages(key, messages, replace=True)

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        self._replace(key, to_suffixmem(messages))  # translation fails before anything changes

    def get_messages(self, key: str) -> list[ChatMessage]:
        return [to_llama_index(m) for m in self._read(key) or []]

    def add_message(self, key: str, message: ChatMessage, idx: int | None = None) -> None:
        """Append ``message`` (or insert it at ``idx``, as ``list.insert`` would), unless it is
        the reply the LLM already stored there (see the class docstring)."""
        if idx is None:
            self.add_messages(key, [message])
            return
        new = to_suffixmem_message(message)
        messages = self._read(key) or []
        messages.insert(idx, new)
        self._replace(key, messages)

    def add_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Append ``messages`` in one transaction (none of them if one is refused), leaving
        out the replies the LLM already stored (see the class docstring)."""
        pairs = [(m, to_suffixmem_message(m)) for m in messages]
        fresh = [new for m, new in pairs if not self._already_stored(key, m, new)]
        if fresh:
            self._manager.open_session(key)
            self._manager.append_messages(key, fresh)

    def _already_stored(self, key: str, message: ChatMessage, new: Message) -> bool:
        mark = message.additional_kwargs.get(STORED_KEY)
        note = STORED_TURNS.peek(self._manager, key)
        marked = isinstance(mark, dict) and mark.get("session_id") == key
        if marked:
            at = mark.get("index")
        elif note is not None and new.role in ("user", "assistant"):
            at = note[0] - (new.role == "user")  # the question just before the noted reply
        else:
            return False
        stored = self._read(key) or []
        # stripped: a streaming chat engine puts the reply back with its text stripped
        held = (isinstance(at, int) and 0 <= at < len(stored) and stored[at].role == new.role
                and stored[at].content.strip() == new.content.strip())
        if not marked:  # a fresh copy: of the reply just noted, still the last stored message
            held = held and note[0] == len(stored) - 1 and (
                stored[note[0]].content.strip() == note[1].strip())
        if note is not None and (new.role == "assistant" or not held):
            STORED_TURNS.take(self._manager, key)  # seen, or the history moved on
        return held

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        messages = self._read(key)
        if messages is None:
            return None
        self._manager.delete_session(key)
        return [to_llama_index(m) for m in messages]

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Remove and return message ``idx`` (negative counts from the end, as ``list.pop``);
        ``None`` for an unknown key or ``idx >= len``."""
        messages = self._read(key)
        if messages is None or idx >= len(messages):
            return None
        removed = messages.pop(idx)
        self._replace(key, messages)
        return to_llama_index(removed)

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Remove and return the last message; ``None`` for an unknown key or an empty one."""
        messages = self._read(key)
        if not messages:
            return None
        return self.delete_message(key, len(messages) - 1)

    def get_keys(self) -> list[str]:
        return [s.id for s in self._manager.list_sessions()]
