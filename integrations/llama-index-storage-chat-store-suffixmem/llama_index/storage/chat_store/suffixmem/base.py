"""``SuffixMemChatStore``: a LlamaIndex chat store in the suffixmem conversation store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.storage.chat_store.base import BaseChatStore

from integrations.llama_index.messages import to_llama_index, to_suffixmem, to_suffixmem_message
from suffixmem import client
from suffixmem.errors import UnknownSessionError

if TYPE_CHECKING:  # pragma: no cover
    from suffixmem.conversation.store import Store


class SuffixMemChatStore(BaseChatStore):
    """Chat histories keyed by suffixmem session id, in the SQL store that
    ``ConversationManager`` and ``suffixmem chat`` use.

    Semantics follow LlamaIndex's ``SimpleChatStore``: an unknown key reads as ``[]``, and
    ``delete_*`` of an unknown key or index returns ``None``; ``delete_messages`` removes the
    session. Instances for one ``database_url`` share one store (``client.get_store``).

    ```python
    from llama_index.core.memory import ChatMemoryBuffer

    memory = ChatMemoryBuffer.from_defaults(
        chat_store=SuffixMemChatStore(), chat_store_key="alice", token_limit=3000)
    ```
    """

    database_url: str | None = Field(default=None, description="default: suffixmem's own")

    _store: Store = PrivateAttr()

    def __init__(self, database_url: str | None = None, store: Store | None = None,
                 **kwargs: Any) -> None:
        super().__init__(database_url=database_url, **kwargs)
        self._store = store if store is not None else client.get_store(database_url)

    @classmethod
    def class_name(cls) -> str:
        return "SuffixMemChatStore"

    @property
    def store(self) -> Store:
        return self._store

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        client.replace_history(self._store, key, to_suffixmem(messages))

    def get_messages(self, key: str) -> list[ChatMessage]:
        return [to_llama_index(m) for m in client.read_history(self._store, key)]

    def add_message(self, key: str, message: ChatMessage, idx: int | None = None) -> None:
        """Append ``message`` (or insert it at ``idx``, as ``list.insert`` would)."""
        if idx is None:
            client.write_history(self._store, key, [to_suffixmem_message(message)])
            return
        messages = client.read_history(self._store, key)
        messages.insert(idx, to_suffixmem_message(message))
        client.replace_history(self._store, key, messages)

    def _existing(self, key: str) -> list[Any] | None:
        try:
            return client.read_history(self._store, key, create=False)
        except UnknownSessionError:
            return None

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        messages = self._existing(key)
        if messages is None:
            return None
        self._store.delete_session(key)
        return [to_llama_index(m) for m in messages]

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Remove and return message ``idx`` (negative counts from the end, as ``list.pop``);
        ``None`` for an unknown key or ``idx >= len``."""
        messages = self._existing(key)
        if messages is None or idx >= len(messages):
            return None
        removed = messages.pop(idx)
        client.replace_history(self._store, key, messages)
        return to_llama_index(removed)

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Remove and return the last message; ``None`` for an unknown key or an empty one."""
        messages = self._existing(key)
        if not messages:
            return None
        return self.delete_message(key, len(messages) - 1)

    def get_keys(self) -> list[str]:
        return [s.id for s in self._store.list_sessions()]
