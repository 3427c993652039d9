"""A LlamaIndex ``SimpleChatEngine`` (our LLM, its memory in our chat store) gets, turn by
turn, exactly what the same conversation sent to ``ConversationManager.chat`` gets: prompt
tokens, cached tokens, stored token ids, topic verdicts and temperatures."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import MODEL_PARAMS, QUESTIONS, SYSTEM
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.llms.suffixmem import SuffixMemLLM
from llama_index.storage.chat_store.suffixmem import SuffixMemChatStore

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SAMPLING: dict[str, Any] = {"max_tokens": 16, "seed": 11}


def _figures(manager: Any, session: str, per_turn: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    stored = manager.history(session)
    assert [m.role for m in stored] == ["user", "assistant"] * len(QUESTIONS)  # nothing twice
    replies = [tuple(m.token_ids) for m in stored if m.role == "assistant"]
    return [(*t, ids) for t, ids in zip(per_turn, replies, strict=True)]


def test_simple_chat_engine_matches_the_manager(
    shared_engine: Any, manager: Any, database_url: str, usage_recorder: Any
) -> None:
    manager.open_session("ref-li", system_prompt=SYSTEM)
    turns = [manager.chat("ref-li", q, **SAMPLING) for q in QUESTIONS]
    want = _figures(manager, "ref-li", [
        (t.prompt_tokens, t.cached_tokens, t.topic_jump, t.temperature) for t in turns])

    llm = SuffixMemLLM(**MODEL_PARAMS, database_url=database_url, session_id="li-chat",
                       **SAMPLING)
    memory = ChatMemoryBuffer.from_defaults(
        llm=llm, chat_store=SuffixMemChatStore(database_url, manager=manager),
        chat_store_key="li-chat", token_limit=3000)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=SYSTEM)
    for q in QUESTIONS:
        engine.chat(q)
    got = [(u["prompt_tokens"], u["cached_tokens"], u["topic_jump"], u["temperature"])
           for u in usage_recorder.usages]
    assert _figures(manager, "li-chat", got) == want
    assert want[0][1] < want[1][1] and any(t[2] for t in want[1:])


def test_empty_message_does_not_poison_the_session(
    shared_engine: Any, manager: Any, database_url: str
) -> None:
    """Issue 18 item 4: ``SimpleChatEngine.chat("")`` stores an empty user message in our chat
    store before it calls the LLM; later turns of that session still work."""
    llm = SuffixMemLLM(**MODEL_PARAMS, database_url=database_url, session_id="li-empty",
                       max_tokens=8, temperature=0.0)
    memory = ChatMemoryBuffer.from_defaults(
        llm=llm, chat_store=SuffixMemChatStore(database_url, manager=manager),
        chat_store_key="li-empty")
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=SYSTEM)
    try:
        engine.chat("")
    except ValueError as e:  # a clear one-line suffixmem error is fine for the empty turn
        assert type(e).__module__.startswith("suffixmem") and "\n" not in str(e)
    for q in QUESTIONS[:2]:
        assert engine.chat(q).response
    stored = manager.history("li-empty")
    assert [m.content for m in stored if m.role == "user"][-2:] == list(QUESTIONS[:2])
    assert stored[-1].role == "assistant" and stored[-1].token_ids


def test_an_empty_reply_in_the_history_keeps_the_session_appended(
    shared_engine: Any, manager: Any, database_url: str
) -> None:
    """A reply may be empty and the session stores it; dropping it from what is resent (as
    empty user messages are) read as a rewritten history and recomputed the prompt."""
    from llama_index.core.llms import ChatMessage

    llm = SuffixMemLLM(**MODEL_PARAMS, database_url=database_url, session_id="li-empty-reply",
                       max_tokens=8, temperature=0.0)
    sent = [ChatMessage(role="system", content=SYSTEM),
            ChatMessage(role="user", content="Say nothing."),
            ChatMessage(role="assistant", content=""),
            ChatMessage(role="user", content=QUESTIONS[0])]
    first = llm.chat(sent)
    assert first.raw["usage"]["history"] == "new"
    second = llm.chat([*sent, first.message, ChatMessage(role="user", content=QUESTIONS[1])])
    usage = second.raw["usage"]
    assert usage["history"] == "appended", usage
    assert usage["cached_tokens"] >= first.raw["usage"]["prompt_tokens"] // 32 * 32
    assert [m.content for m in manager.history("li-empty-reply")][:2] == ["Say nothing.", ""]
