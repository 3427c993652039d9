"""An application's own sliding window (LangChain's ``trim_messages``) through
``SuffixMemChatModel`` on the torch engine: the turn after the window dropped the oldest
exchange reuses the kept turns' KV at their new positions (context shift, the default) instead
of recomputing them, and the stored session keeps the whole conversation."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import SYSTEM, TORCH_PARAMS
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, trim_messages
from langchain_suffixmem import SuffixMemChatModel

from suffixmem.engine.protocol import Message

pytestmark = [pytest.mark.slow]

# one subject throughout: a topic jump would release the session's cached state
BREAD = (
    "What flour do you use for your sourdough bread?",
    "How long does the sourdough bread dough rise?",
    "At what temperature do you bake the sourdough bread?",
    "How do you keep the crust of the sourdough bread crisp?",
)


def test_trim_messages_window_keeps_the_kept_turns_warm(torch_engine: Any,
                                                        database_url: str) -> None:
    chat = SuffixMemChatModel(**TORCH_PARAMS, database_url=database_url, max_tokens=24,
                              temperature=0.0)
    config = {"configurable": {"session_id": "lc-window"}}
    history: list[BaseMessage] = [SystemMessage(SYSTEM)]
    for q in BREAD[:3]:
        history.append(HumanMessage(q))
        history.append(chat.invoke(history, config=config))
    # the application's window: the system prompt and the last two exchanges
    kept = trim_messages(history, strategy="last", token_counter=len, max_tokens=5,
                         include_system=True, start_on="human")
    assert [m.content for m in kept[1::2]] == list(BREAD[1:3])
    shifts = torch_engine.reuse.shift.shifts
    reply = chat.invoke([*kept, HumanMessage(BREAD[3])], config=config)
    assert reply.response_metadata["history"] == "windowed" and reply.content
    # the session keeps the whole conversation; the model read the window
    assert len(chat.get_manager().history("lc-window")) == 8
    assert torch_engine.reuse.shift.shifts == shifts + 1
    # a prefix cache alone would hit the system prompt only: the kept turns moved left
    system = len(torch_engine.render([Message("system", SYSTEM)], False))
    assert reply.usage_metadata["input_token_details"]["cache_read"] > system + 32


def test_a_window_that_starts_with_a_reply_keeps_the_stored_history(
        torch_engine: Any, database_url: str) -> None:
    """``trim_messages`` keeps the last messages whatever their role by default, so a window
    may begin with a reply: it is still a window (the stored history stays whole, the model
    reads the window), not a rewrite that replaced the session with it."""
    chat = SuffixMemChatModel(**TORCH_PARAMS, database_url=database_url, max_tokens=8,
                              temperature=0.0)
    config = {"configurable": {"session_id": "lc-window-reply"}}
    history: list[BaseMessage] = []
    for q in BREAD[:3]:
        history.append(HumanMessage(q))
        history.append(chat.invoke(history, config=config))
    kept = trim_messages(history, strategy="last", token_counter=len, max_tokens=3)
    assert kept[0].type == "ai"  # the window starts with the first reply it kept
    reply = chat.invoke([*kept, HumanMessage(BREAD[3])], config=config)
    assert reply.response_metadata["history"] == "windowed"
    stored = chat.get_manager().history("lc-window-reply")
    assert [m.content for m in stored if m.role == "user"] == list(BREAD)
