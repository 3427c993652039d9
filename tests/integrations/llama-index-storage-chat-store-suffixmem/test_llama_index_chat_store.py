"""``SuffixMemChatStore`` behaves like LlamaIndex's own ``SimpleChatStore`` (the reference),
persists in the SQL conversation store, and backs a chat engine's memory."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import MODEL_PARAMS
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.storage.chat_store import SimpleChatStore
from llama_index.llms.suffixmem import SuffixMemLLM
from llama_index.storage.chat_store.suffixmem import SuffixMemChatStore

from suffixmem import runtime

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


def _m(role: str, text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole(role), content=text)


def _view(messages: list[ChatMessage] | ChatMessage | None) -> Any:
    if messages is None:
        return None
    if isinstance(messages, ChatMessage):
        return (messages.role, messages.content)
    return [(m.role, m.content) for m in messages]


def test_matches_simple_chat_store(manager: Any) -> None:
    ours, reference = SuffixMemChatStore(manager=manager), SimpleChatStore()
    operations: list[tuple[str, tuple[Any, ...]]] = [
        ("get_messages", ("a",)),
        ("add_message", ("a", _m("user", "hi"))),
        ("add_message", ("a", _m("assistant", "hello"))),
        ("add_message", ("a", _m("user", "how are you?"))),
        ("add_message", ("a", _m("system", "be kind"), 0)),
        ("get_messages", ("a",)),
        ("delete_message", ("a", 1)),
        ("delete_message", ("a", 7)),
        ("delete_message", ("a", -1)),
        ("delete_message", ("nobody", 0)),
        ("get_messages", ("a",)),
        ("set_messages", ("b", [_m("user", "x"), _m("assistant", "y")])),
        ("delete_last_message", ("b",)),
        ("delete_last_message", ("nobody",)),
        ("get_messages", ("b",)),
        ("set_messages", ("b", [_m("user", "z")])),
        ("get_messages", ("b",)),
        ("delete_messages", ("a",)),
        ("delete_messages", ("a",)),
        ("get_messages", ("a",)),
    ]
    for name, args in operations:
        got, want = getattr(ours, name)(*args), getattr(reference, name)(*args)
        assert _view(got) == _view(want), (name, args)
        assert sorted(ours.get_keys()) == sorted(reference.get_keys()), (name, args)


async def test_async_methods_and_persistence(manager: Any, database_url: str) -> None:
    store = SuffixMemChatStore(database_url, engine=manager.engine)
    await store.async_add_message("k", _m("user", "hi"))
    await store.aset_messages("k", [_m("user", "hi"), _m("assistant", "hey")])
    # a new instance (a new process, say) reads the same rows from the database
    again = SuffixMemChatStore(database_url, engine=manager.engine)
    assert _view(await again.aget_messages("k")) == [
        (MessageRole.USER, "hi"), (MessageRole.ASSISTANT, "hey")]
    assert await again.aget_keys() == ["k"]
    assert again.manager is store.manager is runtime.get_manager(
        manager.engine, database_url=database_url)
    stored = manager.history("k")
    assert [m.role for m in stored] == ["user", "assistant"]
    assert _view(await again.adelete_last_message("k")) == (MessageRole.ASSISTANT, "hey")


def test_unreadable_messages_raise_value_error(manager: Any) -> None:
    store = SuffixMemChatStore(manager=manager)
    picture = ChatMessage(role=MessageRole.USER, blocks=[ImageBlock(url="https://x.org/a.png")])
    with pytest.raises(ValueError, match="ImageBlock"):
        store.add_message("k", picture)
    assert store.get_messages("k") == []


async def test_a_bad_message_changes_nothing(manager: Any) -> None:
    """One empty message in a batch: the stored history stays as it was (``set_messages``
    cleared it first, the async ``add_messages`` kept the part before it)."""
    from llama_index.storage.chat_store.suffixmem import SuffixMemAsyncChatStore

    store = SuffixMemChatStore(manager=manager)
    kept = [_m("user", "hi"), _m("assistant", "hello"), _m("user", "and you?")]
    store.set_messages("k", kept)
    bad = [_m("user", "New"), _m("user", "")]
    with pytest.raises(ValueError, match=r"messages\[1\]\.content is empty"):
        store.set_messages("k", bad)
    with pytest.raises(ValueError, match="empty"):
        store.add_message("k", _m("user", " "), idx=0)
    with pytest.raises(ValueError, match="empty"):
        await SuffixMemAsyncChatStore(manager=manager).add_messages("k", bad)
    assert [m.content for m in store.get_messages("k")] == ["hi", "hello", "and you?"]


async def test_a_key_too_long_for_its_archive_is_refused_at_once(manager: Any) -> None:
    """``Memory`` archives under ``<key>#archived``: a key that leaves no room for it is
    refused on first use, not turns later when the first flush archives."""
    from llama_index.storage.chat_store.suffixmem import SuffixMemAsyncChatStore

    store = SuffixMemAsyncChatStore(manager=manager)
    with pytest.raises(ValueError, match="key is too long: 125 characters, the limit is 119"):
        await store.add_messages("y" * 125, [_m("user", "hi")])
    await store.add_messages("y" * 119, [_m("user", "hi")])
    assert await store.count_messages("y" * 119) == 1


def test_a_repeated_message_is_stored_again(manager: Any) -> None:
    store = SuffixMemChatStore(manager=manager)
    for _ in range(2):
        store.add_message("k", _m("user", "hi"))
        store.add_message("k", _m("assistant", "hello"))
    # a reply marked as stored under another key is stored here all the same
    other = ChatMessage(role=MessageRole.ASSISTANT, content="hello",
                        additional_kwargs={"suffixmem_stored": {"session_id": "x", "index": 1}})
    store.add_message("k", other)
    assert [m.content for m in store.get_messages("k")] == ["hi", "hello"] * 2 + ["hello"]


@pytest.mark.slow
def test_chat_engine_memory_in_the_store(
    shared_engine: Any, manager: Any, database_url: str, usage_recorder: Any
) -> None:
    """A chat engine whose ``ChatMemoryBuffer`` lives in our store; a second engine over the
    same store continues the conversation, and the cache still serves the old turns."""
    llm = SuffixMemLLM(**MODEL_PARAMS, max_tokens=24, temperature=0.0, session_id="li-store",
                       database_url=database_url)

    def chat_engine() -> SimpleChatEngine:
        memory = ChatMemoryBuffer.from_defaults(
            llm=llm, chat_store=SuffixMemChatStore(database_url, engine=shared_engine),
            chat_store_key="li-store")
        return SimpleChatEngine.from_defaults(
            llm=llm, memory=memory, system_prompt="You are a friendly baker. Be brief.")

    first = chat_engine()
    first.chat("What is bread made of?")
    first.chat("And butter?")
    second = chat_engine()  # as after a restart of the app, with the engine still warm
    second.chat("Which one is older?")
    rows = manager.history("li-store")  # each turn once: the LLM stored it, the memory saw it
    assert [m.role for m in rows] == ["user", "assistant"] * 3
    usages = usage_recorder.usages
    assert len(usages) == 3
    previous = usages[1]["prompt_tokens"] + usages[1]["completion_tokens"]
    block = shared_engine.block_size
    assert usages[2]["cached_tokens"] >= (previous - 1) // block * block > 0


@pytest.mark.slow
def test_a_memory_window_keeps_the_whole_conversation_in_the_store(
    shared_engine: Any, manager: Any, database_url: str, usage_recorder: Any
) -> None:
    """``ChatMemoryBuffer`` with a small ``token_limit`` sends the LLM only its last
    exchanges; the store still holds the whole conversation, as ``SimpleChatStore`` would (the
    window read as a rewritten history and replaced the session with it)."""
    llm = SuffixMemLLM(**MODEL_PARAMS, max_tokens=16, temperature=0.0, session_id="li-window",
                       database_url=database_url)
    store = SuffixMemChatStore(manager=manager)
    memory = ChatMemoryBuffer.from_defaults(llm=llm, chat_store=store,
                                            chat_store_key="li-window", token_limit=60)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    questions = ["What is bread made of?", "How long does dough rise?",
                 "Why does bread go stale?", "What is sourdough?"]
    for q in questions:
        engine.chat(q)
    assert len(memory.get()) < 2 * len(questions)  # the window the LLM was sent
    kept = store.get_messages("li-window")
    assert [m.role for m in kept] == [MessageRole.USER, MessageRole.ASSISTANT] * 4
    assert [m.content for m in kept[::2]] == questions
    assert "windowed" in [u["history"] for u in usage_recorder.usages]


def test_a_system_message_set_in_the_store_stays_and_the_turn_continues(
    shared_engine: Any, manager: Any, database_url: str
) -> None:
    """``set_messages([system, user, assistant])``, then the LLM answers the same history plus
    a question: the turn continues the session (it was read as a rewrite, which recomputed the
    prompt and moved the system message out of ``get_messages``)."""
    store = SuffixMemChatStore(manager=manager)
    history = [_m("system", "You are terse."), _m("user", "Hi"), _m("assistant", "Hello!")]
    store.set_messages("li-system", history)
    llm = SuffixMemLLM(**MODEL_PARAMS, max_tokens=8, temperature=0.0, session_id="li-system",
                       database_url=database_url)
    first = llm.chat([*history, _m("user", "Name a colour.")])
    assert first.raw["usage"]["history"] == "appended"
    assert _view(store.get_messages("li-system"))[:4] == [
        *_view(history), (MessageRole.USER, "Name a colour.")]
    second = llm.chat([*store.get_messages("li-system"), _m("user", "Another one?")])
    assert second.raw["usage"]["history"] == "appended"
    assert second.raw["usage"]["cached_tokens"] >= shared_engine.block_size


def test_sync_store_imports_on_a_core_without_async_db_chat_stores() -> None:
    """``SuffixMemAsyncChatStore`` is imported on first use: where its module cannot import (a
    llama-index-core older than 0.14.24 has no ``AsyncDBChatStore``; simulated by refusing the
    module) the sync store still imports and the async one says why in one line."""
    import subprocess
    import sys

    code = """
import importlib.abc, sys
class OldCore(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "llama_index.storage.chat_store.suffixmem.async_db":
            raise ImportError("cannot import name 'AsyncDBChatStore'")
sys.meta_path.insert(0, OldCore())
from llama_index.storage.chat_store.suffixmem import SuffixMemChatStore
print("sync", SuffixMemChatStore.class_name())
try:
    from llama_index.storage.chat_store.suffixmem import SuffixMemAsyncChatStore
except ImportError as e:
    print("async", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.splitlines()
    assert out[0] == "sync SuffixMemChatStore"
    assert out[1].startswith("async SuffixMemAsyncChatStore needs llama-index-core >= 0.14.24")
    assert len(out) == 2
