"""``SuffixMemChatMessageHistory`` through the ConversationManager, alone and in a chain: turns
the chat model stored are not stored twice, repeated messages are kept, empty ones refused."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import MODEL_PARAMS
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_suffixmem import SuffixMemChatMessageHistory, SuffixMemChatModel

from suffixmem import runtime
from suffixmem.errors import InvalidRequestError, UnknownSessionError

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]


def test_messages_round_trip_through_the_manager(manager: Any, database_url: str) -> None:
    history = SuffixMemChatMessageHistory("alice", manager=manager)
    assert history.messages == []
    history.add_messages([SystemMessage("Be brief."), HumanMessage("Hi")])
    history.add_ai_message("Hello!")
    # another instance, built the way a chain's factory would, reaches the same manager
    again = SuffixMemChatMessageHistory(
        "alice", engine=manager.engine, database_url=database_url)
    assert again.manager is manager is runtime.get_manager(manager.engine,
                                                           database_url=database_url)
    assert [(type(m), m.content) for m in again.messages] == [
        (SystemMessage, "Be brief."), (HumanMessage, "Hi"), (AIMessage, "Hello!")]
    assert [s.id for s in manager.list_sessions()] == ["alice"]
    assert [m.role for m in manager.history("alice")] == ["system", "user", "assistant"]
    history.clear()
    assert again.messages == [] and manager.get_session("alice").id == "alice"


def test_repeated_messages_are_kept(manager: Any) -> None:
    history = SuffixMemChatMessageHistory("repeat", manager=manager)
    pair = [HumanMessage("Hi"), AIMessage("Hello!")]
    history.add_messages(pair)
    history.add_messages(pair)  # said twice, stored twice
    # a reply marked as stored elsewhere (another session) is no reason to skip it either
    marked = AIMessage("Hello!", response_metadata={
        "suffixmem_stored": {"session_id": "someone-else", "index": 1}})
    history.add_messages([HumanMessage("Hi"), marked])
    assert [m.content for m in history.messages] == ["Hi", "Hello!"] * 3


async def test_async_methods(manager: Any) -> None:
    history = SuffixMemChatMessageHistory("bob", manager=manager)
    await history.aadd_messages([HumanMessage("Hi"), AIMessage("Hey")])
    assert [m.content for m in await history.aget_messages()] == ["Hi", "Hey"]
    await history.aclear()
    assert await history.aget_messages() == []


def test_unknown_session_and_bad_messages_raise(manager: Any) -> None:
    with pytest.raises(UnknownSessionError, match="nobody") as err:
        SuffixMemChatMessageHistory("nobody", manager=manager, create=False)
    assert isinstance(err.value, KeyError)
    with pytest.raises(InvalidRequestError, match="non-empty"):
        SuffixMemChatMessageHistory("", manager=manager)
    history = SuffixMemChatMessageHistory("carol", manager=manager)
    image = {"type": "image", "url": "https://example.org/cat.png"}
    with pytest.raises(InvalidRequestError, match="'image' content block"):
        history.add_messages([HumanMessage([image])])
    # issue 18 item 4: an empty message is refused with one line naming it, nothing written
    for empty in ("", "  \n"):
        with pytest.raises(InvalidRequestError, match=r"^messages\[1\]\.content is empty") as e:
            history.add_messages([HumanMessage("Hi"), AIMessage(empty)])
        assert "\n" not in str(e.value)
    assert history.messages == []


@pytest.mark.slow
def test_chain_stores_each_turn_once_and_reads_the_cache(
    shared_engine: Any, manager: Any, database_url: str
) -> None:
    """A chain with our history: each turn is stored once (by the manager; ``add_messages``
    skips it), and the next turn's prompt, rebuilt from the history as text, still reads the
    earlier turns from the KV cache."""
    prompt = ChatPromptTemplate.from_messages([
        ("system", "You are a helpful assistant. Answer in one sentence."),
        MessagesPlaceholder("history"),
        ("human", "{question}"),
    ])
    chat = SuffixMemChatModel(**MODEL_PARAMS, max_tokens=24, temperature=0.0,
                              database_url=database_url)

    def factory(session_id: str) -> SuffixMemChatMessageHistory:
        return SuffixMemChatMessageHistory(session_id, manager=manager)

    chain = RunnableWithMessageHistory(
        prompt | chat, factory, input_messages_key="question", history_messages_key="history")
    config = {"configurable": {"session_id": "erin"}}
    block = shared_engine.block_size
    cached, previous_total = [], 0
    for question in ("What is the capital of France?", "What is the capital of France?",
                     "Which is bigger?"):  # a repeated question is a turn of its own
        reply = chain.invoke({"question": question}, config=config)
        assert reply.response_metadata["session_id"] == "erin"
        usage = reply.usage_metadata
        read = usage["input_token_details"]["cache_read"]
        assert read >= (previous_total - 1) // block * block, (read, previous_total)
        cached.append(read)
        previous_total = usage["input_tokens"] + usage["output_tokens"]
    assert cached[0] == 0 < cached[1] <= cached[2], cached
    stored = manager.history("erin")
    assert [m.role for m in stored] == ["user", "assistant"] * 3
    assert all(m.token_ids for m in stored if m.role == "assistant")
    text_chain = RunnableWithMessageHistory(
        prompt | chat | StrOutputParser(), factory,
        input_messages_key="question", history_messages_key="history",
    )
    text = text_chain.invoke({"question": "Thanks!"}, config=config)
    # the parser dropped the reply's marker; the model's note still keeps it from being
    # stored twice
    stored = manager.history("erin")
    assert [m.role for m in stored] == ["user", "assistant"] * 4
    assert stored[-1].content == text and stored[-1].token_ids
