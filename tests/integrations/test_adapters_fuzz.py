"""Hypothesis over the adapters (issue 18): random Unicode, roles and sampling values through
the LangChain chat model and history and the LlamaIndex LLM and chat store. Every input either
succeeds or raises one suffixmem error with a one-line message; nothing else escapes."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import MODEL_PARAMS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage
from langchain_suffixmem import SuffixMemChatMessageHistory, SuffixMemChatModel
from llama_index.core.base.llms.types import ChatMessage as LIChatMessage
from llama_index.core.base.llms.types import MessageRole
from llama_index.llms.suffixmem import SuffixMemLLM
from llama_index.storage.chat_store.suffixmem import SuffixMemChatStore

from suffixmem.errors import SuffixmemError

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# Surrogates included on purpose (lone ones are not valid text); NUL too.
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
ODD = st.one_of(st.none(), st.booleans(), st.text(max_size=4), st.integers(-2, 2**65),
                st.floats(allow_nan=True, allow_infinity=True))
SAMPLING = st.fixed_dictionaries({}, optional={
    "temperature": st.one_of(st.floats(0, 2), ODD),
    "top_p": st.one_of(st.floats(0, 1), ODD),
    "top_k": st.one_of(st.integers(-1, 50), ODD),
    "seed": st.one_of(st.integers(0, 2**63 - 1), ODD),
    "max_tokens": st.one_of(st.integers(1, 2), ODD),
})
LC_ROLES = st.sampled_from(["system", "user", "assistant", "tool", "developer", "wizard"])
SESSIONS = st.one_of(st.none(), st.text(max_size=8), st.just("fuzz"))
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _lc(role: str, text: str) -> Any:
    return {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}.get(
        role, lambda c: ChatMessage(role=role, content=c))(text)


def _fails_cleanly(call: Any) -> None:
    try:
        call()
    except SuffixmemError as e:
        assert "\n" not in str(e).strip(), str(e)


@SETTINGS
@given(turns=st.lists(st.tuples(LC_ROLES, TEXT), min_size=1, max_size=3), sampling=SAMPLING,
       session=SESSIONS)
def test_langchain_chat_model_and_history(
    shared_engine: Any, database_url: str, turns: list[tuple[str, str]],
    sampling: dict[str, Any], session: str | None,
) -> None:
    messages = [_lc(role, text) for role, text in turns]
    config = {"configurable": {"session_id": session}}

    def chat() -> None:
        model = SuffixMemChatModel(**MODEL_PARAMS, database_url=database_url)
        model.invoke(messages, config=config, **sampling)

    _fails_cleanly(chat)
    _fails_cleanly(lambda: SuffixMemChatMessageHistory(
        session or "h", engine=shared_engine, database_url=database_url).add_messages(messages))


@SETTINGS
@given(turns=st.lists(st.tuples(st.sampled_from(list(MessageRole)), TEXT), min_size=1,
                      max_size=3), sampling=SAMPLING, session=SESSIONS)
def test_llama_index_llm_and_chat_store(
    shared_engine: Any, database_url: str, turns: list[tuple[MessageRole, str]],
    sampling: dict[str, Any], session: str | None,
) -> None:
    messages = [LIChatMessage(role=role, content=text) for role, text in turns]

    def chat() -> None:
        llm = SuffixMemLLM(**MODEL_PARAMS, database_url=database_url, session_id=session or None)
        llm.chat(messages, **sampling)

    _fails_cleanly(chat)
    store = SuffixMemChatStore(database_url, engine=shared_engine)
    _fails_cleanly(lambda: store.set_messages(session or "k", messages))


def test_healthy_session_still_works_after_the_fuzz(shared_engine: Any, database_url: str
                                                    ) -> None:
    model = SuffixMemChatModel(**MODEL_PARAMS, database_url=database_url, max_tokens=4)
    assert model.invoke("Hello!", config={"configurable": {"session_id": "after"}}).content
