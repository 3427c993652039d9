"""``SuffixMemChatMessageHistory``: LangChain chat history of one suffixmem session, read and
written through the shared ``ConversationManager`` (its session lock, its SQL store)."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage

from langchain_suffixmem.messages import STORED_KEY, to_langchain, to_suffixmem
from suffixmem import runtime
from suffixmem.conversation.manager import ConversationManager
from suffixmem.conversation.stored_turns import STORED_TURNS
from suffixmem.engine.protocol import Message
from suffixmem.errors import InvalidRequestError, UnknownSessionError


class SuffixMemChatMessageHistory(BaseChatMessageHistory):
    """The messages of one suffixmem session, in the SQL conversation store that
    ``ConversationManager`` and ``suffixmem chat`` use, so a conversation started in LangChain
    can be listed and continued there.

    ``manager`` defaults to the process-wide one of ``engine`` (a name or instance) and
    ``database_url`` (``suffixmem.runtime.get_manager``); use the same as the chat model's so
    both take the same session lock. With ``create=True`` (default) an unknown session reads as
    empty and is created on the first write; with ``create=False`` it raises
    ``UnknownSessionError`` (a ``KeyError``).

    **Turns the chat model already stored.** ``SuffixMemChatModel`` stores each turn it
    generates (through the manager), and ``RunnableWithMessageHistory`` then calls
    ``add_messages([question, reply])``. The reply carries where it was stored
    (``response_metadata["suffixmem_stored"]``), or, when a parser turned it into text, the
    model left a note of it (``suffixmem.conversation.stored_turns``); if the session still
    holds it there, ``add_messages`` skips it and the messages just before it that the same
    turn stored. Everything else is appended, a legitimately repeated message included.

    An empty (or whitespace-only) message raises ``InvalidRequestError``: it would give the
    model nothing to read and every later turn would have to carry it.

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
        engine: str | object = "vllm",
        database_url: str | None = None,
        manager: ConversationManager | None = None,
        create: bool = True,
        **engine_options: object,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidRequestError("session_id must be a non-empty string")
        self.session_id = session_id
        if manager is None:
            database_url, options = runtime.database_of(database_url, dict(engine_options))
            manager = runtime.get_manager(engine, database_url=database_url,  # type: ignore[arg-type]
                                          **options)
        self.manager = manager
        self.create = create
        if not create:
            self.manager.get_session(session_id)  # UnknownSessionError now, not later

    def _stored(self) -> list[Message]:
        try:
            return self.manager.history(self.session_id)
        except UnknownSessionError:
            if self.create:
                return []
            raise

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return [to_langchain(m) for m in self._stored()]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        new = to_suffixmem(messages)  # InvalidRequestError for what the model cannot read
        keep = self._not_yet_stored(messages, new)  # (position, message) pairs
        for i, m in keep:
            if not m.content.strip():
                raise InvalidRequestError(
                    f"messages[{i}].content is empty; a chat history keeps only messages "
                    "with text")
        if not keep:
            return
        if self.create:
            self.manager.open_session(self.session_id)
        self.manager.append_messages(self.session_id, [m for _, m in keep])

    def _not_yet_stored(self, messages: Sequence[BaseMessage], new: list[Message]
                        ) -> list[tuple[int, Message]]:
        """``new`` (with positions) without the turns the chat model stored itself (see the
        class docstring)."""
        where: dict[int, int] = {}  # position in ``messages`` -> index in the stored history
        for i, lc in enumerate(messages):
            mark = lc.response_metadata.get(STORED_KEY) if isinstance(lc, AIMessage) else None
            if (isinstance(mark, dict) and mark.get("session_id") == self.session_id
                    and isinstance(mark.get("index"), int)):
                where[i] = mark["index"]
        note = STORED_TURNS.take(self.manager, self.session_id)
        if not where and note is not None:
            last = max((i for i, m in enumerate(new) if m.role == "assistant"), default=None)
            if last is not None and new[last].content == note[1]:
                where[last] = note[0]
        if not where:
            return list(enumerate(new))
        stored = self._stored()
        skip: set[int] = set()
        for i, at in sorted(where.items()):
            if not (0 <= at < len(stored) and _same(stored[at], new[i])):
                continue  # the history changed since: store the reply as sent
            skip.add(i)
            # the inputs of that turn: the messages right before the reply that match the
            # stored ones right before it, position by position
            j, k = i - 1, at - 1
            while j >= 0 and k >= 0 and j not in skip and _same(stored[k], new[j]):
                skip.add(j)
                j, k = j - 1, k - 1
        return [(i, m) for i, m in enumerate(new) if i not in skip]

    def clear(self) -> None:
        if self.create:
            self.manager.open_session(self.session_id)
        self.manager.clear_history(self.session_id)


def _same(a: Message, b: Message) -> bool:
    return a.role == b.role and a.content == b.content
