"""``SuffixMemAsyncChatStore``: LlamaIndex's ``AsyncDBChatStore`` on suffixmem sessions, so
that ``Memory.from_defaults(chat_store=...)`` (llama-index-core >= 0.14.24) keeps its chat
history in the suffixmem store.

The **active** messages of key ``K`` are the suffixmem session ``K`` (what the model reads, and
what ``SuffixMemLLM(session_id=K)`` appends its turns to); **archived** messages (``Memory``
flushes the oldest ones past its token limit) move to the session ``K + ARCHIVE_SUFFIX``, which
``get_keys`` does not list. Every method runs the synchronous ``SuffixMemChatStore`` in a worker
thread, so the event loop never waits on SQL, and a reply the LLM already stored is not stored
twice (see ``SuffixMemChatStore``). ``delete_message(key, idx)`` takes the message's position in
the active history (suffixmem has no per-message ids to expose).
"""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.storage.chat_store.base_db import AsyncDBChatStore, MessageStatus
from llama_index.storage.chat_store.suffixmem.base import SuffixMemChatStore

from suffixmem.conversation.manager import ConversationManager
from suffixmem.conversation.validation import MAX_ID_LEN
from suffixmem.errors import InvalidRequestError

ARCHIVE_SUFFIX = "#archived"


class SuffixMemAsyncChatStore(AsyncDBChatStore):
    """``AsyncDBChatStore`` over suffixmem sessions (see the module docstring).

    ```python
    from llama_index.core.memory import Memory

    memory = Memory.from_defaults(session_id="alice", chat_store=SuffixMemAsyncChatStore(),
                                  token_limit=3000)
    ```
    """

    database_url: str | None = Field(default=None, description="default: suffixmem's own")

    _sync: SuffixMemChatStore = PrivateAttr()

    def __init__(self, database_url: str | None = None, *, engine: Any = "vllm",
                 manager: ConversationManager | None = None, **kwargs: Any) -> None:
        super().__init__(database_url=database_url, **kwargs)
        self._sync = SuffixMemChatStore(database_url, engine=engine, manager=manager)

    @classmethod
    def class_name(cls) -> str:
        return "SuffixMemAsyncChatStore"

    @property
    def manager(self) -> ConversationManager:
        return self._sync.manager

    @staticmethod
    def _keys(key: str, status: MessageStatus | None) -> list[str]:
        """Sessions holding ``key``'s messages of ``status``, oldest messages first. A key
        whose archive session id would be too long is refused here, on its first use, not
        when ``Memory`` first archives (turns later)."""
        if isinstance(key, str) and len(key) + len(ARCHIVE_SUFFIX) > MAX_ID_LEN:
            raise InvalidRequestError(
                f"key is too long: {len(key)} characters, the limit is "
                f"{MAX_ID_LEN - len(ARCHIVE_SUFFIX)} (its archive is '<key>{ARCHIVE_SUFFIX}')")
        if status is None:
            return [key + ARCHIVE_SUFFIX, key]
        return [key + ARCHIVE_SUFFIX] if MessageStatus(status) == MessageStatus.ARCHIVED else [key]

    def _get(self, key: str, status: MessageStatus | None) -> list[ChatMessage]:
        return [m for k in self._keys(key, status) for m in self._sync.get_messages(k)]

    async def get_messages(self, key: str, status: MessageStatus | None = MessageStatus.ACTIVE,
                           limit: int | None = None, offset: int | None = None,
                           ) -> list[ChatMessage]:
        messages = await asyncio.to_thread(self._get, key, status)
        start = offset or 0
        return messages[start:] if limit is None else messages[start:start + limit]

    async def count_messages(self, key: str,
                             status: MessageStatus | None = MessageStatus.ACTIVE) -> int:
        return len(await asyncio.to_thread(self._get, key, status))

    async def add_message(self, key: str, message: ChatMessage,
                          status: MessageStatus = MessageStatus.ACTIVE) -> None:
        await self.add_messages(key, [message], status)

    async def add_messages(self, key: str, messages: list[ChatMessage],
                           status: MessageStatus = MessageStatus.ACTIVE) -> None:
        (target,) = self._keys(key, status)
        await asyncio.to_thread(self._sync.add_messages, target, messages)  # all or none

    async def set_messages(self, key: str, messages: list[ChatMessage],
                           status: MessageStatus = MessageStatus.ACTIVE) -> None:
        """Replace every message of ``key``, active and archived, by ``messages`` with
        ``status``, as ``SQLAlchemyChatStore`` does (``Memory.set`` replaces the archive too)."""
        (target,) = self._keys(key, status)

        def run() -> None:
            self._sync.set_messages(target, messages)  # first: a bad message changes nothing
            for other in self._keys(key, None):
                if other != target:
                    self._sync.delete_messages(other)

        await asyncio.to_thread(run)

    async def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        return await asyncio.to_thread(self._sync.delete_message, key, idx)

    async def delete_messages(self, key: str, status: MessageStatus | None = None) -> None:
        def run() -> None:
            for k in self._keys(key, status):
                self._sync.delete_messages(k)

        await asyncio.to_thread(run)

    def _take_oldest(self, key: str, n: int, archive: bool) -> list[ChatMessage]:
        messages = self._sync.get_messages(key)
        n = max(0, min(n, len(messages)))
        if n == 0:
            return []
        oldest, rest = messages[:n], messages[n:]
        if archive:
            archived = self._sync.get_messages(key + ARCHIVE_SUFFIX)
            self._sync.set_messages(key + ARCHIVE_SUFFIX, archived + oldest)
        self._sync.set_messages(key, rest)
        return oldest

    async def delete_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        return await asyncio.to_thread(self._take_oldest, key, n, False)

    async def archive_oldest_messages(self, key: str, n: int) -> list[ChatMessage]:
        return await asyncio.to_thread(self._take_oldest, key, n, True)

    async def get_keys(self) -> list[str]:
        keys = await asyncio.to_thread(self._sync.get_keys)
        return [k for k in keys if not k.endswith(ARCHIVE_SUFFIX)]
