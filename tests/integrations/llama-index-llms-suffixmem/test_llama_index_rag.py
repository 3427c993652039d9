"""LlamaIndex's ``CondensePlusContextChatEngine`` over ``SuffixMemLLM`` on the torch engine: the
passages it writes into the system prompt change every turn, and ``manager_config`` turns on
RAG reuse (issue 14's capability), so a turn whose passages moved reuses them, and the history
after them, where an exact turn recomputes everything after the first change."""

from __future__ import annotations

from typing import Any

import pytest
from adapter_setup import TORCH_PARAMS
from llama_index.core.chat_engine import CondensePlusContextChatEngine
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.llms.suffixmem import SuffixMemLLM

from suffixmem import runtime
from suffixmem.conversation.manager import ManagerConfig

pytestmark = [pytest.mark.slow]

PASSAGES = {
    "tower": "The Eiffel Tower in Paris was finished in 1889 for the World's Fair. It is 330 "
             "metres tall, and the access code of its staff lift is EIF-4471, changed yearly.",
    "fuji": "Mount Fuji is the highest mountain in Japan, 3,776 metres above the sea. The "
            "climbing season runs from July to early September; hut booking code FUJ-2290.",
    "reef": "The Great Barrier Reef lies off the coast of Queensland in Australia. It is the "
            "largest coral reef system on Earth; the diving permit code is GBR-3307 this year.",
}
# what the application's retriever returns each turn: the first passage moves down in turn 2
RETRIEVED = (("tower", "fuji"), ("reef", "tower", "fuji"), ("reef", "tower", "fuji"))
QUESTIONS = ("What is the staff lift code of the Eiffel Tower?", "And how tall is it?",
             "Thanks. Which year was it finished?")


class Scripted(BaseRetriever):
    """The passages of ``retrieved`` (``RETRIEVED``), turn by turn."""

    def __init__(self, retrieved: tuple[tuple[str, ...], ...] = RETRIEVED) -> None:
        super().__init__()
        self.turn = 0
        self.retrieved = retrieved

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        names = self.retrieved[min(self.turn, len(self.retrieved) - 1)]
        self.turn += 1
        return [NodeWithScore(node=TextNode(text=PASSAGES[n]), score=1.0) for n in names]


def _conversation(rag_reuse: bool, session: str, database_url: str,
                  usage_recorder: Any) -> list[dict[str, Any]]:
    llm = SuffixMemLLM(**TORCH_PARAMS, manager_config=ManagerConfig(rag_reuse=rag_reuse),
                       session_id=session, database_url=database_url, max_tokens=8,
                       temperature=0.0)
    assert llm.get_manager().config.rag_reuse is rag_reuse
    assert llm.get_manager() is runtime.get_manager(
        llm.get_manager().engine, database_url=database_url,
        config=ManagerConfig(rag_reuse=rag_reuse)), "equal configs share one manager"
    chat = CondensePlusContextChatEngine.from_defaults(
        retriever=Scripted(), llm=llm, skip_condense=True,
        memory=ChatMemoryBuffer.from_defaults(token_limit=1500))
    start = len(usage_recorder.usages)
    for question in QUESTIONS:
        assert str(chat.chat(question)).strip()
    return usage_recorder.usages[start:]


def test_condense_plus_context_reuses_moved_passages_with_rag_reuse(
        torch_engine: Any, database_url: str, usage_recorder: Any) -> None:
    exact = _conversation(False, "rag-exact", database_url, usage_recorder)
    reused = _conversation(True, "rag-reuse", database_url, usage_recorder)
    assert [u["prompt_tokens"] for u in exact] == [u["prompt_tokens"] for u in reused]
    # turn 2: a passage was put above the others, so an exact turn reuses only what precedes
    # it; with RAG reuse the moved passages and the history are found at their new positions
    assert reused[1]["cached_tokens"] >= exact[1]["cached_tokens"] + 64, (exact, reused)
    # turn 3: the same passages again: a plain prefix hit for both
    assert exact[2]["cached_tokens"] >= exact[1]["prompt_tokens"] - 32, exact


@pytest.mark.parametrize(("kind", "token_limit"), [
    ("context", 1500), ("condense_plus_context", 1500), ("condense_plus_context", 40)])
def test_rag_chat_engines_over_our_chat_store_store_each_turn_once(
        torch_engine: Any, database_url: str, kind: str, token_limit: int) -> None:
    """``ContextChatEngine`` and ``CondensePlusContextChatEngine`` (condensing on, its
    default) put a fresh copy of the question and the reply into memory after the LLM stored
    the turn: each exchange is stored once, and the model reads the history once. A memory
    window that drops the oldest exchanges (a small ``token_limit``) under this turn's
    passages keeps the whole conversation in the store (it was replaced by the window)."""
    from llama_index.core.chat_engine import ContextChatEngine
    from llama_index.storage.chat_store.suffixmem import SuffixMemChatStore

    session = f"rag-store-{kind}-{token_limit}"
    llm = SuffixMemLLM(**TORCH_PARAMS, session_id=session, database_url=database_url,
                       max_tokens=8, temperature=0.0)
    memory = ChatMemoryBuffer.from_defaults(
        token_limit=token_limit, chat_store_key=session,
        chat_store=SuffixMemChatStore(database_url, manager=llm.get_manager()))
    engine_class = ContextChatEngine if kind == "context" else CondensePlusContextChatEngine
    questions, retrieved = QUESTIONS, RETRIEVED
    if token_limit < 1500:  # turns 4-5 get a window, each under passages of its own
        questions = (*QUESTIONS, "Where is the reef?", "How high is Fuji?")
        retrieved = (*RETRIEVED, ("reef",), ("fuji", "reef"))
    chat = engine_class.from_defaults(retriever=Scripted(retrieved), llm=llm, memory=memory)
    for question in questions:
        assert str(chat.chat(question)).strip()
    stored = llm.get_manager().history(session)
    assert [m.role for m in stored] == ["user", "assistant"] * len(questions), stored
    assert [m.content for m in stored if m.role == "user"] == list(questions)
    assert len(memory.get_all()) == 2 * len(questions)
    if token_limit < 1500:  # the window the last turns were sent did drop exchanges
        assert 0 < len(memory.get()) < 2 * len(questions)
