"""A LlamaIndex chat engine on ``Memory``, the memory kept in suffixmem's store.

    .venv/bin/python examples/llama_index_memory.py [--session carol] [--max-tokens 64]

``Memory.from_defaults(chat_store=SuffixMemAsyncChatStore(...))`` (llama-index-core >= 0.14.24)
keeps the active chat history as the suffixmem session the LLM (``SuffixMemLLM`` with the same
``session_id``) reads and appends to, so each turn is stored once and reads the earlier turns
from the KV cache; messages ``Memory`` flushes past its token limit are archived beside it.
Prints each answer and its prompt tokens, of which cached.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.memory import Memory
from llama_index.llms.suffixmem import SuffixMemLLM
from llama_index.storage.chat_store.suffixmem import SuffixMemAsyncChatStore

QUESTIONS = (
    "What is a baguette?",
    "How long is it usually?",
    "What flour is it made from?",
)


def build_chat_engine(llm: SuffixMemLLM, session: str, token_limit: int = 3000) -> Any:
    """A ``SimpleChatEngine`` whose ``Memory`` lives in the LLM's suffixmem session."""
    store = SuffixMemAsyncChatStore(manager=llm.get_manager())
    memory = Memory.from_defaults(session_id=session, chat_store=store, token_limit=token_limit)
    return SimpleChatEngine.from_defaults(
        llm=llm, memory=memory, system_prompt="You are a friendly baker. Answer in one sentence.")


def main() -> None:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", default="llama-index-memory-example")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--database-url", default=None, help="default: suffixmem's own")
    parser.add_argument("questions", nargs="*", default=list(QUESTIONS))
    args = parser.parse_args()

    llm = SuffixMemLLM(session_id=args.session, max_tokens=args.max_tokens,
                       database_url=args.database_url)
    engine = build_chat_engine(llm, args.session)
    for question in args.questions:
        response = engine.chat(question)
        print(f"you> {question}\nbot> {response.response}")
    for turn in llm.get_manager().store.turn_events(args.session):
        print(f"  [{turn.prompt_tokens} prompt tokens, {turn.cached_tokens} from cache]")


if __name__ == "__main__":
    main()
