"""A LangChain chain (prompt | model | parser) with chat history kept in suffixmem's store.

    .venv/bin/python examples/langchain_chain.py [--session alice] [--max-tokens 64]

Every turn re-sends the whole history, as LangChain does. The chat model hands it to suffixmem's
ConversationManager, which matches it with the stored session, renders the earlier replies from
the token ids it generated (kept in SQL), and stores the new turn once (the history sees that it
is already there). So each turn reads the previous turns from the KV cache. The answer streams
token by token; the cached prompt tokens of each turn are printed after it.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import LLMResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_suffixmem import SuffixMemChatMessageHistory, SuffixMemChatModel

QUESTIONS = (
    "What is sourdough bread?",
    "How long does its dough rise?",
    "And what makes it sour?",
)


class CacheReport(BaseCallbackHandler):
    """Prints the usage of each model call (the parser hides the message it came in)."""

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        usage = response.generations[0][0].message.usage_metadata  # type: ignore[attr-defined]
        print(
            f"\n  [{usage['input_tokens']} prompt tokens, "
            f"{usage['input_token_details']['cache_read']} from cache]",
            file=sys.stderr,
        )


def main() -> None:
    # vLLM logs to stdout by default; keep its lines out of the conversation
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", default="langchain-example")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--database-url", default=None, help="default: suffixmem's own")
    parser.add_argument("questions", nargs="*", default=list(QUESTIONS))
    args = parser.parse_args()

    prompt = ChatPromptTemplate.from_messages([
        ("system", "You are a helpful baker. Answer in two sentences at most."),
        MessagesPlaceholder("history"),
        ("human", "{question}"),
    ])
    model = SuffixMemChatModel(max_tokens=args.max_tokens, database_url=args.database_url)
    print("starting the engine...", file=sys.stderr, flush=True)
    manager = model.get_manager()  # else the first question waits for the engine
    # LangChain 1.x points to LangGraph persistence instead; this is the core-only way.
    warnings.filterwarnings("ignore", message="RunnableWithMessageHistory is deprecated")
    chain = RunnableWithMessageHistory(
        prompt | model | StrOutputParser(),
        lambda session_id: SuffixMemChatMessageHistory(session_id, manager=manager),
        input_messages_key="question",
        history_messages_key="history",
    )
    config: Any = {"configurable": {"session_id": args.session}, "callbacks": [CacheReport()]}
    for question in args.questions:
        print(f"you> {question}\nbot> ", end="", flush=True)
        for piece in chain.stream({"question": question}, config=config):
            print(piece, end="", flush=True)
        print()


if __name__ == "__main__":
    main()
