"""``SuffixMemChatMessageHistory`` over the SQL conversation store, alone and in a chain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from adapter_setup import MODEL_PARAMS

from langchain_suffixmem import SuffixMemChatMessageHistory, SuffixMemChatModel
from suffixmem import client
from suffixmem.conversation.store import Store
from suffixmem.errors import UnknownSessionError

pytestmark = pytest.mark.anyio


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'history.db'}"


def test_messages_round_trip_through_the_store(database_url: str) -> None:
    history = SuffixMemChatMessageHistory("alice", database_url=database_url)
    assert history.messages == []
    history.add_messages([SystemMessage("Be brief."), HumanMessage("Hi")])
    history.add_ai_message("Hello!")
    again = SuffixMemChatMessageHistory("alice", database_url=database_url)
    assert [(type(m), m.content) for m in again.messages] == [
        (SystemMessage, "Be brief."), (HumanMessage, "Hi"), (AIMessage, "Hello!")]
    # the same store is shared, and the session is a suffixmem session like any other
    assert again.store is history.store is client.get_store(database_url)
    assert [s.id for s in history.store.list_sessions()] == ["alice"]
    stored = history.store.messages("alice")
    assert [m.role for m in stored] == ["system", "user", "assistant"]
    assert all(m.token_count > 0 for m in stored)
    history.clear()
    assert again.messages == [] and history.store.get_session("alice") is not None


async def test_async_methods(database_url: str) -> None:
    history = SuffixMemChatMessageHistory("bob", database_url=database_url)
    await history.aadd_messages([HumanMessage("Hi"), AIMessage("Hey")])
    assert [m.content for m in await history.aget_messages()] == ["Hi", "Hey"]
    await history.aclear()
    assert await history.aget_messages() == []


def test_unknown_session_and_bad_messages_raise(database_url: str) -> None:
    with pytest.raises(UnknownSessionError, match="nobody") as err:
        SuffixMemChatMessageHistory("nobody", database_url=database_url, create=False)
    assert isinstance(err.value, KeyError)
    with pytest.raises(ValueError, match="non-empty"):
        SuffixMemChatMessageHistory("", database_url=database_url)
    history = SuffixMemChatMessageHistory("carol", database_url=database_url)
    image = {"type": "image", "url": "https://example.org/cat.png"}
    with pytest.raises(ValueError, match="'image' content block"):
        history.add_messages([HumanMessage([image])])
    assert history.messages == []  # nothing half-written


def test_history_is_shared_with_an_existing_store(database_url: str) -> None:
    store = Store(database_url)
    store.open_session("dave")
    history = SuffixMemChatMessageHistory("dave", store=store, create=False)
    history.add_user_message("Hi")
    assert [m.content for m in store.messages("dave")] == ["Hi"]


@pytest.mark.slow
@pytest.mark.vllm
def test_runnable_with_message_history_reads_the_cache(
    shared_engine: Any, database_url: str
) -> None:
    """A chain with our history: each turn is stored, and the next turn's prompt (rebuilt from
    the store as text) still reads the earlier turns from the KV cache."""
    prompt = ChatPromptTemplate.from_messages([
        ("system", "You are a helpful assistant. Answer in one sentence."),
        MessagesPlaceholder("history"),
        ("human", "{question}"),
    ])
    chat = SuffixMemChatModel(**MODEL_PARAMS, max_tokens=24)
    chain = RunnableWithMessageHistory(
        prompt | chat,
        lambda session_id: SuffixMemChatMessageHistory(session_id, database_url=database_url),
        input_messages_key="question",
        history_messages_key="history",
    )
    config = {"configurable": {"session_id": "erin"}}
    block = shared_engine.block_size
    cached, previous_total = [], 0
    for question in ("What is the capital of France?", "And of Italy?", "Which is bigger?"):
        reply = chain.invoke({"question": question}, config=config)
        assert reply.response_metadata["session_id"] == "erin"
        usage = reply.usage_metadata
        read = usage["input_token_details"]["cache_read"]
        # every full block of the previous turn's prompt and reply is read from cache
        assert read >= (previous_total - 1) // block * block, (read, previous_total)
        cached.append(read)
        previous_total = usage["input_tokens"] + usage["output_tokens"]
    assert cached[0] == 0 < cached[1] <= cached[2], cached
    stored = client.get_store(database_url).messages("erin")
    assert [m.role for m in stored] == ["user", "assistant"] * 3
    # and a plain string pipeline works with it too
    text_chain = RunnableWithMessageHistory(
        prompt | chat | StrOutputParser(),
        lambda session_id: SuffixMemChatMessageHistory(session_id, database_url=database_url),
        input_messages_key="question", history_messages_key="history",
    )
    assert text_chain.invoke({"question": "Thanks!"}, config=config)
