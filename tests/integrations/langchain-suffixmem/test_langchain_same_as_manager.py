"""A LangChain conversation gets, turn by turn, exactly what the same conversation sent to
``ConversationManager.chat`` gets: prompt tokens, cached tokens, stored token ids, topic
verdicts and temperatures. Both a ``RunnableWithMessageHistory`` chain (our history) and a plain
``invoke`` with the full history resent each time."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import MODEL_PARAMS, QUESTIONS, SYSTEM
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_suffixmem import SuffixMemChatMessageHistory, SuffixMemChatModel

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# Sampled, not greedy: the semantic temperature is part of what must match, and a fixed seed
# makes the sampled tokens reproducible.
SAMPLING: dict[str, Any] = {"max_tokens": 16, "seed": 11}


def reference(manager: Any, session: str) -> list[tuple[Any, ...]]:
    """The conversation through ``ConversationManager.chat``: per turn (prompt tokens, cached
    tokens, topic jump, temperature) and the stored token ids of each reply."""
    manager.open_session(session, system_prompt=SYSTEM)
    turns = [manager.chat(session, q, **SAMPLING) for q in QUESTIONS]
    return _figures(manager, session, [
        (t.prompt_tokens, t.cached_tokens, t.topic_jump, t.temperature) for t in turns])


def _figures(manager: Any, session: str, per_turn: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    stored = manager.history(session)
    assert [m.role for m in stored] == ["user", "assistant"] * len(QUESTIONS)  # nothing twice
    replies = [m.token_ids for m in stored if m.role == "assistant"]
    assert all(ids for ids in replies)
    return [(*t, tuple(ids)) for t, ids in zip(per_turn, replies, strict=True)]


def _turn(reply: BaseMessage) -> tuple[Any, ...]:
    usage = reply.usage_metadata  # type: ignore[attr-defined]
    meta = reply.response_metadata
    return (usage["input_tokens"], usage["input_token_details"]["cache_read"],
            meta["topic_jump"], meta["temperature"])


def test_runnable_with_message_history_matches_the_manager(
    shared_engine: Any, manager: Any, database_url: str
) -> None:
    want = reference(manager, "ref-rwmh")
    prompt = ChatPromptTemplate.from_messages([
        ("system", SYSTEM), MessagesPlaceholder("history"), ("human", "{question}")])
    chat = SuffixMemChatModel(**MODEL_PARAMS, database_url=database_url, **SAMPLING)
    chain = RunnableWithMessageHistory(
        prompt | chat,
        lambda sid: SuffixMemChatMessageHistory(sid, manager=manager),
        input_messages_key="question", history_messages_key="history",
    )
    config = {"configurable": {"session_id": "lc-rwmh"}}
    got = [_turn(chain.invoke({"question": q}, config=config)) for q in QUESTIONS]
    # the history saw each turn once: the manager stored it, add_messages skipped it
    assert _figures(manager, "lc-rwmh", got) == want
    assert want[0][1] < want[1][1] and any(t[2] for t in want[1:])  # cache hits and a jump


def test_plain_invoke_with_full_history_matches_the_manager(
    shared_engine: Any, manager: Any, database_url: str
) -> None:
    want = reference(manager, "ref-plain")
    chat = SuffixMemChatModel(**MODEL_PARAMS, database_url=database_url, **SAMPLING)
    messages: list[BaseMessage] = [SystemMessage(SYSTEM)]
    got = []
    for q in QUESTIONS:
        messages.append(HumanMessage(q))
        reply = chat.invoke(messages, config={"configurable": {"thread_id": "lc-plain"}})
        got.append(_turn(reply))
        messages.append(AIMessage(reply.content))  # as a user keeping the list would: text
    assert _figures(manager, "lc-plain", got) == want
