"""``SuffixMemChatMessageHistory``: LangChain chat history in the suffixmem conversation store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from integrations.langchain.messages import to_langchain, to_suffixmem
from suffixmem import client

if TYPE_CHECKING:  # pragma: no cover
    from suffixmem.conversation.store import Store


class SuffixMemChatMessageHistory(BaseChatMessageHistory):
    """The messages of one suffixmem session, in the SQL conversation store that
    ``ConversationManager`` and ``suffixmem chat`` use, so a conversation started in LangChain
    can be listed and continued there.

    ``database_url`` defaults to suffixmem's own database; instances for the same URL share one
    store (``suffixmem.client.get_store``). With ``create=True`` (default) an unknown session
    reads as empty and is created on the first write; with ``create=False`` it raises
    ``UnknownSessionError`` (a ``KeyError``).

    ```python
    from langchain_core.runnables.history import RunnableWithMessageHistory

    chain = RunnableWithMessageHistory(
        prompt | chat, lambda session_id: SuffixMemChatMessageHistory(session_id),
        input_messages_key="question", history_messages_key="history")
    ```
    """

    def __init__(
        self,
        session_id: str,
        *,
        database_url: str | None = None,
        store: Store | None = None,
        create: bool = True,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("session_id must be a non-empty string")
        self.session_id = session_id
        self.store = store if store is not None else client.get_store(database_url)
        self.create = create
        if not create:
            self.store.require_session(session_id)

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return [
            to_langchain(m)
            for m in client.read_history(self.store, self.session_id, create=self.create)
        ]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        client.write_history(
            self.store, self.session_id, to_suffixmem(messages), create=self.create
        )

    def clear(self) -> None:
        if self.create:
            self.store.open_session(self.session_id)
        self.store.clear_history(self.session_id)
