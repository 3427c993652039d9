"""LlamaIndex ``Memory`` on ``SuffixMemAsyncChatStore``: messages round-trip through suffixmem's
store on SQLite and PostgreSQL, behave as on LlamaIndex's own ``SQLAlchemyChatStore`` (the
reference), and the active history is the suffixmem session the model reads."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.memory import Memory
from llama_index.core.storage.chat_store.base_db import MessageStatus
from llama_index.storage.chat_store.suffixmem import SuffixMemAsyncChatStore

from suffixmem import runtime

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio]

_CORE = tuple(int(p) for p in version("llama-index-core").split(".")[:3])
# Memory.from_defaults takes chat_store= from llama-index-core 0.14.24 on
needs_memory_store = pytest.mark.skipif(
    _CORE < (0, 14, 24), reason=f"llama-index-core {_CORE} < 0.14.24: Memory has no chat_store")

TURNS = [
    ("user", "What flour is best for sourdough?"),
    ("assistant", "A strong bread flour with some whole wheat."),
    ("user", "How long should it proof?"),
    ("assistant", "Four to six hours at room temperature, or overnight in the fridge."),
    ("user", "Can I use rye instead?"),
    ("assistant", "Yes; rye ferments faster, so shorten the proof."),
]


def _msgs() -> list[ChatMessage]:
    return [ChatMessage(role=MessageRole(r), content=t) for r, t in TURNS]


def _view(messages: list[ChatMessage]) -> list[tuple[str, str]]:
    return [(str(m.role.value), str(m.content)) for m in messages]


def _memory(store: Any, **kwargs: Any) -> Memory:
    return Memory.from_defaults(session_id="alice", chat_store=store, **kwargs)


def _reference_store() -> Any:
    from llama_index.core.storage.chat_store.sql import SQLAlchemyChatStore

    return SQLAlchemyChatStore(table_name="reference",
                               async_database_uri="sqlite+aiosqlite:///:memory:")


@needs_memory_store
async def test_memory_round_trips_through_the_store(shared_engine: Any,
                                                    any_database_url: str) -> None:
    manager = runtime.get_manager(shared_engine, database_url=any_database_url)
    store = SuffixMemAsyncChatStore(manager=manager)
    memory = _memory(store, token_limit=100_000)
    await memory.aput_messages(_msgs())
    assert _view(await memory.aget()) == TURNS
    # in suffixmem's store, as the session the model reads
    assert [(m.role, m.content) for m in manager.history("alice")] == TURNS
    # a fresh Memory on a fresh store object reads it back
    again = _memory(SuffixMemAsyncChatStore(manager=manager), token_limit=100_000)
    assert _view(await again.aget_all()) == TURNS
    assert await store.get_keys() == ["alice"]
    await again.areset()
    assert await store.count_messages("alice", status=None) == 0


@needs_memory_store
async def test_flush_archives_like_the_reference(shared_engine: Any,
                                                 any_database_url: str) -> None:
    """A small token limit makes Memory archive the oldest turns: the same messages stay
    active and the same are archived as on LlamaIndex's SQLAlchemyChatStore."""
    pytest.importorskip("aiosqlite")
    manager = runtime.get_manager(shared_engine, database_url=any_database_url)
    ours = _memory(SuffixMemAsyncChatStore(manager=manager), token_limit=40,
                   chat_history_token_ratio=0.5, token_flush_size=10)
    ref = _memory(_reference_store(), token_limit=40, chat_history_token_ratio=0.5,
                  token_flush_size=10)
    for m in _msgs():
        await ours.aput(m)
        await ref.aput(m)
    assert _view(await ours.aget()) == _view(await ref.aget())
    for status in (MessageStatus.ACTIVE, MessageStatus.ARCHIVED, None):
        assert _view(await ours.aget_all(status)) == _view(await ref.aget_all(status)), status
    archived = await ours.aget_all(MessageStatus.ARCHIVED)
    assert archived, "the token limit should have archived something"
    assert [(m.role, m.content) for m in manager.history("alice")] == \
        _view(await ours.aget_all(MessageStatus.ACTIVE))


async def test_store_methods_match_the_reference(shared_engine: Any, any_database_url: str
                                                 ) -> None:
    pytest.importorskip("aiosqlite")
    manager = runtime.get_manager(shared_engine, database_url=any_database_url)
    ours, ref = SuffixMemAsyncChatStore(manager=manager), _reference_store()

    async def same(method: str, *args: Any) -> None:
        a, b = await getattr(ours, method)(*args), await getattr(ref, method)(*args)
        if method != "get_keys" and isinstance(a, list):
            a, b = _view(a), _view(b)
        assert a == b, (method, args)

    for s in (ours, ref):
        await s.add_messages("k", _msgs()[:5])
        await s.add_message("k", _msgs()[5])
    await same("archive_oldest_messages", "k", 2)
    for args in [("k",), ("k", MessageStatus.ARCHIVED), ("k", None), ("k", None, 3, 1),
                 ("k", MessageStatus.ACTIVE, 2)]:
        await same("get_messages", *args)
    await same("delete_oldest_messages", "k", 1)
    for status in (MessageStatus.ACTIVE, MessageStatus.ARCHIVED, None):
        await same("count_messages", "k", status)
    await same("get_keys")
    # set_messages replaces the key's archive too (an archive left behind kept the replaced
    # conversation in Memory.get_all)
    await same("archive_oldest_messages", "k", 1)
    await same("set_messages", "k", _msgs()[:2])
    for status in (MessageStatus.ACTIVE, MessageStatus.ARCHIVED, None):
        await same("get_messages", "k", status)
    await same("set_messages", "k", _msgs()[2:3], MessageStatus.ARCHIVED)
    await same("get_messages", "k", None)
    for s in (ours, ref):
        await s.add_messages("k", _msgs()[3:5])
    await same("archive_oldest_messages", "k", 1)
    await ours.delete_messages("k", MessageStatus.ARCHIVED)
    await ref.delete_messages("k", MessageStatus.ARCHIVED)
    await same("get_messages", "k", None)
